"""The thinking budget on SGLang 0.5.23: its own ThinkingBudgetLogitProcessor, checked with its classes (no model runs).

The request the adapter builds names a processor that SGLang deserialises (``CustomLogitProcessor.from_str``, as
its scheduler does) into the subclass for the model's reasoning format, with the model's marker ids; run on
logits the way SGLang's sampler runs it, it closes the thinking block exactly where the hf worker's
``ThinkingBudget`` (the semantics vLLM and hf share) does.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import types

import pytest
import torch
from sglang.srt.entrypoints.engine import Engine
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.sampling.custom_logit_processor import (
    CustomLogitProcessor,
    DeepSeekR1ThinkingBudgetLogitProcessor,
    Glm4MoeThinkingBudgetLogitProcessor,
    Qwen3ThinkingBudgetLogitProcessor,
    ThinkingBudgetLogitProcessor,
)
from sglang.srt.sampling.sampling_params import SamplingParams as SglSamplingParams

from services.common.errors import InvalidRequest
from services.models.qwen import ADDED_TOKEN_IDS, VOCAB_SIZE
from services.workers.convert import engine_error
from services.workers.engine import EngineRequest, RequestRejected
from services.workers.sglang import sampling, thinking_budget
from services.workers.sglang.config import DELAY_SAMPLE_ENV, parse_config
from services.workers.thinking_budget import ThinkingBudget, ThinkingMarkers

THINK, END_THINK = ADDED_TOKEN_IDS["<think>"], ADDED_TOKEN_IDS["</think>"]
PROMPT_OPEN = [151644, 77091, 198, THINK, 198]  # the template opened the block: "<think>\n"
PROMPT_CLOSED = [151644, 77091, 198]


def limits(demo_model_dir, parser: str, custom_processors: bool = True) -> sampling.EngineLimits:
    thinking, processor = thinking_budget.enforcement(parser, str(demo_model_dir), custom_processors)
    return sampling.EngineLimits(max_model_len=4096, thinking=thinking, thinking_processor=processor)


def budget_request(budget: int | None, prompt=PROMPT_OPEN) -> EngineRequest:
    return EngineRequest("r", tuple(prompt), max_tokens=64, max_thinking_tokens=budget)


def scheduler_processor(kwargs) -> CustomLogitProcessor:
    """The processor SGLang's scheduler builds from the request (SamplingBatchInfo: ``from_str``)."""
    obj = GenerateReqInput(**kwargs)
    obj.normalize_batch_and_arguments()
    return CustomLogitProcessor.from_str(obj.custom_logit_processor)


def test_the_request_names_sglangs_qwen3_processor_with_the_models_markers_and_the_budget(demo_model_dir):
    kwargs = sampling.request_kwargs(budget_request(8), "rid-0", limits(demo_model_dir, "qwen3"))
    processor = scheduler_processor(kwargs)
    assert isinstance(processor, Qwen3ThinkingBudgetLogitProcessor)  # the demo model has Qwen3's vocabulary
    assert (processor.THINKING_START_TOKEN_ID, processor.THINKING_END_TOKEN_ID) == (THINK, END_THINK)
    params = SglSamplingParams(**kwargs["sampling_params"])
    params.verify(VOCAB_SIZE)  # SGLang's own validation of custom_params
    assert params.custom_params == {"thinking_budget": 8}
    inspect.signature(Engine.async_generate).bind(None, **kwargs)  # every name is one async_generate takes


def test_a_request_without_a_budget_names_no_processor(demo_model_dir):
    kwargs = sampling.request_kwargs(budget_request(None), "rid-0", limits(demo_model_dir, "qwen3"))
    assert "custom_logit_processor" not in kwargs and "custom_params" not in kwargs["sampling_params"]


@pytest.mark.parametrize("parser", ["basic", "minimax", "nemotron"])
def test_formats_sglang_has_no_subclass_for_get_its_base_class_with_the_models_markers(parser, demo_model_dir):
    processor = scheduler_processor(sampling.request_kwargs(budget_request(4), "r", limits(demo_model_dir, parser)))
    assert type(processor).__mro__[1] is ThinkingBudgetLogitProcessor
    assert (processor.THINKING_START_TOKEN_ID, processor.THINKING_END_TOKEN_ID) == (THINK, END_THINK)


@pytest.mark.parametrize(("parser", "sglangs"), [("glm45", Glm4MoeThinkingBudgetLogitProcessor),
                                                 ("deepseek_r1", DeepSeekR1ThinkingBudgetLogitProcessor)])
def test_sglangs_subclass_is_taken_only_for_the_vocabulary_it_was_written_for(parser, sglangs):
    own = ThinkingMarkers(sglangs.THINKING_START_TOKEN_ID, sglangs.THINKING_END_TOKEN_ID, "<think>", "</think>")
    assert issubclass(thinking_budget.processor_class(parser, own), sglangs)
    other = ThinkingMarkers(THINK, END_THINK, "<think>", "</think>")  # a Qwen vocabulary under that format
    cls = thinking_budget.processor_class(parser, other)
    assert not issubclass(cls, sglangs) and issubclass(cls, ThinkingBudgetLogitProcessor)
    assert (cls.THINKING_START_TOKEN_ID, cls.THINKING_END_TOKEN_ID) == (THINK, END_THINK)


def sglang_decode(processor: CustomLogitProcessor, prompt, budget: int, steps: int, seed: int) -> list[int]:
    """Greedy decoding of random logits through SGLang's processor, one request, as its sampler calls it
    (``apply_custom_logit_processor``: the rows of the batch and each row's custom_params with ``__req__``)."""
    gen = torch.Generator().manual_seed(seed)
    req = types.SimpleNamespace(origin_input_ids=list(prompt), output_ids=[])  # the two Req fields it reads
    for _ in range(steps):
        logits = torch.randn(1, VOCAB_SIZE, generator=gen)
        logits[0, END_THINK] = -1e9  # a model that would think forever
        out = processor(logits, [{"thinking_budget": budget, "__req__": req}])
        req.output_ids.append(int(out[0].argmax()))
    return req.output_ids


