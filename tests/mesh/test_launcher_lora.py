"""`meshfront run --demo-lora` (the product path) serves the demo adapter beside the demo model, with the mocker.

The launcher runs as a subprocess on free ports; the adapter registers on the workers' cards, /v1/models
names its base, a chat under the adapter answers through the official SDK, and a runtime load succeeds
(the demo's workers load adapters at runtime).
"""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from services.models.qwen_lora import DEMO_ADAPTER_NAME, default_demo_adapter_dir
from tests.mesh.conftest import DEMO
from tests.mesh.test_launcher_supervision import Launcher

pytestmark = [pytest.mark.mesh, pytest.mark.timeout(240)]


def test_meshfront_run_demo_lora_serves_the_adapter(tmp_path, envoy_bin, nats_bin):
    lch = Launcher(tmp_path, "--demo-lora", "--workers", "2", "--embedding-workers", "0", "--image-workers", "0",
                   "--video-workers", "0")
    try:
        deadline = time.monotonic() + 150
        while lch.health() != {DEMO: 2, DEMO_ADAPTER_NAME: 2}:
            assert lch.proc.poll() is None, f"the launcher exited\n{lch.log()[-6000:]}"
            assert time.monotonic() < deadline, f"/health: {lch.health()}\n{lch.log()[-6000:]}"
            time.sleep(0.3)
        client = openai.OpenAI(base_url=f"{lch.url}/v1", api_key="unused", max_retries=0, timeout=30)
        listed = {m.id: m.model_extra for m in client.models.list().data}
        assert listed[DEMO_ADAPTER_NAME]["parent"] == DEMO
        r = client.chat.completions.create(model=DEMO_ADAPTER_NAME, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=8)
        assert r.model == DEMO_ADAPTER_NAME and r.choices[0].message.content
        loaded = httpx.post(f"{lch.url}/v1/load_lora_adapter", timeout=30,
                            json={"lora_name": "more", "lora_path": str(default_demo_adapter_dir())})
        assert loaded.status_code == 200, loaded.text
        assert lch.health()["more"] == 2
    finally:
        lch.kill_everything()
