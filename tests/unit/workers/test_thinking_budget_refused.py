"""Engines that cannot cap thinking refuse a thinking budget with a 400 naming it, instead of dropping it (issue 22).

The mocker honours the budget (test_mocker_thinking_budget.py); the hf and vLLM workers enforce it where their
reasoning parser ends thinking at one token and refuse it elsewhere (test_thinking_budget.py).
"""

from __future__ import annotations

import pytest

from services.common.errors import InvalidRequest
from services.workers.convert import engine_error
from services.workers.engine import EngineRequest, RequestRejected
from services.workers.sglang import sampling as sglang_sampling
from services.workers.vllm import sampling as vllm_sampling

pytestmark = pytest.mark.unit


def request(**kw) -> EngineRequest:
    return EngineRequest(request_id="r", token_ids=[1, 2, 3], max_tokens=8, **kw)


@pytest.mark.parametrize("build", [
    lambda r: vllm_sampling.sampling_kwargs(r, max_model_len=100, defaults={}),  # an engine without a reasoning config
    lambda r: sglang_sampling.request_kwargs(r, "rid", sglang_sampling.EngineLimits(max_model_len=100)),
], ids=["vllm", "sglang"])
def test_a_thinking_budget_is_refused_naming_the_field_and_its_absence_is_fine(build):
    build(request())
    with pytest.raises(RequestRejected) as e:
        build(request(max_thinking_tokens=32))
    err = engine_error(e.value)
    assert isinstance(err, InvalidRequest) and err.http_status == 400
    assert err.param == "nvext.max_thinking_tokens" and "thinking.budget_tokens" in err.message
