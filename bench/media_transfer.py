"""``python -m bench media-transfer``: MB/s of a ~50 MB video through Envoy, and the memory of every process
while it passes (issue 18: no process holds more than two chunks of it at once).

A fresh mesh with one video simulator (``meshfront mocker --media video --media-noise``: seeded noise, so the
H.264 MP4 is incompressible; 1280x720 x 96 frames is ~50 MB) and no text worker. The same request (same
seed, so the same bytes) is asked for over and over; the legs:

- **b64_json**: ``POST /v1/videos/generations`` with ``response_format: b64_json`` through Envoy (Dynamo's
  synchronous shape). The body is read as it comes: the base64 after ``"b64_json":"`` is decoded and hashed
  chunk by chunk, never held. MB/s is the decoded video over the body's time (first byte to last: the
  gateway sends nothing before the worker's first chunk, and the worker sends that once the MP4 is
  encoded whole, so this is the transfer alone; the request's whole time is shown beside it).
- **url-store**: the same with ``response_format: url``: the worker's chunks go into NATS's Object Store.
  Its time is mostly generation and encoding; it is here for the memory it takes (NATS keeps the object:
  that is storage).
- **url-download**: ``GET /v1/media/{id}`` of that object through Envoy, streamed and hashed.
- **grpc-download**: the same object from the gateway's ``MediaFilesService.GetMedia`` directly (no Envoy):
  the floor.

Every download's and every decoded b64 video's SHA-256 must equal the first one's (same seed, same bytes),
so the bench also checks integrity.

Memory: a thread reads ``VmRSS`` from ``/proc/PID/status`` of every mesh process every ~20 ms, and Envoy's
own allocated bytes from its admin ``/memory``. Per leg and process: the baseline (median of the idle
samples just before the leg), the peak during it, and the difference in MiB and in 1 MiB chunks (the worker's
chunk size). ``VmHWM`` (the lifetime peak, startup included) is read at the end.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import hashlib
import http.client
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

Printer = Callable[[str], None]
MODEL = "bench/video-noise"
LEGS = ("url-store", "grpc-download", "url-download", "b64_json")  # the order they run in
CHUNK = 1 << 20  # the worker's chunk (MediaChunk: at most 1 MiB)
MIB = 1 << 20
PROMPT = "fifty megabytes of noise"
MARKER = b'"b64_json":"'
WARMUP_FRAMES = 2


@dataclasses.dataclass(frozen=True)
class TransferBenchConfig:
    legs: tuple[str, ...] = LEGS
    size: str = "1280x720"
    frames: int = 96
    fps: float = 8.0
    generations: int = 3  # b64_json requests (each generates and encodes the video: ~20 s on a busy CPU)
    downloads: int = 5  # downloads of the stored object per download leg
    step_ms: float = 1.0
    sample_ms: float = 20.0
    idle_s: float = 0.5  # baseline window before each leg
    seed: int = 7
    log_level: str = "WARNING"


# ---- pure parts ------------------------------------------------------------------------------------------

class B64Extractor:
    """Feed a JSON body's bytes as they come; get the decoded bytes of its (one) ``"b64_json":"..."`` value.

    Holds at most the bytes before the marker (a few hundred: the answer's id, model, status) and three
    base64 characters between feeds. Base64 has no escapes in JSON, so the value ends at the next quote.
    """

    def __init__(self) -> None:
        self._head = bytearray()  # before the marker (and a marker split across feeds)
        self._rest = b""  # base64 characters not yet a multiple of four
        self.started = False
        self.done = False

    def feed(self, data: bytes) -> bytes:
        if self.done:
            return b""
        if not self.started:
            self._head += data
            at = self._head.find(MARKER)
            if at < 0:
                return b""
            self.started = True
            data, self._head = bytes(self._head[at + len(MARKER):]), self._head[:at]
        end = data.find(b'"')
        if end >= 0:
            data, self.done = data[:end], True
        text = self._rest + data
        cut = len(text) if self.done else len(text) - len(text) % 4
        self._rest = text[cut:]
        try:
            return base64.b64decode(text[:cut], validate=True)
        except binascii.Error as e:
            raise ValueError(f"bad base64 in the b64_json value: {e}") from e

    @property
    def head(self) -> bytes:
        return bytes(self._head)


@dataclasses.dataclass(frozen=True)
class TransferRow:
    leg: str
    sizes: tuple[int, ...]  # bytes of each transfer
    body_s: tuple[float, ...]  # seconds from the body's first byte to its last
    total_s: tuple[float, ...]  # seconds from the request to the last byte

    @property
    def mb(self) -> float:
        return statistics.median(self.sizes) / 1e6 if self.sizes else 0.0

    def mb_per_s(self) -> list[float]:
        return sorted(n / 1e6 / s for n, s in zip(self.sizes, self.body_s, strict=True) if s > 0)


@dataclasses.dataclass(frozen=True)
class MemoryRow:
    leg: str
    process: str
    baseline: int  # bytes
    peak: int

    @property
    def delta(self) -> int:
        return max(0, self.peak - self.baseline)

    @property
    def chunks(self) -> float:
        return self.delta / CHUNK


def memory_rows(leg: str, idle: list[dict[str, int]], during: list[dict[str, int]]) -> list[MemoryRow]:
    """Per process: the median of the idle samples and the most of the samples during the leg."""
    names = [n for n in (idle[-1] if idle else {}) if any(n in s for s in during)]
    return [MemoryRow(leg, n, int(statistics.median(s[n] for s in idle if n in s)),
                      max(s[n] for s in during if n in s)) for n in names]


def _fmt_range(values: list[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return ""
    mid = fmt.format(statistics.median(values))
    return mid if len(values) == 1 else f"{mid} ({fmt.format(values[0])}-{fmt.format(values[-1])})"


def transfer_table(rows: list[TransferRow]) -> str:
    lines = ["| leg | transfers | MB | MB/s of the body, median (min-max) | body s, median | request s, median |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.leg} | {len(r.sizes)} | {r.mb:.1f} | {_fmt_range(r.mb_per_s())} | "
                     f"{statistics.median(r.body_s):.2f} | {statistics.median(r.total_s):.2f} |")
    return "\n".join(lines)


NOTES = {"mocker-0": "encodes the MP4 whole (and draws every frame first): holds the output by design",
         "nats": "holds the stored object (url-store): storage"}


def memory_table(rows: list[MemoryRow], hwm: dict[str, int]) -> str:
    lines = ["| process | leg | baseline MiB | peak MiB | peak - baseline MiB | in 1 MiB chunks | VmHWM MiB |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r.process, LEGS.index(r.leg) if r.leg in LEGS else 99)):
        peak_hwm = f"{hwm[r.process] / MIB:.1f}" if r.process in hwm else ""
        lines.append(f"| {r.process} | {r.leg} | {r.baseline / MIB:.1f} | {r.peak / MIB:.1f} | {r.delta / MIB:.1f} | "
                     f"{r.chunks:.1f} | {peak_hwm} |")
    return "\n".join(lines)


LEGEND = ("MB = 10^6 bytes; MiB and chunks = 2^20 bytes (the worker's chunk). Memory is VmRSS sampled every "
          "~20 ms (a peak between two samples can be missed), except `envoy-allocated`: Envoy's own heap "
          "(admin /memory `allocated`). VmHWM is the kernel's high-water mark, read at the end (startup included; "
          "updated lazily, it can trail the sampled peak a little). "
          + " ".join(f"{name}: {why}." for name, why in NOTES.items()))


# ---- memory sampling --------------------------------------------------------------------------------------

def read_status_kb(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(field.encode() + b":"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


class MemorySampler(threading.Thread):
    def __init__(self, pids: dict[str, int], envoy_admin_port: int | None, every_s: float):
        super().__init__(daemon=True, name="memory-sampler")
        self.pids, self.every_s = pids, every_s
        self.samples: list[dict[str, int]] = []
        self._admin = envoy_admin_port
        self._conn: http.client.HTTPConnection | None = None
        self._halt = threading.Event()

    def _envoy_allocated(self) -> int | None:
        if self._admin is None:
            return None
        try:
            if self._conn is None:
                self._conn = http.client.HTTPConnection("127.0.0.1", self._admin, timeout=2)
            self._conn.request("GET", "/memory")
            return int(orjson.loads(self._conn.getresponse().read())["allocated"])
        except (OSError, http.client.HTTPException, KeyError, ValueError):
            self._conn = None
            return None

    def run(self) -> None:
        while not self._halt.wait(self.every_s):
            sample = {name: rss for name, pid in self.pids.items() if (rss := read_status_kb(pid, "VmRSS")) is not None}
            if (allocated := self._envoy_allocated()) is not None:
                sample["envoy-allocated"] = allocated
            self.samples.append(sample)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)

    def mark(self) -> int:
        return len(self.samples)


# ---- the legs ---------------------------------------------------------------------------------------------

def _request(cfg: TransferBenchConfig, response_format: str, frames: int = 0) -> bytes:
    return orjson.dumps({"model": MODEL, "prompt": PROMPT, "size": cfg.size, "response_format": response_format,
                         "output_format": "mp4",
                         "nvext": {"fps": cfg.fps, "num_frames": frames or cfg.frames, "num_inference_steps": 1,
                                   "seed": cfg.seed}})


async def b64_once(cfg: TransferBenchConfig, port: int, frames: int = 0) -> tuple[int, str, float, float]:
    """One b64_json generation: (bytes, sha256, body seconds, request seconds)."""
    from bench.http import Connection, HttpError

    conn = Connection("127.0.0.1", port)
    extractor, digest, size = B64Extractor(), hashlib.sha256(), 0
    t0 = time.monotonic()
    first = 0.0
    try:
        async for at, payload in conn.post_stream("/v1/videos/generations", _request(cfg, "b64_json", frames)):
            first = first or at
            data = extractor.feed(payload)
            digest.update(data)
            size += len(data)
    finally:
        conn.close()
    end = time.monotonic()
    if not extractor.done or not size:
        raise HttpError(f"no whole b64_json video in the answer (head {extractor.head[:200]!r})")
    return size, digest.hexdigest(), end - first, end - t0


async def store_once(cfg: TransferBenchConfig, port: int, frames: int = 0) -> tuple[str, float]:
    """One url generation: (media id, request seconds)."""
    from bench.http import Connection, HttpError

    conn = Connection("127.0.0.1", port)
    t0 = time.monotonic()
    try:
        body = b"".join([p async for _, p in conn.post_stream("/v1/videos/generations", _request(cfg, "url", frames))])
    finally:
        conn.close()
    try:
        url = orjson.loads(body)["data"][0]["url"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise HttpError(f"no url in {body[:200]!r}") from e
    return url.rsplit("/", 1)[1], time.monotonic() - t0


async def http_download(port: int, media_id: str) -> tuple[int, str, float, float]:
    from bench.http import Connection

    conn = Connection("127.0.0.1", port)
    digest, size = hashlib.sha256(), 0
    t0 = time.monotonic()
    first = 0.0
    try:
        async for at, payload in conn.get_stream(f"/v1/media/{media_id}"):
            first = first or at
            digest.update(payload)
            size += len(payload)
    finally:
        conn.close()
    end = time.monotonic()
    return size, digest.hexdigest(), end - first, end - t0


async def grpc_download(port: int, media_id: str) -> tuple[int, str, float, float]:
    import grpc
    from meshfront.gateway.v1 import media_pb2, media_pb2_grpc

    from services.common.grpc_server import CHANNEL_OPTIONS

    digest, size = hashlib.sha256(), 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) as channel:
        await channel.channel_ready()
        stub = media_pb2_grpc.MediaFilesServiceStub(channel)
        t0 = time.monotonic()
        first = 0.0
        async for part in stub.GetMedia(media_pb2.GetMediaRequest(media_id=media_id), timeout=120):
            first = first or time.monotonic()
            digest.update(part.data)
            size += len(part.data)
        end = time.monotonic()
    return size, digest.hexdigest(), end - first, end - t0


def start_mesh(cfg: TransferBenchConfig, log_dir: Path) -> Any:
    from services.launcher.plan import ROOT, WorkerSpec, ephemeral_plan
    from services.launcher.processes import Mesh

    worker = WorkerSpec("", MODEL, "mocker", (
        "--media", "video", "--media-noise", "--speedup-ratio", "1", "--media-step-ms", str(cfg.step_ms),
        "--media-max-size", cfg.size, "--media-default-size", cfg.size, "--media-max-frames", str(cfg.frames),
        "--media-default-frames", str(cfg.frames), "--media-default-steps", "1"))
    plan = ephemeral_plan([worker], run_dir=ROOT / ".run" / "bench", log_level=cfg.log_level)
    mesh = Mesh(plan, log_dir)
    mesh.start(timeout=180)
    return mesh


class IntegrityError(AssertionError):
    """A transfer's bytes differ from the first one's (same request, same seed: they must not)."""


async def measure(cfg: TransferBenchConfig, mesh: Any, sampler: MemorySampler, emit: Printer
                  ) -> tuple[list[TransferRow], list[MemoryRow]]:
    http_port, gateway_port = mesh.plan.http_port, mesh.plan.gateway_ports[0]
    transfers: list[TransferRow] = []
    memory: list[MemoryRow] = []
    reference: list[str] = []

    def check(leg: str, digest: str) -> None:
        if reference and digest != reference[0]:
            raise IntegrityError(f"{leg}: sha256 {digest} differs from the first transfer's {reference[0]}")
        reference.append(digest)

    async def leg(name: str, count: int, one: Callable[[], Any]) -> list[Any]:
        idle_from = sampler.mark()
        await asyncio.sleep(cfg.idle_s)
        during_from = sampler.mark()
        results = []
        for _ in range(count):
            results.append(await one())
        await asyncio.sleep(3 * cfg.sample_ms / 1000)  # the last samples of the leg
        memory.extend(memory_rows(name, sampler.samples[idle_from:during_from], sampler.samples[during_from:]))
        return results

    # Warm-up: every path once with a short video, so first-use costs (imports, connections, buffers that
    # stay) fall outside the legs' baselines.
    warm_id, _ = await store_once(cfg, http_port, WARMUP_FRAMES)
    await grpc_download(gateway_port, warm_id)
    await http_download(http_port, warm_id)
    await b64_once(cfg, http_port, WARMUP_FRAMES)
    media_id = ""
    if "url-store" in cfg.legs or "url-download" in cfg.legs or "grpc-download" in cfg.legs:
        emit("# url-store: one generation stored in NATS")
        media_id, store_s = (await leg("url-store", 1, lambda: store_once(cfg, http_port)))[0]
        emit(f"  stored {media_id[:8]}... in {store_s:.1f} s (the generation's time: not in the table)")
    for name, count, one in (
            ("grpc-download", cfg.downloads, lambda: grpc_download(gateway_port, media_id)),
            ("url-download", cfg.downloads, lambda: http_download(http_port, media_id)),
            ("b64_json", cfg.generations, lambda: b64_once(cfg, http_port))):
        if name not in cfg.legs:
            continue
        emit(f"# {name}: {count} transfer(s)")
        results = await leg(name, count, one)
        for size, digest, body_s, total_s in results:
            check(name, digest)
            emit(f"  {size / 1e6:.1f} MB in {body_s:.2f} s (request {total_s:.2f} s): {size / 1e6 / body_s:.1f} MB/s")
        transfers.append(TransferRow(name, *(tuple(r[i] for r in results) for i in (0, 2, 3))))
    return transfers, memory


def run(cfg: TransferBenchConfig, emit: Printer, log_dir: Path) -> tuple[list[TransferRow], list[MemoryRow],
                                                                         dict[str, int]]:
    emit(f"# one video simulator (noise), {cfg.size} x {cfg.frames} frames at {cfg.fps:g} fps, mp4; legs "
         f"{', '.join(cfg.legs)}; {cfg.generations} b64_json generations, {cfg.downloads} downloads per download leg")
    mesh = start_mesh(cfg, log_dir)
    pids = {name: proc.pid for name, proc in mesh.procs.items()}
    sampler = MemorySampler(pids, mesh.plan.admin_port, cfg.sample_ms / 1000)
    sampler.start()
    try:
        transfers, memory = asyncio.run(measure(cfg, mesh, sampler, emit))
        hwm = {name: v for name, pid in pids.items() if (v := read_status_kb(pid, "VmHWM")) is not None}
    finally:
        sampler.stop()
        mesh.stop()
    emit(f"# {len(sampler.samples)} memory samples")
    return transfers, memory, hwm
