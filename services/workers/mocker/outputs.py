"""What the mocker says: deterministic pseudo-random text tokens, or scripted answers.

Default mode (like Dynamo's mocker): exactly ``max_tokens`` pseudo-random tokens, finish LENGTH.
Each token is a function of the request's seed (0 when unset) and *every token before it*, prompt
and output alike (a rolling hash over the context), so the same request always gets the same tokens,
another seed gets others, and a migrated request (prompt + the tokens generated so far, sent to
another worker) continues exactly as the undisturbed one would have (docs/architecture.md,
Migration). Ids come from ordinary text tokens of the vocabulary
(ids 1000..29999 whose single-token decode is printable ASCII without markup characters), so the
text is readable and never opens a tool call or a reasoning block by accident.

Script mode (``--script FILE`` or ``--output-text``): a JSON list of ``{"match": s, "text": t}``
rules and at most one ``{"default": t}``. The rule whose ``match`` occurs latest in the decoded
prompt wins (ties go to the earlier rule); its text is emitted token by token, then the first EOS
id with finish EOS. ``min_tokens`` pads with pseudo-random tokens before the EOS; ``ignore_eos``
continues with pseudo-random tokens up to ``max_tokens``; ``max_tokens`` truncates (finish LENGTH).
A prompt no rule matches, without a default, gets default-mode output. A thinking budget
(``max_thinking_tokens``) cuts a scripted ``<think>`` block to that many tokens and closes it.

Script mode continues a migrated request too. A continuation is the original prompt with the tokens
generated so far appended, so the mocker looks for its answer at the prompt's end: a prompt that ends
with the first k tokens of the answer its own beginning selects gets the rest of that answer; one that
ends with the whole answer and then the pseudo-random tokens that follow it (``min_tokens`` padding,
``ignore_eos``) gets the rest of those. The tokens after a scripted answer are chained on the answer
(not on the pseudo-random tokens it replaced), which is what makes them checkable and resumable. A
fresh prompt that happens to end with the beginning of its own answer is continued the same way, as a
language model would continue it.
"""

from __future__ import annotations

import dataclasses
import json
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import xxhash

from services.workers.engine import FinishReason, TokenLogprob
from services.workers.mocker.guided import guided_text

TEXT_TOKEN_RANGE = (1000, 30000)
_MARKUP = frozenset("<>[]{}`\\|")
_U64 = (1 << 64) - 1


def text_vocab(tokenizer: Any | None, lo: int = TEXT_TOKEN_RANGE[0], hi: int = TEXT_TOKEN_RANGE[1]) -> list[int]:
    """Token ids in [lo, hi) that decode, alone, to printable ASCII without markup characters.

    ``tokenizer`` is a ``tokenizers.Tokenizer``; without one every id in the range is used.
    """
    if tokenizer is None:
        return list(range(lo, hi))
    hi = min(hi, tokenizer.get_vocab_size())
    ids = list(range(lo, hi))
    texts = tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)
    vocab = [i for i, t in zip(ids, texts, strict=True)
             if t.strip() and t.isascii() and t.isprintable() and not _MARKUP.intersection(t)]
    if not vocab:
        raise ValueError(f"no printable text tokens in ids {lo}..{hi - 1}")
    return vocab


@dataclasses.dataclass(frozen=True)
class ScriptRule:
    match: str
    token_ids: tuple[int, ...]


def parse_script(raw: Any) -> tuple[list[tuple[str, str]], str | None]:
    """Validates a script's JSON value; returns ([(match, text)], default text)."""
    if not isinstance(raw, list):
        raise ValueError(  # noqa: TRY004 - a bad config value, reported with the other ValueErrors
            "a mocker script is a JSON list of {match, text} and {default} objects")
    rules: list[tuple[str, str]] = []
    default: str | None = None
    for i, entry in enumerate(raw):
        if isinstance(entry, dict) and set(entry) == {"default"} and isinstance(entry["default"], str):
            if default is not None:
                raise ValueError(f"script entry {i}: a second default")
            default = entry["default"]
        elif (isinstance(entry, dict) and set(entry) == {"match", "text"}
              and isinstance(entry["match"], str) and isinstance(entry["text"], str)):
            if not entry["match"]:
                raise ValueError(f"script entry {i}: empty match string (use a default entry)")
            rules.append((entry["match"], entry["text"]))
        else:
            raise ValueError(f"script entry {i}: expected {{match, text}} or {{default}}, got {entry!r}")
    return rules, default


_CHAIN_MULT = 0x100000001B3  # FNV-64 prime: the rolling context hash's multiplier


def chain_state(tokens: Sequence[int], seed: int) -> int:
    """The rolling hash of ``tokens`` started from ``seed``: one multiply-add per token.

    ``chain_state(a + b, s) == chain_state(b, chain_state(a, s))``, which is what makes a
    continuation's first token equal the undisturbed run's next token.
    """
    h = seed & _U64
    for t in tokens:
        h = (h * _CHAIN_MULT + t + 1) & _U64
    return h


