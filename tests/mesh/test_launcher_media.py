"""`meshfront run` (the product path) serves the demo image and video models beside the text one.

The launcher runs as a subprocess on free ports with its defaults (one image and one video simulator).
Both models register and show in /health; each worker, dialled at the address it registered, answers
GenerateMedia with real bytes; and no stage logs an error about them (before media cards were skipped,
the preprocessor and the postprocessor tried to load a tokenizer from a media card's empty directory).
"""

from __future__ import annotations

import io
import re
import time

import av
import grpc
import pytest
from meshfront.worker.v1 import media_pb2, media_pb2_grpc
from PIL import Image

from services.common.grpc_server import CHANNEL_OPTIONS
from services.launcher.run import DEMO_IMAGE_MODEL_NAME, DEMO_VIDEO_MODEL_NAME
from tests.mesh.conftest import DEMO
from tests.mesh.test_launcher_supervision import Launcher

pytestmark = [pytest.mark.mesh, pytest.mark.timeout(240)]


def registered_address(log: str, model: str) -> str:
    [address] = re.findall(rf"registering \S+ for model {re.escape(model)} at (\S+)", log)
    return address


async def generate(address: str, req: media_pb2.GenerateMediaRequest) -> bytes:
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = media_pb2_grpc.MediaServiceStub(channel)
        data = bytearray()
        async for event in stub.GenerateMedia(req, timeout=60):
            if event.WhichOneof("event") == "chunk":
                data.extend(event.chunk.data)
        return bytes(data)


async def test_the_demo_media_models_register_and_serve_through_meshfront_run(tmp_path, demo_model_dir, envoy_bin,
                                                                               nats_bin):
    lch = Launcher(tmp_path, "--model-dir", str(demo_model_dir), "--model-name", DEMO, "--workers", "1",
                   "--embedding-workers", "0")
    try:
        want = {DEMO: 1, DEMO_IMAGE_MODEL_NAME: 1, DEMO_VIDEO_MODEL_NAME: 1}
        deadline = time.monotonic() + 150
        while lch.health() != want:
            assert lch.proc.poll() is None, f"the launcher exited\n{lch.log()[-6000:]}"
            assert time.monotonic() < deadline, f"/health: {lch.health()}\n{lch.log()[-6000:]}"
            time.sleep(0.3)
        log = lch.log()
        image = await generate(registered_address(log, DEMO_IMAGE_MODEL_NAME), media_pb2.GenerateMediaRequest(
            model=DEMO_IMAGE_MODEL_NAME, kind=media_pb2.MEDIA_KIND_IMAGE, prompt="a lighthouse", width=256,
            height=128, seed=3, output_format="png"))
        assert Image.open(io.BytesIO(image)).size == (256, 128)
        video = await generate(registered_address(log, DEMO_VIDEO_MODEL_NAME), media_pb2.GenerateMediaRequest(
            model=DEMO_VIDEO_MODEL_NAME, kind=media_pb2.MEDIA_KIND_VIDEO, prompt="waves", width=320, height=192,
            seed=3, output_format="mp4", num_frames=10, fps=5.0))
        with av.open(io.BytesIO(video)) as container:
            assert len(list(container.decode(video=0))) == 10
        time.sleep(1.0)  # the stages' warm-ups have long run by now; give their logs a moment
        errors = [line for line in lch.log().splitlines() if re.search(r"\b(ERROR|CRITICAL)\b|Traceback", line)]
        assert errors == [], "\n".join(errors[:20])
        assert "cannot load model" not in lch.log()
    finally:
        lch.kill_everything()
