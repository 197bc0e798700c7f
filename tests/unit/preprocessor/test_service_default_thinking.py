"""A card's default thinking mode (the worker's --dyn-default-thinking-mode) reaches the chat template, unless the
request says something about thinking itself."""

from __future__ import annotations

import asyncio
import json

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.preprocessor.v1 import preprocessor_pb2
from tokenizers import Tokenizer

from services.common.discovery import ModelCard
from services.preprocessor.core.artifacts import ArtifactCache
from services.preprocessor.service import Preprocessor

pytestmark = pytest.mark.unit

MESSAGES = [{"role": "user", "content": "Hi"}]


def prompt(demo_model_dir, default_mode: str, kwargs: dict | None = None) -> str:
    model = ModelCard(name="demo", model_dir=str(demo_model_dir), reasoning_parser="qwen3",
                      default_thinking_mode=default_mode)
    req = preprocessor_pb2.PreprocessRequest(
        request=common_pb2.PreprocessedRequest(request_id="r1", model="demo"), messages_json=json.dumps(MESSAGES),
        chat_template_kwargs_json=json.dumps(kwargs) if kwargs else "")
    out = asyncio.run(Preprocessor({"demo": model}.get, ArtifactCache()).preprocess(req))
    return Tokenizer.from_file(str(demo_model_dir / "tokenizer.json")).decode(list(out.request.token_ids),
                                                                              skip_special_tokens=False)


def test_the_deployment_default_turns_thinking_off_unless_the_request_turns_it_on(demo_model_dir):
    plain = prompt(demo_model_dir, "")
    off = prompt(demo_model_dir, "disabled")
    assert "<think>" not in plain and off.endswith("<think>\n\n</think>\n\n")  # Qwen3's template, thinking off
    assert prompt(demo_model_dir, "disabled", {"enable_thinking": True}) == plain  # the request wins
    assert prompt(demo_model_dir, "enabled") == plain


def test_the_workers_flag_and_its_dynamo_env_twin_reach_the_card(demo_model_dir):
    from services.workers.mocker.config import parse_config
    from services.workers.server import worker_card

    cfg = parse_config(["--model-dir", str(demo_model_dir)], env={"DYN_DEFAULT_THINKING_MODE": "disabled"})
    assert worker_card(cfg.worker, "127.0.0.1:1").model.default_thinking_mode == "disabled"
    with pytest.raises(SystemExit):
        parse_config(["--model-dir", str(demo_model_dir), "--dyn-default-thinking-mode", "adaptive"], env={})
