"""Real media bytes for tests: PNGs and JPEGs Pillow writes, MP4s PyAV writes, and their data URLs."""

from __future__ import annotations

import base64
import io
import random

from PIL import Image


def png(width: int = 56, height: int = 56, seed: int = 0) -> bytes:
    """A PNG of random pixels: different seeds give different bytes (and content hashes)."""
    rng = random.Random(seed)
    img = Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def mp4(width: int = 64, height: int = 64, frames: int = 4, fps: int = 2, seed: int = 0) -> bytes:
    """An MPEG-4 clip whose frame i is red i * 40 % 256 (different seeds: different green, different bytes)."""
    import av

    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            color = (i * 40 % 256, (80 + seed * 50) % 256, 160)
            frame = av.VideoFrame.from_image(Image.new("RGB", (width, height), color))
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def data_url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"