def hf_decode(prompt, budget: int, steps: int, seed: int) -> list[int]:
    """The same random model under the hf worker's ThinkingBudget (the semantics vLLM shares)."""
    gen = torch.Generator().manual_seed(seed)
    tracker = ThinkingBudget(ThinkingMarkers(THINK, END_THINK, "<think>", "</think>"), budget, list(prompt))
    out: list[int] = []
    for _ in range(steps):
        logits = torch.randn(1, VOCAB_SIZE, generator=gen)
        logits[0, END_THINK] = -1e9
        forced = tracker.forced()
        token = forced if forced is not None else int(logits[0].argmax())
        tracker.observe(token)
        out.append(token)
    return out


@pytest.mark.parametrize("budget", [0, 1, 5])
@pytest.mark.parametrize("prompt", [PROMPT_OPEN, PROMPT_CLOSED], ids=["template-opened", "closed"])
def test_sglangs_processor_closes_the_block_where_the_hf_worker_does(demo_model_dir, budget, prompt):
    kwargs = sampling.request_kwargs(budget_request(budget, prompt), "r", limits(demo_model_dir, "qwen3"))
    processor = scheduler_processor(kwargs)
    got = sglang_decode(processor, prompt, budget, steps=12, seed=budget)
    assert got == hf_decode(prompt, budget, steps=12, seed=budget)
    if prompt is PROMPT_OPEN:
        # The template's "\n" after <think> is the block's first token: the budget's last is the model's budget-1'th.
        closes_at = max(budget - 1, 0)
        assert got[closes_at] == END_THINK and END_THINK not in got[:closes_at]
    else:
        assert END_THINK not in got  # no block open: nothing is forced


def test_a_block_the_model_opens_itself_counts_from_its_opening_marker(demo_model_dir):
    kwargs = sampling.request_kwargs(budget_request(3, PROMPT_CLOSED), "r", limits(demo_model_dir, "qwen3"))
    processor = scheduler_processor(kwargs)
    req = types.SimpleNamespace(origin_input_ids=list(PROMPT_CLOSED), output_ids=[THINK, 11, 12, 13])
    logits = torch.zeros(2, VOCAB_SIZE)
    under = types.SimpleNamespace(origin_input_ids=list(PROMPT_CLOSED), output_ids=[THINK, 11, 12])
    out = processor(logits, [{"thinking_budget": 3, "__req__": req}, {"thinking_budget": 3, "__req__": under}])
    assert int(out[0].argmax()) == END_THINK and torch.isinf(out[0]).sum() == VOCAB_SIZE - 1
    assert not torch.isinf(out[1]).any()  # the other row of the batch still has a token to go


def test_sglangs_scheduler_rebuilds_the_processor_without_importing_meshfront(demo_model_dir, tmp_path):
    kwargs = sampling.request_kwargs(budget_request(2), "r", limits(demo_model_dir, "qwen3"))
    script = ("import json, sys\n"
              "from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor\n"
              "p = CustomLogitProcessor.from_str(sys.stdin.read())\n"
              "assert 'services' not in sys.modules\n"
              "print(json.dumps([type(p).__mro__[1].__name__, p.THINKING_END_TOKEN_ID, p.NEW_LINE_TOKEN_ID]))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", script], input=kwargs["custom_logit_processor"], text=True,
                          capture_output=True, cwd=tmp_path, env=env, timeout=300, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["Qwen3ThinkingBudgetLogitProcessor", END_THINK,
                                                                  END_THINK]


@pytest.mark.parametrize(("parser", "custom_processors", "why"), [
    ("", True, "no reasoning parser"),
    ("granite", True, "does not end thinking at one token"),
    ("mistral", True, "'[THINK]' is not one token"),
    ("qwen3", False, "--enable-watermark"),
])
def test_a_budget_sglang_cannot_enforce_is_a_400_saying_why(demo_model_dir, parser, custom_processors, why):
    engine_limits = limits(demo_model_dir, parser, custom_processors)
    assert "custom_logit_processor" not in sampling.request_kwargs(budget_request(None), "r", engine_limits)
    with pytest.raises(RequestRejected) as e:
        sampling.request_kwargs(budget_request(16), "r", engine_limits)
    err = engine_error(e.value)
    assert isinstance(err, InvalidRequest) and err.http_status == 400 and err.param == "nvext.max_thinking_tokens"
    assert why in err.message and "thinking.budget_tokens" in err.message


@pytest.fixture
def model_dir(tmp_path):
    path = tmp_path / "demo-model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    return path


@pytest.mark.parametrize(("extra", "enabled"), [
    (["--reasoning-parser", "qwen3"], True),
    (["--reasoning-parser", "qwen3", "--enable-watermark"], False),  # SGLang refuses the two together
    (["--reasoning-parser", "granite"], False),  # nothing to enforce with it
    ([], False),
])
def test_the_worker_turns_sglangs_custom_logit_processors_on_for_a_reasoning_model(model_dir, monkeypatch, extra,
                                                                                   enabled):
    monkeypatch.setenv(DELAY_SAMPLE_ENV, "")  # server_args() sets it with the processor: unset after the test
    monkeypatch.delenv(DELAY_SAMPLE_ENV)
    cfg = parse_config(["--model-dir", str(model_dir), "--no-register", *extra])
    assert cfg.server_args().enable_custom_logit_processor is enabled
