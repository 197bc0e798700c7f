"""Videos through Envoy with the unmodified openai SDK: OpenAI jobs (create, poll, download, list, delete),
Dynamo's synchronous shape (b64_json, url, MJPEG, streamed), a job that survives the death of the gateway
running it, KServe, and bad inputs. Two gateways; the video worker is the mocker's video simulator
(`meshfront mocker --media video`: real H.264 MP4 and MJPEG bytes, one progress event per step)."""

from __future__ import annotations

import base64
import io
import json
import time

import av
import httpx
import numpy as np
import openai
import pytest

from services.launcher.plan import WorkerSpec
from tests.conftest import require_module, sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, mocker, start_mesh, wait_until

pytestmark = [pytest.mark.mesh, pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]

VIDEO = "test/video"
# Limits small enough for the CPU. A step takes 250 ms and a job (the SDK cannot ask for steps) takes 12: 3 s,
# long enough to kill its gateway in the middle; the synchronous tests ask for fewer.
SIMULATOR = ("--media", "video", "--speedup-ratio", "1", "--media-step-ms", "250", "--media-max-size", "256x256",
             "--media-default-size", "64x48", "--media-size-multiple", "16", "--media-default-steps", "12",
             "--media-max-steps", "50", "--media-default-frames", "16", "--media-max-frames", "64")


# Seeded noise: every byte incompressible, so a short video is megabytes (several 1 MiB worker chunks).
NOISE = "test/video-noise"


@pytest.fixture(scope="module")
def vmesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO),
                                      WorkerSpec(str(demo_model_dir), VIDEO, "mocker", SIMULATOR),
                                      WorkerSpec(str(demo_model_dir), NOISE, "mocker",
                                                 (*SIMULATOR, "--media-noise", "--media-max-frames", "128"))],
                   gateways=2)
    yield m
    stop_cleanly(m)


@pytest.fixture
def client(vmesh):
    c = sdk_client(vmesh, timeout=60)
    yield c
    c.close()


def decode(data: bytes) -> tuple[str, int, float, tuple[int, int]]:
    """(container, frames, fps, size) of a video, decoded with PyAV."""
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(stream)]
        return c.format.name, len(frames), float(stream.average_rate), (frames[0].shape[1], frames[0].shape[0])


