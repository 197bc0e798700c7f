"""--chat-template, the formatted prompt, and media against the model's declared modalities."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.preprocessor.v1 import preprocessor_pb2

from services.common.discovery import ModelCard
from services.common.errors import InvalidRequest
from services.preprocessor.config import parse_config
from services.preprocessor.core.artifacts import ArtifactCache
from services.preprocessor.core.template_check import read_chat_template
from services.preprocessor.core.templates import renders_media_parts
from services.preprocessor.service import Preprocessor
from tests.media_samples import data_url, png

pytestmark = pytest.mark.unit

CUSTOM = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant]"
PNG_URL = data_url(png(56, 56))
IMAGE = common_pb2.MediaItem(modality="image", url=PNG_URL, message_index=0, part_index=1)
CONTENT = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": PNG_URL}}]


@pytest.fixture(scope="module")
def cache():
    return ArtifactCache()


def make(demo_model_dir, cache, template: str = "", modalities: tuple[str, ...] = ()) -> Preprocessor:
    card = ModelCard(name="demo", model_dir=str(demo_model_dir), input_modalities=modalities)
    return Preprocessor({"demo": card}.get, cache, chat_template=template)


def request(messages, media=(), formatted: bool = True) -> preprocessor_pb2.PreprocessRequest:
    return preprocessor_pb2.PreprocessRequest(
        request=common_pb2.PreprocessedRequest(request_id="r", model="demo", media=list(media)),
        messages_json=json.dumps(messages), return_formatted_prompt=formatted)


async def test_a_custom_template_replaces_the_model_directorys(demo_model_dir, cache):
    messages = [{"role": "user", "content": "hi"}]
    own = await make(demo_model_dir, cache).preprocess(request(messages))
    assert own.formatted_prompt.startswith("<|im_start|>user\nhi")
    custom = await make(demo_model_dir, cache, CUSTOM).preprocess(request(messages))
    assert custom.formatted_prompt == "[user] hi\n[assistant]"
    assert len(custom.request.token_ids) < len(own.request.token_ids)
    quiet = await make(demo_model_dir, cache, CUSTOM).preprocess(request(messages, formatted=False))
    assert quiet.formatted_prompt == "" and list(quiet.request.token_ids) == list(custom.request.token_ids)


async def test_media_need_a_model_that_declares_them(demo_model_dir, cache):
    messages = [{"role": "user", "content": CONTENT}]
    with pytest.raises(InvalidRequest, match="The model `demo` does not accept image input") as e:
        await make(demo_model_dir, cache).preprocess(request(messages, [IMAGE]))
    assert e.value.param == "messages"
    audio = common_pb2.MediaItem(modality="audio", data="AAAA", format="wav")
    with pytest.raises(InvalidRequest, match="does not accept audio input"):
        await make(demo_model_dir, cache, modalities=("image",)).preprocess(request(messages, [IMAGE, audio]))
    ok = await make(demo_model_dir, cache, modalities=("image",)).preprocess(request(messages, [IMAGE]))
    assert [m.content for m in ok.request.media] == [png(56, 56)]  # on to the worker, with its bytes


async def test_a_string_content_template_gets_the_text_of_media_messages(demo_model_dir, cache):
    pre = make(demo_model_dir, cache, modalities=("image",))
    resp = await pre.preprocess(request([{"role": "user", "content": CONTENT}], [IMAGE]))
    # The demo template reads strings: the image stands where it was as Qwen2-VL's markers, its one
    # <|image_pad|> expanded to the image's tokens (56 x 56 px: 2 x 2 tiles of 28 px).
    assert "<|im_start|>user\nlook\n<|vision_start|><|image_pad|><|vision_end|><|im_end|>" in resp.formatted_prompt
    assert list(resp.request.token_ids).count(151655) == 4
    assert (resp.request.media[0].token_offset, resp.request.media[0].token_count) == (
        list(resp.request.token_ids).index(151655), 4)
    assert not renders_media_parts(CUSTOM)
    assert renders_media_parts("{% if part.type == 'image' %}<|image_pad|>{% endif %}")


def test_read_chat_template(tmp_path):
    good = tmp_path / "good.jinja"
    good.write_text(CUSTOM)
    assert read_chat_template(str(good)) == CUSTOM
    assert parse_config(["--chat-template", str(good)], {}).chat_template == CUSTOM
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }")
    with pytest.raises(ValueError, match=r"bad.jinja does not compile: .*line 1"):
        read_chat_template(str(bad))
    empty = tmp_path / "empty.jinja"
    empty.write_text("  \n")
    with pytest.raises(ValueError, match="is empty"):
        read_chat_template(str(empty))
    with pytest.raises(ValueError, match="cannot read it"):
        parse_config(["--chat-template", str(tmp_path / "missing.jinja")], {})


@pytest.mark.parametrize("module", ["services.preprocessor", "services.allinone"])
def test_a_template_that_does_not_compile_stops_the_service_at_start(tmp_path, module):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% if %}")
    done = subprocess.run([sys.executable, "-m", module, "--chat-template", str(bad), "--port", "0"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert f"--chat-template {bad} does not compile" in done.stderr
    assert "Traceback" not in done.stderr
