"""A uuid names an image sent before whichever preprocessor replica a later request reaches (two replicas
sharing the uuid store in NATS; each replica alone would know only the uuids it saw)."""

from __future__ import annotations

import re
import urllib.request

import pytest

from tests.conftest import sdk_client, stop_cleanly
from tests.media_samples import data_url, png
from tests.mesh.conftest import DEMO, mocker, start_mesh

pytestmark = [pytest.mark.mesh, pytest.mark.timeout(180)]

TEXT = "river garden apple stone light bread music window"


@pytest.fixture(scope="module")
def two_preprocessors(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "200", "--input-modalities", "image")],
                   preprocessors=2)
    yield m
    stop_cleanly(m)


def preprocessed(mesh) -> dict[str, float]:
    """Each preprocessor replica's count of requests it answered."""
    out = {}
    for name in ("preprocessor", "preprocessor-1"):
        url = f"http://127.0.0.1:{mesh.plan.metrics_ports[name]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            m = re.search(r'^meshfront_preprocessor_requests_total\{outcome="ok"\} ([0-9.e+]+)$', r.read().decode(),
                          re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


def ask(client, image: dict):
    return client.chat.completions.create(model=DEMO, max_tokens=1, messages=[
        {"role": "user", "content": [image, {"type": "text", "text": TEXT}]}])


def test_uuid_only_requests_answer_on_every_replica(two_preprocessors):
    client = sdk_client(two_preprocessors, timeout=60)
    try:
        first = ask(client, {"type": "image_url", "image_url": {"url": data_url(png(224, 224, seed=61))},
                             "uuid": "shared-61"})
        before = preprocessed(two_preprocessors)
        for _ in range(8):
            again = ask(client, {"type": "image_url", "image_url": None, "uuid": "shared-61"})
            assert again.usage.prompt_tokens == first.usage.prompt_tokens
        after = preprocessed(two_preprocessors)
    finally:
        client.close()
    # Both replicas answered uuid-only requests: the one that never saw the image found it in the shared store.
    assert all(after[name] > before[name] for name in after), (before, after)