def post(vmesh, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{vmesh.url}{path}", json=body, timeout=60)


# ---- OpenAI's Videos API with the SDK ---------------------------------------------------------------------

def test_create_poll_download(client):
    job = client.videos.create(model=VIDEO, prompt="a red fox", seconds="2", size="64x48")
    assert job.object == "video" and job.status in ("queued", "in_progress") and job.id.startswith("video_")
    assert job.model == VIDEO and job.seconds == "2" and job.size == "64x48" and job.expires_at > job.created_at
    seen = set()
    while (job := client.videos.retrieve(job.id)).status in ("queued", "in_progress"):
        seen.add((job.status, job.progress))
        time.sleep(0.2)
    assert job.status == "completed" and job.progress == 100 and job.completed_at >= job.created_at, job
    assert any(0 < p < 100 for _, p in seen), seen  # progress showed while it ran
    content = client.videos.download_content(job.id).read()
    fmt, frames, fps, size = decode(content)
    assert "mp4" in fmt and frames == 16 and fps == 8.0 and size == (64, 48)


def test_create_and_poll_with_an_input_reference(client):
    png = io.BytesIO()
    from PIL import Image
    Image.new("RGB", (64, 48), "blue").save(png, format="PNG")
    job = client.videos.create_and_poll(model=VIDEO, prompt="x", seconds="1", size="64x48",
                                        input_reference=("first.png", png.getvalue(), "image/png"),
                                        poll_interval_ms=200)
    assert job.status == "completed" and job.seconds == "1"
    assert decode(client.videos.download_content(job.id, variant="video").read())[1] == 8


def test_create_with_nvext_through_extra_body(client):
    """The SDK sends extra_body's nvext as the form fields nvext[num_frames] and nvext[fps] (text): read as
    the numbers they were, so the video has 9 frames at 8 fps (seconds follows: 9/8)."""
    job = client.videos.create_and_poll(model=VIDEO, prompt="a red fox", size="64x48", poll_interval_ms=200,
                                        extra_body={"nvext": {"num_frames": 9, "fps": 8, "seed": 5,
                                                              "num_inference_steps": 2}})
    assert job.status == "completed", job
    fmt, frames, fps, size = decode(client.videos.download_content(job.id).read())
    assert frames == 9 and fps == 8.0 and size == (64, 48)
    with pytest.raises(openai.BadRequestError) as e:
        client.videos.create(model=VIDEO, prompt="p", extra_body={"nvext": {"num_frames": 9, "bogus": 1}})
    assert e.value.status_code == 400 and e.value.body["param"] == "nvext.bogus", e.value.body
    assert "'nvext.bogus'" in e.value.message


def test_list_and_delete(client):
    a = client.videos.create(model=VIDEO, prompt="one", seconds="1", size="64x48")
    b = client.videos.create(model=VIDEO, prompt="two", seconds="1", size="64x48")
    ids = [v.id for v in client.videos.list(limit=100)]
    assert ids.index(b.id) < ids.index(a.id)  # newest first
    page = client.videos.list(limit=1, order="asc")
    assert len(page.data) == 1 and page.has_more
    assert [v.id for v in client.videos.list(order="asc", limit=100)][::-1][:2] == ids[:2]
    deleted = client.videos.delete(a.id)
    assert deleted.deleted and deleted.id == a.id and deleted.object == "video.deleted"
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(a.id)
    assert a.id not in [v.id for v in client.videos.list(limit=100)]
    with pytest.raises(openai.NotFoundError):
        client.videos.delete(a.id)


def test_content_of_a_job_not_done_and_variants_not_served(client):
    job = client.videos.create(model=VIDEO, prompt="slow", seconds="4", size="64x48")
    with pytest.raises(openai.BadRequestError) as e:
        client.videos.download_content(job.id)
    assert "completed" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.videos.download_content(job.id, variant="thumbnail")
    assert e.value.body["param"] == "variant"
    client.videos.delete(job.id)


# ---- a job outlives the gateway that ran it ---------------------------------------------------------------

def test_a_job_survives_the_death_of_its_gateway(vmesh, client):
    """Each gateway's log says which jobs it runs; the one running the job is SIGKILLed mid-generation, the
    other takes it over once its lease expires and re-runs it; the client polls and downloads a valid MP4."""
    job = client.videos.create(model=VIDEO, prompt="survivor", seconds="2", size="64x48")  # 12 steps: 3 s
    wait_until(lambda: client.videos.retrieve(job.id).status == "in_progress", 20, "the job to start")
    started = time.monotonic()
    owner = wait_until(lambda: next((n for n in ("gateway-0", "gateway-1")
                                     if f"video job {job.id} runs here" in vmesh.full_log(n)), None), 5,
                       "the owner's log line")
    vmesh.kill(owner)
    other = "gateway-1" if owner == "gateway-0" else "gateway-0"
    final = wait_until(lambda: (v := _retrieve_retrying(client, job.id)) and v.status not in
                       ("queued", "in_progress") and v, 60, "the job to finish elsewhere")
    assert final.status == "completed", final
    assert f"video job {job.id} taken over" in vmesh.full_log(other)
    assert time.monotonic() - started > 2  # the lease had to expire first
    fmt, frames, fps, _ = decode(client.videos.download_content(job.id).read())
    assert frames == 16 and fps == 8.0
    vmesh.restart(owner)


def _retrieve_retrying(client, video_id):
    try:
        return client.videos.retrieve(video_id)
    except (openai.APIConnectionError, openai.InternalServerError, openai.APIStatusError):
        return None  # Envoy still sending some requests to the dead gateway


# ---- Dynamo's synchronous shape ---------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/videos/generations", "/v1/videos"])
def test_sync_b64_json(vmesh, path):
    r = post(vmesh, path, {"model": VIDEO, "prompt": "p", "size": "64x48", "response_format": "b64_json",
                           "nvext": {"fps": 10, "num_frames": 12, "seed": 3, "num_inference_steps": 2}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "video" and body["status"] == "completed" and body["progress"] == 100
    assert body["model"] == VIDEO and body["inference_time_s"] > 0 and isinstance(body["created"], int)
    [item] = body["data"]
    assert item["output_format"] == "mp4" and item["fps"] == 10 and "url" not in item
    video = base64.b64decode(item["b64_json"])
    assert decode(video)[1:3] == (12, 10.0)
    again = post(vmesh, path, {"model": VIDEO, "prompt": "p", "size": "64x48", "response_format": "b64_json",
                               "nvext": {"fps": 10, "num_frames": 12, "seed": 3, "num_inference_steps": 2}})
    assert base64.b64decode(again.json()["data"][0]["b64_json"]) == video  # same seed, same bytes


def test_sync_url_through_the_other_gateway(vmesh):
    r = post(vmesh, "/v1/videos/generations", {"model": VIDEO, "prompt": "p", "seconds": 1, "size": "64x48",
                                               "nvext": {"num_inference_steps": 1}})
    assert r.status_code == 200, r.text
    [item] = r.json()["data"]
    assert "b64_json" not in item and item["url"].startswith(vmesh.url + "/v1/media/")
    for _ in range(2):  # Envoy spreads the GETs over both gateways
        got = httpx.get(item["url"], timeout=30)
        assert got.status_code == 200 and got.headers["content-type"] == "video/mp4"
        assert decode(got.content)[1] == 8


def test_a_video_of_many_chunks_is_the_same_in_b64_json_and_by_url(vmesh):
    """Megabytes: the worker's 1 MiB chunks become several HttpBody messages of base64 that join into one."""
    body = {"model": NOISE, "prompt": "p", "size": "256x256", "seconds": 14, "nvext": {"fps": 8, "seed": 11,
                                                                                     "num_inference_steps": 1}}
    b64 = post(vmesh, "/v1/videos/generations", {**body, "response_format": "b64_json"})
    assert b64.status_code == 200, b64.text[:500]
    video = base64.b64decode(b64.json()["data"][0]["b64_json"])
    assert len(video) > 2 << 20, len(video)  # three worker chunks at least
    url = post(vmesh, "/v1/videos/generations", body).json()["data"][0]["url"]
    assert httpx.get(url, timeout=60).content == video
    assert decode(video)[1:4] == (112, 8.0, (256, 256))


def test_a_job_the_worker_refuses_fails_with_its_error(client):
    job = client.videos.create_and_poll(model=VIDEO, prompt="p", seconds="1", size="64x48",
                                        input_reference=("first.png", b"not an image", "image/png"),
                                        poll_interval_ms=200)
    assert job.status == "failed" and job.error is not None and job.error.message, job
    assert job.progress < 100 and job.completed_at is None
    with pytest.raises(openai.BadRequestError):
        client.videos.download_content(job.id)


def test_sync_mjpeg(vmesh):
    r = post(vmesh, "/v1/videos/generations", {"model": VIDEO, "prompt": "p", "size": "64x48",
                                               "output_format": "mjpeg", "response_format": "b64_json",
                                               "seconds": 1, "nvext": {"fps": 6, "num_inference_steps": 1}})
    assert r.status_code == 200, r.text
    item = r.json()["data"][0]
    assert item["output_format"] == "mjpeg"
    fmt, frames, fps, size = decode(base64.b64decode(item["b64_json"]))
    assert fmt == "avi" and frames == 6 and fps == 6.0 and size == (64, 48)


def test_sync_stream_sends_progress_then_the_answer(vmesh):
    events = []
    with httpx.stream("POST", f"{vmesh.url}/v1/videos", json={
            "model": VIDEO, "prompt": "p", "size": "64x48", "stream": True, "response_format": "b64_json",
            "nvext": {"num_frames": 4, "num_inference_steps": 4}}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    events = [e[len("data: "):] for e in text.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    progress = [json.loads(e) for e in events[:-2]]
    assert [p["progress"] for p in progress] == [25, 50, 75, 99] and all(p["status"] == "in_progress"
                                                                         for p in progress)
    answer = json.loads(events[-2])
    assert answer["status"] == "completed" and decode(base64.b64decode(answer["data"][0]["b64_json"]))[1] == 4


def test_a_client_that_hangs_up_frees_the_worker(vmesh):
    """The worker runs one job at a time: once the client of a 50-step video (12.5 s) hangs up after its first
    progress event, a 1-step video must not wait for the rest of it."""
    with httpx.stream("POST", f"{vmesh.url}/v1/videos/generations", json={
            "model": VIDEO, "prompt": "p", "size": "64x48", "stream": True,
            "nvext": {"num_frames": 2, "num_inference_steps": 50}}, timeout=60) as r:
        assert r.status_code == 200
        next(r.iter_text())  # the first progress event: the worker is in its step loop
    started = time.monotonic()
    quick = post(vmesh, "/v1/videos/generations", {"model": VIDEO, "prompt": "p", "size": "64x48",
                                                   "nvext": {"num_frames": 2, "num_inference_steps": 1}})
    assert quick.status_code == 200, quick.text
    assert time.monotonic() - started < 3.0  # 1 s of cancel latency at most, one 250 ms step, encoding


# ---- bad inputs -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "param"), [
    ({"size": "640x480"}, "size"),
    ({"size": "60x48"}, "size"),
    ({"seconds": 2, "nvext": {"fps": 8, "num_frames": 9}}, "nvext.num_frames"),
    ({"nvext": {"num_frames": 65}}, "nvext.num_frames"),
    ({"nvext": {"num_inference_steps": 51}}, "nvext.num_inference_steps"),
    ({"output_format": "webm"}, "output_format"),
    ({"response_format": "file"}, "response_format"),
    ({"nvext": {"motion": 1}}, "nvext.motion"),
    ({"n": 2, "stream": False}, "n"),
])
def test_bad_sync_inputs_are_400s_naming_the_param(vmesh, body, param):
    r = post(vmesh, "/v1/videos/generations", {"model": VIDEO, "prompt": "p", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"


def test_bad_job_inputs(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.videos.create(model=VIDEO, prompt="p", seconds="12", size="64x48")  # 96 frames > 64
    assert e.value.body["param"] == "seconds"
    with pytest.raises(openai.BadRequestError) as e:
        client.videos.create(model=DEMO, prompt="p")
    assert e.value.body["param"] == "model" and "/v1/chat/completions" in e.value.message
    with pytest.raises(openai.NotFoundError):
        client.videos.create(model="nope", prompt="p")
    with pytest.raises(openai.BadRequestError) as e:
        client.videos.create(model=VIDEO, prompt="p", extra_body={"quality": "hd"})
    assert e.value.body["param"] == "quality"
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve("video_nope")
    with pytest.raises(openai.BadRequestError) as e:
        client.videos.list(limit=1000)
    assert e.value.body["param"] == "limit"


# ---- KServe -----------------------------------------------------------------------------------------------

def test_kserve_video_model(vmesh):
    require_module("tritonclient")
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    client = triton.InferenceServerClient(vmesh.grpc_target)
    meta = client.get_model_metadata(VIDEO, as_json=True)
    assert [i["name"] for i in meta["inputs"]] == ["prompt", "negative_prompt", "input_image"]
    assert [o["name"] for o in meta["outputs"]] == ["output"]
    config = client.get_model_config(VIDEO, as_json=True)["config"]
    assert not config.get("model_transaction_policy", {}).get("decoupled", False)
    prompt = triton.InferInput("prompt", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([b"a fox"], dtype=np.object_))
    result = client.infer(VIDEO, [prompt], parameters={"size": "64x48", "num_frames": 6, "fps": 3.0, "seed": 5,
                                                       "steps": 1})
    [video] = result.as_numpy("output")
    assert decode(video)[1:4] == (6, 3.0, (64, 48))
    params = result.get_response(as_json=True)["parameters"]
    assert params["content_type"]["string_param"] == "video/mp4" and int(params["seed"]["int64_param"]) == 5
    with pytest.raises(InferenceServerException) as e:
        client.infer(VIDEO, [prompt], parameters={"n": 2})
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "'n'" in e.value.message()
    # ModelStreamInfer: one response, marked final (Triton's decoupled marker); an error is its error_message.
    results: list = []
    client.start_stream(callback=lambda result, error: results.append((result, error)))
    client.async_stream_infer(VIDEO, [prompt], request_id="s1", parameters={"num_frames": 2, "steps": 1})
    client.async_stream_infer(VIDEO, [prompt], request_id="s2", parameters={"num_frames": 999})
    wait_until(lambda: len(results) == 2, 30, "both stream responses")
    client.stop_stream()
    by_id = {(r.get_response().id if r is not None else "error"): (r, err) for r, err in results}
    ok, _ = by_id["s1"]
    assert decode(ok.as_numpy("output")[0])[1] == 2
    assert ok.get_response(as_json=True)["parameters"]["triton_final_response"]["bool_param"] is True
    assert "INVALID_ARGUMENT" in str(by_id["error"][1]) and "999 frames" in str(by_id["error"][1])
    client.close()


# ---- the all-in-one gateway ------------------------------------------------------------------------------

def test_the_all_in_one_gateway_serves_videos(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO),
                                      WorkerSpec(str(demo_model_dir), VIDEO, "mocker", SIMULATOR)], inproc=True)
    c = sdk_client(m, timeout=60)
    try:
        job = c.videos.create_and_poll(model=VIDEO, prompt="p", seconds="1", size="64x48", poll_interval_ms=200)
        assert job.status == "completed" and decode(c.videos.download_content(job.id).read())[1] == 8
        r = post(m, "/v1/videos/generations", {"model": VIDEO, "prompt": "p", "size": "64x48",
                                               "nvext": {"num_frames": 3, "num_inference_steps": 1}})
        assert r.status_code == 200 and decode(httpx.get(r.json()["data"][0]["url"], timeout=30).content)[1] == 3
    finally:
        c.close()
        stop_cleanly(m)


# ---- overload and metrics (last: they leave the worker busy for a moment) ---------------------------------

async def test_a_full_worker_is_a_503_with_retry_after(vmesh):
    """The worker runs one job and queues 8 (the media glue's defaults): the tenth request at once is refused,
    and the gateway answers 503 with Retry-After instead of making it wait; the others are then abandoned."""
    import asyncio

    body = {"model": VIDEO, "prompt": "p", "size": "64x48", "response_format": "url",
            "nvext": {"num_frames": 2, "num_inference_steps": 50}}
    async with httpx.AsyncClient(base_url=vmesh.url, timeout=60) as http:
        tasks = [asyncio.create_task(http.post("/v1/videos/generations", json=body)) for _ in range(12)]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED, timeout=30)
            assert done, "no request was answered while the worker was full"
            r = done.pop().result()
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] and r.json()["error"]["type"] == "service_unavailable"
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def test_metrics_count_videos_by_endpoint(vmesh):
    text = httpx.get(f"{vmesh.url}/metrics", timeout=10).text
    for endpoint in ("videos", "videos_generations"):
        assert any(line.startswith("meshfront_gateway_requests_total{") and f'endpoint="{endpoint}"' in line
                   and f'model="{VIDEO}"' in line for line in text.splitlines()), endpoint
