"""``python -m bench tokenizers``: prompt encoding with fastokens (``--tokenizer fastokens``) against the
tokenizers library (``default``) on the same converted tokenizer, in this process.

For each model (the demo Qwen ``tokenizer.json``, 151k vocabulary; the tiny Kimi-style ``tiktoken.model``), it
encodes a set of chat-sized prompts one call each, as the preprocessor does per request, and as one batch,
checks that both backends give the same ids, and reports megabytes of text per second and the speed-up.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

from services.common.tokenizer_files import TokenizerOptions, load_encoder, load_tokenizer
from services.common.tokenizer_kinds.fast_encoder import Encoder

WORDS = ("the of and to in is you that it he was for on are as with his they at be this from have or by one had not "
         "but what all were when we there can an your which their said if do will each about how up def return "
         "import class self None 42 3.14159 2026 東京 日本語 🤖 café naïve")
LEGEND = ("MB/s: megabytes of UTF-8 prompt text encoded per second (best of the repeats); single: one encode "
          "call per prompt; batch: one encode_batch call; x: fastokens over tokenizers.")


def prompts(n: int, words: int, seed: int = 37) -> list[str]:
    """Chat-like prompts: English words, made-up words, code, numbers and some CJK and emoji."""
    rng = random.Random(seed)
    vocab = WORDS.split()
    syllables = [c + v for c in "bcdfgklmnprstvz" for v in ("a", "e", "i", "o", "u", "ou", "ai")]

    def word() -> str:  # half made-up words, so per-word caches do not answer everything
        if rng.random() < 0.5:
            return rng.choice(vocab)
        return "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))

    return [" ".join(word() for _ in range(words)) for _ in range(n)]


def _best(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _single(enc: Encoder, texts: list[str]) -> Callable[[], object]:
    return lambda: [enc.encode(t, add_special_tokens=False) for t in texts]


def _batch(enc: Encoder, texts: list[str]) -> Callable[[], object]:
    return lambda: enc.encode_batch(texts, add_special_tokens=False)


def measure(model_dir: Path, texts: list[str], repeats: int) -> list[str]:
    """Markdown rows for one model."""
    tok = load_tokenizer(model_dir)
    fast = load_encoder(model_dir, TokenizerOptions(backend="fastokens", fallback=False))
    for t in texts[:50]:
        if list(fast.encode(t, add_special_tokens=False).ids) != tok.encode(t, add_special_tokens=False).ids:
            raise SystemExit(f"fastokens and tokenizers disagree on {t[:40]!r} ({model_dir})")
    mb = sum(len(t.encode()) for t in texts) / 1e6
    rows = []
    for mode in ("single", "batch"):
        secs = {}
        for name, enc in (("tokenizers", tok), ("fastokens", fast)):
            secs[name] = _best(_single(enc, texts) if mode == "single" else _batch(enc, texts), repeats)
        rows.append(f"| {model_dir.name} | {mode} | {mb / secs['tokenizers']:.1f} | {mb / secs['fastokens']:.1f} | "
                    f"{secs['tokenizers'] / secs['fastokens']:.2f} |")
    return rows


def run(models: list[Path], count: int, words: int, repeats: int, emit: Callable[[str], None]) -> str:
    texts = prompts(count, words)
    table = ["| model | mode | tokenizers MB/s | fastokens MB/s | x |", "|---|---|---|---|---|"]
    for d in models:
        table += measure(d, texts, repeats)
        emit(table[-1])
    return "\n".join(table)