def _mix(h: int) -> int:
    """splitmix64's finaliser: spreads the rolling hash's low-quality bits over all 64."""
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _U64
    return h ^ (h >> 31)


class PseudoRandomTokens:
    """A lazily extended, reproducible stream of text token ids, each chained on all before it.

    Args:
        vocab: the ids to draw from.
        seed: the context state (``chain_state(prompt, request seed)``).
    """

    __slots__ = ("_buf", "_state", "_vocab")

    def __init__(self, vocab: Sequence[int], seed: int):
        self._state = seed & _U64
        self._vocab = vocab
        self._buf: list[int] = []

    def at(self, index: int) -> int:
        vocab, n = self._vocab, len(self._vocab)
        while index >= len(self._buf):
            token = vocab[(_mix(self._state) >> 11) % n]
            self._buf.append(token)
            self._state = (self._state * _CHAIN_MULT + token + 1) & _U64
        return self._buf[index]


class TokenPlan:
    """The token at every output position of one request (deterministic, so replayable).

    ``script`` is what is left of a scripted answer; ``random_tokens`` follow it (their state already
    chained over it). ``script=None`` is default mode: pseudo-random tokens only, finish LENGTH.
    """

    __slots__ = ("_eos_at", "_eos_id", "_max_tokens", "_random", "_script")

    def __init__(self, script: Sequence[int] | None, random_tokens: PseudoRandomTokens, *, max_tokens: int,
                 min_tokens: int = 0, eos_id: int | None = None, ignore_eos: bool = False):
        self._script = script or ()
        self._random = random_tokens
        self._max_tokens = max_tokens
        self._eos_id = eos_id
        scripted_eos = script is not None and eos_id is not None and not ignore_eos
        self._eos_at = max(len(self._script), min_tokens) if scripted_eos else None

    def token_at(self, index: int) -> tuple[int, FinishReason]:
        if index == self._eos_at:
            return self._eos_id, FinishReason.EOS  # type: ignore[return-value]
        n = len(self._script)
        token = self._script[index] if index < n else self._random.at(index - n)
        return token, FinishReason.LENGTH if index >= self._max_tokens - 1 else FinishReason.NONE


def synthetic_logprob(token_id: int, index: int, top_k: int, vocab: Sequence[int]) -> TokenLogprob:
    """Plausible, reproducible logprobs: the sampled token is the most likely one.

    The mocker has no distribution; these numbers only exercise the logprob plumbing.
    """
    chosen = -0.05 - (token_id % 97) / 970.0
    top = [(token_id, chosen)]
    j = 1
    while len(top) < top_k:
        alt = vocab[(token_id * 31 + index * 17 + j) % len(vocab)]
        if alt != token_id:
            top.append((alt, chosen - 1.5 - len(top)))
        j += 1
    return TokenLogprob(token_id, chosen, tuple(top))


