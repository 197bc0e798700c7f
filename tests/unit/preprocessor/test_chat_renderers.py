"""The preprocessor's --chat-processor as the main environment sees it: ours by default and unchanged,
the engines' renderers unimported and refused with the reason where they are not installed.

The engines' renderers themselves are tested in their environments (tests/engine_env/vllm/test_vllm_chat_renderer.py,
tests/engine_env/sglang/test_sglang_chat_renderer.py).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.preprocessor.v1 import preprocessor_pb2

from services.common.discovery import ModelCard
from services.launcher import engine_env
from services.launcher.plan import WorkerSpec, chat_processor_engine, ephemeral_plan, specs
from services.preprocessor.config import parse_config
from services.preprocessor.core import prompt as core
from services.preprocessor.core.renderers import (
    CHAT_PROCESSORS,
    ChatRendererUnavailable,
    OursChatRenderer,
    load_chat_renderer,
)
from services.preprocessor.service import Preprocessor

pytestmark = pytest.mark.unit

MESSAGES = [{"role": "user", "content": "What is 2+2?"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]


def test_the_preprocessor_offers_ours_vllm_and_sglang():
    assert CHAT_PROCESSORS == ("ours", "vllm", "sglang")


def test_the_flag_and_its_env_twin():
    assert parse_config([], env={}).chat_processor == "ours"
    assert parse_config(["--chat-processor", "vllm"], env={}).chat_processor == "vllm"
    assert parse_config(["--chat-processor", "sglang"], env={}).chat_processor == "sglang"
    assert parse_config([], env={"MESHFRONT_PREPROCESSOR_CHAT_PROCESSOR": "vllm"}).chat_processor == "vllm"
    assert parse_config(["--chat-processor", "ours"],
                        env={"MESHFRONT_PREPROCESSOR_CHAT_PROCESSOR": "vllm"}).chat_processor == "ours"


@pytest.mark.parametrize("name", ["tgi", "trtllm"])
def test_a_name_the_preprocessor_cannot_render_with_is_refused(name):
    with pytest.raises(ValueError, match=f"--chat-processor '{name}' is not one of ours, vllm, sglang"):
        parse_config(["--chat-processor", name], env={})
    with pytest.raises(ValueError, match=f"--chat-processor '{name}' is not one of ours, vllm, sglang"):
        parse_config([], env={"MESHFRONT_PREPROCESSOR_CHAT_PROCESSOR": name})
    with pytest.raises(ValueError, match=f"unknown chat processor '{name}'"):
        load_chat_renderer(name)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_missing_engine_is_a_clear_startup_error(engine):
    if importlib.util.find_spec(engine) is not None:
        pytest.fail(f"{engine} is installed in the main environment; this test expects it absent")
    with pytest.raises(ChatRendererUnavailable,
                       match=rf"--chat-processor {engine} needs {engine}.*engine's environment"):
        load_chat_renderer(engine)
    assert engine not in sys.modules


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_preprocessor_exits_with_the_reason_when_the_engine_is_missing(engine):
    proc = subprocess.run([sys.executable, "-m", "services.preprocessor", "--chat-processor", engine, "--port", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert f"--chat-processor {engine} needs {engine}" in proc.stderr


async def test_ours_is_the_default_and_renders_as_before(demo_model_dir, artifacts):
    """The default renderer is prompt.prepare_chat itself: the same ids as the code before the flag."""
    assert isinstance(load_chat_renderer("ours"), OursChatRenderer)
    card = ModelCard(name="demo", model_dir=str(demo_model_dir))
    req = preprocessor_pb2.PreprocessRequest(
        request=common_pb2.PreprocessedRequest(request_id="r", model="demo"),
        messages_json=json.dumps(MESSAGES), tools_json=json.dumps(TOOLS), chat_template_kwargs_json='{"a": 1}')
    expected = core.prepare_chat(artifacts, core.ChatInput(json.dumps(MESSAGES), json.dumps(TOOLS),
                                                           chat_template_kwargs_json='{"a": 1}'))
    for preprocessor in (Preprocessor({"demo": card}.get), Preprocessor({"demo": card}.get,
                                                                          chat_renderer=OursChatRenderer())):
        resp = await preprocessor.preprocess(req)
        assert list(resp.request.token_ids) == expected.token_ids


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_launcher_starts_an_engine_rendering_preprocessor_from_the_engines_environment(tmp_path, demo_model_dir,
                                                                                            engine):
    assert chat_processor_engine(["--chat-processor", engine]) == engine
    assert chat_processor_engine(["--offload-threshold", "9", "--chat-processor=vllm"]) == "vllm"
    assert chat_processor_engine(["--chat-processor", "ours"]) is None and chat_processor_engine([]) is None
    workers = [WorkerSpec(str(demo_model_dir), "m", "mocker", ())]
    plan = ephemeral_plan(workers, run_dir=tmp_path)
    plan.service_args = {"preprocessor": ("--chat-processor", engine)}
    argv = next(s.argv for s in specs(plan) if s.name == "preprocessor")
    assert argv[:3] == [str(engine_env.ENGINES[engine].python), "-m", "services.preprocessor"]
    assert argv[argv.index("--chat-processor") + 1] == engine
    plain = ephemeral_plan(workers, run_dir=tmp_path)
    assert next(s.argv for s in specs(plain) if s.name == "preprocessor")[0] == sys.executable


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_launcher_starts_a_postprocessor_using_an_engines_parsers_from_the_engines_environment(
        tmp_path, demo_model_dir, engine):
    workers = [WorkerSpec(str(demo_model_dir), "m", "mocker", ())]
    plan = ephemeral_plan(workers, run_dir=tmp_path)
    plan.service_args = {"postprocessor": ("--chat-processor", engine)}
    by_name = {s.name: s.argv for s in specs(plan)}
    assert by_name["postprocessor"][:3] == [str(engine_env.ENGINES[engine].python), "-m", "services.postprocessor"]
    assert by_name["preprocessor"][0] == sys.executable  # each stage follows its own flag
    inproc = ephemeral_plan(workers, run_dir=tmp_path, inproc=True)
    inproc.service_args = {"postprocessor": ("--chat-processor", engine)}
    with pytest.raises(ValueError, match="postprocessor needs it as its own process"):
        specs(inproc)


def test_the_all_in_one_shape_refuses_an_engine_renderer(tmp_path, demo_model_dir):
    plan = ephemeral_plan([WorkerSpec(str(demo_model_dir), "m", "mocker", ())], run_dir=tmp_path, inproc=True)
    plan.service_args = {"preprocessor": ("--chat-processor", "vllm")}
    with pytest.raises(ValueError, match="needs it as its own process"):
        specs(plan)


def test_importing_the_preprocessor_imports_no_engine():
    code = ("import sys, services.preprocessor.main, services.preprocessor.service, "
            "services.preprocessor.core.renderers as r; r.load_chat_renderer('ours'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'sglang')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
