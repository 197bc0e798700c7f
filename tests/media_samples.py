"""Real media bytes for tests: PNGs and JPEGs Pillow writes, MP4s PyAV writes, WAVs the stdlib writes, MP3s PyAV
writes, and their data URLs."""

from __future__ import annotations

import base64
import io
import random
import wave

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


def wav(seconds: float, rate: int = 44100, channels: int = 2, seed: int = 0) -> bytes:
    """A 16-bit PCM WAV of a tone (different seeds: a different pitch, different bytes)."""
    import numpy as np

    n = int(seconds * rate)
    tone = (np.sin(np.arange(n) * (0.05 + 0.01 * seed)) * 8000).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.repeat(tone[:, None], channels, axis=1).tobytes())
    return out.getvalue()


def mp3(seconds: float, rate: int = 22050, seed: int = 0) -> bytes:
    """An MP3 of a tone, encoded by PyAV (FFmpeg's LAME)."""
    import av
    import numpy as np

    n = int(seconds * rate)
    tone = (np.sin(np.arange(n) * (0.05 + 0.01 * seed)) * 0.3).astype(np.float32)
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp3") as container:
        stream = container.add_stream("libmp3lame", rate=rate)
        for start in range(0, n, 1152):
            frame = av.AudioFrame.from_ndarray(tone[None, start:start + 1152], format="flt", layout="mono")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()
