"""When SGLang 0.5.23's thinking-budget processor sees a request's tokens, and the worker's answer to it (runs in
.venv-sglang; no model runs).

SGLang's overlap scheduler (on by default) launches a decode step before it has processed the previous step's
result, and its TpModelWorker samples at launch unless sampling is delayed (a grammar in the batch, or
``SGLANG_ENABLE_DELAY_SAMPLE``): a custom logit processor then reads ``req.output_ids`` one token behind. Here
the worker's processor runs on a simulated decode that shows it that lagging view: the end marker comes a token
late, and twice. The worker turns SGLang's delayed sampling on with the processor (config.py), and the pins
below hold SGLang's code to the order that makes the view current.
"""

from __future__ import annotations

import inspect
import json
import types

import pytest
import torch
from sglang.srt.environ import envs
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

from services.models.qwen import ADDED_TOKEN_IDS, VOCAB_SIZE
from services.workers.config import ConfigError
from services.workers.engine import EngineRequest
from services.workers.sglang import sampling, thinking_budget
from services.workers.sglang.config import DELAY_SAMPLE_ENV, parse_config, sample_after_the_previous_step

THINK, END_THINK = ADDED_TOKEN_IDS["<think>"], ADDED_TOKEN_IDS["</think>"]
PROMPT_OPEN = [151644, 77091, 198, THINK, 198]  # the template opened the block: "<think>\n" (the "\n" counts)


def processor_for(demo_model_dir, budget: int) -> CustomLogitProcessor:
    thinking, processor = thinking_budget.enforcement("qwen3", str(demo_model_dir), True)
    limits = sampling.EngineLimits(max_model_len=4096, thinking=thinking, thinking_processor=processor)
    kwargs = sampling.request_kwargs(EngineRequest("r", tuple(PROMPT_OPEN), max_tokens=64,
                                                   max_thinking_tokens=budget), "r", limits)
    return CustomLogitProcessor.from_str(kwargs["custom_logit_processor"])


def decode(processor, budget: int, steps: int, lag: int) -> list[int]:
    """A model that would think forever, decoded with the processor seeing all but the last ``lag`` tokens
    (lag 1: the overlap scheduler sampling at launch; 0: delayed sampling, or no overlap)."""
    out: list[int] = []
    for step in range(steps):
        seen = out[:len(out) - lag] if step else []  # a prefill's sample sees the prompt whole
        req = types.SimpleNamespace(origin_input_ids=list(PROMPT_OPEN), output_ids=seen)
        logits = torch.zeros(1, VOCAB_SIZE)
        logits[0, 1000 + step] = 1.0  # a new thinking token each step
        logits[0, END_THINK] = -1e9
        out.append(int(processor(logits, [{"thinking_budget": budget, "__req__": req}])[0].argmax()))
    return out


# (budget, how late the lagging view ends it): a budget the prefill's own sample spends (it sees the whole
# prompt) still ends on time.
@pytest.mark.parametrize(("budget", "late"), [(1, 0), (4, 1)])
def test_a_processor_one_step_behind_ends_the_block_late_and_twice(demo_model_dir, budget, late):
    processor = processor_for(demo_model_dir, budget)
    on_time = decode(processor, budget, steps=8, lag=0)
    assert on_time.index(END_THINK) == budget - 1 and on_time.count(END_THINK) == 1  # "\n" + budget-1 more
    behind = decode(processor, budget, steps=8, lag=1)
    closes = budget - 1 + late
    assert behind.index(END_THINK) == closes
    assert behind[closes:closes + 2] == [END_THINK, END_THINK]  # forced again before it is seen
    assert behind.count(END_THINK) == 2


def test_overlap_samples_after_the_previous_result_only_when_sampling_is_delayed():
    """SGLang's order, pinned: the worker samples at launch unless delayed; the scheduler processes the previous
    batch's result before it runs a delayed sample."""
    worker = inspect.getsource(TpModelWorker.forward_batch_generation)
    assert "envs.SGLANG_ENABLE_DELAY_SAMPLE.get()" in worker and "batch_result.delay_sample_func =" in worker
    loop = inspect.getsource(Scheduler.event_loop_overlap)
    launch, process, sample = (loop.index(s) for s in ("self.run_batch(batch)", "pop_and_process()\n            elif",
                                                         "self.launch_batch_sample_if_needed("))
    assert launch < process < sample


@pytest.fixture
def model_dir(tmp_path):
    path = tmp_path / "demo-model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    return path


@pytest.mark.parametrize(("extra", "delayed"), [
    (["--reasoning-parser", "qwen3"], True),
    (["--reasoning-parser", "qwen3", "--disable-overlap-schedule"], False),  # every step sees the last token
    (["--reasoning-parser", "qwen3", "--enable-watermark"], False),  # no processor: budgets are refused
    ([], False),
])
def test_the_worker_delays_sglangs_sampling_with_the_budget_processor(model_dir, monkeypatch, extra, delayed):
    monkeypatch.setenv(DELAY_SAMPLE_ENV, "")  # restored (unset) after the test, whatever server_args() sets
    monkeypatch.delenv(DELAY_SAMPLE_ENV)
    parse_config(["--model-dir", str(model_dir), "--no-register", *extra]).server_args()
    assert envs.SGLANG_ENABLE_DELAY_SAMPLE.get() is delayed


def test_delayed_sampling_turned_off_by_hand_is_refused():
    with pytest.raises(ConfigError, match="one token late"):
        sample_after_the_previous_step({DELAY_SAMPLE_ENV: "false"})
    env = {DELAY_SAMPLE_ENV: "true"}
    sample_after_the_previous_step(env)
    assert env[DELAY_SAMPLE_ENV] == "1"
