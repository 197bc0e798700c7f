"""The preprocessor and postprocessor with ``--chat-processor sglang`` as ``meshfront run`` starts them: each its
own process, from .venv-sglang's python, behind Envoy and the rest of the mesh, with a mocker worker.

Needs the SGLang engine environment (``make engine-env``, which ``make test`` runs first): under CI=true a
missing one fails, elsewhere the module is skipped. The renderer's ids against SGLang's own are checked in
that environment (tests/engine_env/sglang/test_sglang_chat_renderer.py); this checks the process and the path.
"""

from __future__ import annotations

import json

import openai
import pytest

from services.launcher.engine_env import ENGINES
from services.launcher.plan import ephemeral_plan
from services.launcher.processes import Mesh
from tests.conftest import IN_CI, ROOT, sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, DEMO_PARSERS, mocker

pytestmark = pytest.mark.mesh

# Importing SGLang and building its chat handler takes 20-40 s on a loaded machine.
START_S = 180.0


@pytest.fixture(scope="module")
def sglang_mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    if not ENGINES["sglang"].is_ready():
        message = "the SGLang engine environment is not prepared (make engine-env)"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    # At the mocker's real pace each token comes in a message of its own, as from an engine decoding one token
    # a step: SGLang's streaming tool detector loses calls that arrive whole in one chunk (see the oracle test).
    plan = ephemeral_plan([mocker(demo_model_dir, DEMO, "1", *DEMO_PARSERS)], run_dir=ROOT / ".run" / "tests",
                          service_args={"preprocessor": ("--chat-processor", "sglang"),
                                        "postprocessor": ("--chat-processor", "sglang")})
    m = Mesh(plan, tmp_path_factory.mktemp("mesh-logs")).start(timeout=START_S)
    yield m
    stop_cleanly(m)


@pytest.fixture
def client(sglang_mesh):
    c = sdk_client(sglang_mesh, timeout=60)
    yield c
    c.close()


def test_a_chat_completes_through_sglangs_renderer_in_its_environment(sglang_mesh, client):
    r = client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "Count to ten"}],
                                       max_tokens=8)
    assert r.choices[0].message.content
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert sglang_mesh.specs["preprocessor"].argv[0] == str(ENGINES["sglang"].python)
    assert "SGLang's chat handler renders chats of" in sglang_mesh.full_log("preprocessor")


def test_sglangs_parsers_split_the_answer_in_its_environment(sglang_mesh, client):
    """The mocker answers a weather question with reasoning and a hermes tool call: SGLang's qwen3 reasoning
    parser and its qwen25 tool parser (our hermes) split them, in the postprocessor run from .venv-sglang."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        "required": ["city"]}}}]
    r = client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "What is the weather in "
                                                                                          "Paris?"}],
                                       tools=tools, max_tokens=200)
    assert r.choices[0].message.tool_calls, r.choices[0].message
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Paris"
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.reasoning_content.strip() == "The user wants the weather; I should call get_weather."
    assert sglang_mesh.specs["postprocessor"].argv[0] == str(ENGINES["sglang"].python)
    assert "output parsers: sglang" in sglang_mesh.full_log("postprocessor")


def test_what_sglang_refuses_is_an_openai_400(client):
    """SGLang wants an assistant turn's tool-call arguments to be a JSON object (ours renders the string as
    it came): the client hears SGLang's reason in OpenAI's envelope, naming no Python class."""
    bad = [{"role": "user", "content": "Weather?"},
           {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
               "name": "get_weather", "arguments": "{not json"}}]},
           {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=DEMO, messages=bad, max_tokens=4)
    body = refused.value.body
    assert isinstance(body, dict) and "function.arguments must be valid JSON" in body["message"]
    assert body["param"] == "messages"
    assert "ChatCompletion" not in body["message"] and "Traceback" not in body["message"]
