"""Models whose tokenizer is not a tokenizer.json, served through one all-in-one mesh (Envoy, mocker workers):
a Kimi-style tiktoken.model and a SentencePiece-only tokenizer.model (services/models/tokenizer_models.py).

The prompt's token ids (nvext annotations) equal the reference library's on the rendered prompt, and an
answer full of multi-byte characters, which the mocker encodes with the model's tokenizer and the
postprocessor decodes as it streams, arrives exactly, streamed and whole."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import orjson
import pytest
import sentencepiece as spm
import tiktoken
from tiktoken.load import load_tiktoken_bpe

from services.launcher.plan import WorkerSpec
from services.models.tokenizer_models import KIMI_PATTERN, MARKERS, TIKTOKEN_RANKS, build_tokenizer_model
from tests.conftest import BIN, sdk_client, stop_cleanly
from tests.mesh.conftest import start_mesh

pytestmark = [pytest.mark.mesh, pytest.mark.timeout(240)]

ANSWER = "Grüße aus 東京 🤖🎉 — naïve café, ½ done ✓."
KINDS = ("tiktoken", "sentencepiece")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizer-models")
    return {kind: build_tokenizer_model(kind, root / kind) for kind in KINDS}


@pytest.fixture(scope="module")
def tmesh(tmp_path_factory, models, envoy_bin, nats_bin):
    script = tmp_path_factory.mktemp("script") / "script.json"
    script.write_text(json.dumps([{"match": "tokcheck", "text": ANSWER}, {"default": "ok"}]))
    workers = [WorkerSpec(str(models[k]), f"tiny/{k}", "mocker", ("--script", str(script), "--speedup-ratio", "200"))
               for k in KINDS]
    m = start_mesh(tmp_path_factory, workers, inproc=True, service_args={"preprocessor": ("--tokenizer", "fastokens")})
    yield m
    stop_cleanly(m)


def build_model_argv() -> list[str]:
    exe = BIN / "meshfront"
    return [str(exe), "build-model"] if exe.exists() else [sys.executable, "-m", "services.models"]


def _reference(kind: str, model_dir):
    """(encode, decode) of the reference library: tiktoken itself, or sentencepiece itself."""
    if kind == "tiktoken":
        ranks = load_tiktoken_bpe(str(model_dir / "tiktoken.model"))
        specials = {m: TIKTOKEN_RANKS + i for i, m in enumerate(MARKERS)}
        enc = tiktoken.Encoding("ref", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=specials)
        return (lambda text: enc.encode(text, allowed_special="all")), enc.decode
    sp = spm.SentencePieceProcessor(model_file=str(model_dir / "tokenizer.model"))
    return sp.encode, sp.decode


@pytest.mark.parametrize("kind", KINDS)
def test_prompt_ids_and_streamed_text_are_exact(tmesh, models, kind):
    client = sdk_client(tmesh, timeout=60)
    messages = [{"role": "user", "content": "tokcheck: Grüße 東京 🤖 naïve"}]
    events: dict[str, object] = {}
    deltas: list[str] = []
    with client.chat.completions.with_streaming_response.create(
            model=f"tiny/{kind}", messages=messages, stream=True, max_tokens=200,
            extra_body={"nvext": {"annotations": ["formatted_prompt", "token_ids"]}}) as r:
        lines = list(r.iter_lines())
    for i, line in enumerate(lines):
        if line.startswith("event: "):
            events[line[len("event: "):]] = orjson.loads(lines[i + 1][2:])
        elif line.startswith("data: {"):
            for choice in orjson.loads(line[len("data: "):])["choices"]:
                deltas.append(choice["delta"].get("content") or "")
    prompt = events["formatted_prompt"]
    assert isinstance(prompt, str) and "<|im_start|>assistant\n" in prompt
    encode, decode = _reference(kind, models[kind])
    prompt_ids = events["token_ids"]
    assert prompt_ids == encode(prompt)
    # The answer as the reference decodes it after the prompt: the mocker encoded the script's text with the
    # model's tokenizer (SentencePiece's NFKC writes ½ as 1⁄2, and its word-initial ▁ is a space here).
    expected = decode(prompt_ids + encode(ANSWER))[len(decode(prompt_ids)):]
    assert "🤖🎉" in expected and "東京" in expected
    assert "".join(deltas) == expected
    whole = client.chat.completions.create(model=f"tiny/{kind}", messages=messages, max_tokens=200)
    assert whole.choices[0].message.content == expected
    client.close()


def test_meshfront_run_serves_a_tiktoken_and_a_sentencepiece_model_with_exact_ids(tmp_path, models, envoy_bin,
                                                                                 nats_bin):
    """What a user runs: `meshfront build-model --tokenizer KIND --out DIR`, then `meshfront run --model-dir DIR`."""
    from tests.mesh.test_launcher_supervision import Launcher

    for kind in KINDS:
        built = subprocess.run([*build_model_argv(), "--tokenizer", kind, "--out", str(tmp_path / kind)],
                               capture_output=True, text=True, timeout=120)
        assert built.returncode == 0, built.stderr
        (tmp_path / f"run-{kind}").mkdir()
        lch = Launcher(tmp_path / f"run-{kind}", "--model-dir", str(tmp_path / kind), "--model-name", f"run/{kind}",
                       "--embedding-workers", "0", "--image-workers", "0", "--video-workers", "0",
                       "--workers", "1", "--speedup-ratio", "0", "--mocker-script", "")
        try:
            lch.wait_healthy(1, 120, model=f"run/{kind}")
            r = httpx.post(f"{lch.url}/v1/chat/completions", timeout=30, json={
                "model": f"run/{kind}", "max_tokens": 4, "messages": [{"role": "user", "content": "Grüße 東京 🤖"}],
                "nvext": {"annotations": ["formatted_prompt", "token_ids"]}})
            assert r.status_code == 200, r.text
            annotations = r.json()["nvext"]
            encode, _ = _reference(kind, tmp_path / kind)
            assert annotations["token_ids"] == encode(annotations["formatted_prompt"])
        finally:
            lch.kill_everything()