class OutputPolicy:
    """Builds each request's ``TokenPlan`` from the mocker's mode."""

    def __init__(self, vocab: Sequence[int], *, tokenizer: Any | None = None, rules: Sequence[ScriptRule] = (),
                 default: Sequence[int] | None = None):
        if rules and tokenizer is None:
            raise ValueError("script rules need the model's tokenizer to read prompts")
        self.vocab = vocab
        self._tokenizer: Any = tokenizer  # set whenever there are rules (checked above)
        self._rules = list(rules)
        self._default = tuple(default) if default is not None else None

    @classmethod
    def build(cls, tokenizer: Any | None, *, script_path: str | Path | None = None,
              output_text: str | None = None) -> OutputPolicy:
        """Reads the script (or the one-rule shorthand) and tokenizes every answer once."""
        rules_text: list[tuple[str, str]] = []
        default_text = output_text
        if script_path:
            rules_text, script_default = parse_script(json.loads(Path(script_path).read_text()))
            default_text = script_default if script_default is not None else default_text
        if (rules_text or default_text is not None) and tokenizer is None:
            raise ValueError("script mode needs tokenizer.json in the model directory")

        reader: Any = tokenizer  # present whenever encode is called (checked above)

        def encode(text: str) -> tuple[int, ...]:
            return tuple(reader.encode(text, add_special_tokens=False).ids)

        rules = [ScriptRule(match, encode(text)) for match, text in rules_text]
        default = encode(default_text) if default_text is not None else None
        return cls(text_vocab(tokenizer), tokenizer=tokenizer, rules=rules, default=default)

    @property
    def scripted(self) -> bool:
        return bool(self._rules) or self._default is not None

    def select(self, prompt: Sequence[int]) -> tuple[int, ...] | None:
        """The scripted answer for ``prompt``: latest match wins, ties go to the first rule."""
        if not self._rules:
            return self._default
        text = self._tokenizer.decode(list(prompt), skip_special_tokens=False)
        best: ScriptRule | None = None
        best_pos = -1
        for rule in self._rules:
            pos = text.rfind(rule.match)
            if pos > best_pos:
                best, best_pos = rule, pos
        return best.token_ids if best is not None else self._default

    def _guided(self, json_schema: str | None, answer: str | None = None) -> tuple[int, ...] | None:
        """A schema-valid JSON answer, or ``answer`` as it is (guided decoding wins over the script, as a
        grammar would)."""
        if self._tokenizer is None:
            return None
        text = answer if answer is not None else guided_text(json_schema or "")
        return tuple(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def _think_ids(self) -> tuple[int | None, int | None]:
        if self._tokenizer is None:
            return None, None
        return self._tokenizer.token_to_id("<think>"), self._tokenizer.token_to_id("</think>")

    def _within_budget(self, script: tuple[int, ...], budget: int) -> tuple[int, ...]:
        """A scripted answer whose thinking block holds at most ``budget`` tokens: the rest of the
        thinking is skipped and the block closes there, as an engine enforcing a thinking budget does."""
        open_id, close_id = self._think_ids()
        if open_id is None or close_id is None or open_id not in script or close_id not in script:
            return script
        start = script.index(open_id) + 1
        end = script.index(close_id, start)
        return script if end - start <= budget else script[:start + budget] + script[end:]

    def _answer(self, prompt: Sequence[int], budget: int | None) -> tuple[int, ...] | None:
        """The scripted answer ``prompt`` selects, as the request's thinking budget shapes it."""
        script = self.select(prompt)
        if script is not None and budget is not None:
            script = self._within_budget(tuple(script), budget)
        return script

    def _answers(self, budget: int | None) -> list[tuple[int, ...]]:
        """Every answer a prompt could select (distinct, non-empty)."""
        answers = [rule.token_ids for rule in self._rules]
        if self._default is not None:
            answers.append(self._default)
        if budget is not None:
            answers = [self._within_budget(a, budget) for a in answers]
        return list(dict.fromkeys(a for a in answers if a))

    def _resumed(self, prompt: Sequence[int], seed_state: int, budget: int | None) -> tuple[int, ...] | None:
        """What is left of the scripted answer a migrated ``prompt`` is already part way through, or None
        when its end holds no answer's beginning (then it is a fresh prompt)."""
        n = len(prompt)
        packed = _packed(prompt)
        best: tuple[int, tuple[int, ...]] | None = None  # (tokens of output already in the prompt, rest)
        for answer in self._answers(budget):
            size = len(answer)
            whole = _packed(answer)
            # Inside the answer: the prompt ends with its first k tokens (k = size: only EOS is left).
            for k in range(min(size, n - 1), 0, -1):
                if answer[k - 1] != prompt[-1] or (best is not None and k <= best[0]):
                    continue
                if packed.endswith(whole[:4 * k]) and self._answer(prompt[:n - k], budget) == answer:
                    best = (k, answer[k:])
                    break
            # Past the answer: the whole answer, then the pseudo-random tokens chained on it. Only its
            # last occurrence can be followed by nothing but those tokens.
            at = _last_occurrence(packed, whole, n - 1)
            if at is None or (best is not None and n - at <= best[0]):
                continue
            after = at + size
            follow = PseudoRandomTokens(self.vocab, chain_state(prompt[:after], seed_state))
            if all(prompt[after + i] == follow.at(i) for i in range(n - after)) \
                    and self._answer(prompt[:at], budget) == answer:
                best = (n - at, ())
        return best[1] if best is not None else None

    def plan(self, prompt: Sequence[int], *, seed: int | None, max_tokens: int, min_tokens: int = 0,
             eos_id: int | None = None, ignore_eos: bool = False, guided_json_schema: str | None = None,
             max_thinking_tokens: int | None = None, guided_answer: str | None = None) -> TokenPlan:
        seed_state = xxhash.xxh3_64_intdigest(b"meshfront-mocker", seed=(seed or 0) & _U64)
        script: Sequence[int] | None
        if guided_json_schema is not None or guided_answer is not None:  # guided_answer: a structural tag's
            script = self._guided(guided_json_schema, guided_answer)
        elif not self.scripted:
            script = None
        else:
            script = self._resumed(prompt, seed_state, max_thinking_tokens)
            if script is None:
                script = self._answer(prompt, max_thinking_tokens)
        state = chain_state(prompt, seed_state)
        if script is not None:
            state = chain_state(script, state)  # what follows a scripted answer is chained on it
        return TokenPlan(script, PseudoRandomTokens(self.vocab, state), max_tokens=max_tokens,
                         min_tokens=min_tokens, eos_id=eos_id, ignore_eos=ignore_eos)


def _packed(tokens: Sequence[int]) -> bytes:
    """Token ids as 4-byte words: a token sequence search in C (``bytes.rfind``) instead of a Python loop."""
    return array("I", tokens).tobytes()


def _last_occurrence(packed: bytes, needle: bytes, end_token: int) -> int | None:
    """The token index of ``needle``'s last whole-token occurrence that ends at or before ``end_token``."""
    end = 4 * end_token
    while True:
        at = packed.rfind(needle, 0, end)
        if at < 0:
            return None
        if at % 4 == 0:
            return at // 4
        end = at + len(needle) - 1  # a match across token boundaries: look further back
