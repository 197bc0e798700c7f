"""The prepared check of the GPU media engines, for a session that is lent a GPU (docs/engines.md, "Media engines").

    PYTHONPATH=$PWD:$PWD/gen/python python tools/gpu_media_check.py --engine sglang-diffusion
    PYTHONPATH=$PWD:$PWD/gen/python python tools/gpu_media_check.py --engine vllm-omni

Run it with a python that has the engine (SGLang 0.5.23 with its ``diffusion`` extra; vLLM-Omni 0.30.0 beside
vLLM 0.30, an environment of its own), on a machine with a CUDA GPU. Nothing is downloaded: by default the model
is the tiny Stable Diffusion pipeline built in code (services/models/tiny_diffusion.py), which both engines
serve through their diffusers fallback (SGLang's ``backend="diffusers"``, vLLM-Omni's
``diffusion_load_format="diffusers"``); ``--model-dir`` and ``--engine-args`` run a real model instead.

Through the adapter the worker serves (``start_engine`` of services/workers/<engine>/main.py), it checks:
1. n=2 images of a non-square size: two outputs of exactly that size, different from each other;
2. the same seed again: the same pixels;
3. a cancel set once the first output's progress arrives: the second output never comes;
and prints one JSON line per check, then exits 1 if any failed (with the engine's error, if it raised).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

from services.common.discovery import MediaLimits
from services.workers.media.engine import MediaJob, Output, StepDone

# The engine's own diffusers fallback, for the tiny pipeline (no native SGLang / vLLM-Omni model class).
FALLBACK_ARGS = {"sglang-diffusion": {"backend": "diffusers", "num_gpus": 1},
                 "vllm-omni": {"diffusion_load_format": "diffusers"}}
JOB = MediaJob(kind="image", prompt="a lighthouse at dusk", negative_prompt="", width=64, height=48, n=2, steps=4,
               guidance_scale=None, seed=1234, input_image=None, mask=None, num_frames=0, fps=0.0, partial_images=0)


def run(engine, job: MediaJob, cancel_after_first_step: bool = False) -> list[Output]:
    cancelled = threading.Event()
    outputs = []
    for event in engine.generate(job, cancelled):
        if isinstance(event, StepDone) and cancel_after_first_step:
            cancelled.set()
        if isinstance(event, Output):
            outputs.append(event)
    return outputs


def checks(engine) -> list[dict]:
    results = []
    started = time.monotonic()
    first = run(engine, JOB)
    elapsed = time.monotonic() - started
    sizes = [o.frames[0].size for o in first]
    pixels = [np.asarray(o.frames[0]) for o in first]
    results.append({"check": "n=2 at 64x48", "ok": len(first) == 2 and sizes == [(64, 48)] * 2
                    and not np.array_equal(pixels[0], pixels[1]), "sizes": sizes, "seconds": round(elapsed, 2)})
    again = run(engine, JOB)
    results.append({"check": "same seed, same pixels", "ok": len(again) == 2 and all(
        np.array_equal(p, np.asarray(o.frames[0])) for p, o in zip(pixels, again, strict=True))})
    cancelled = run(engine, JOB, cancel_after_first_step=True)
    results.append({"check": "cancel after output 0", "ok": len(cancelled) <= 1, "outputs": len(cancelled)})
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", required=True, choices=sorted(FALLBACK_ARGS))
    p.add_argument("--model-dir", default="", help="a diffusers model directory (default: the tiny pipeline)")
    p.add_argument("--engine-args", default="", help="JSON keyword arguments (default: the diffusers fallback's)")
    args = p.parse_args(argv)
    model_dir = args.model_dir
    if not model_dir:
        from services.models.tiny_diffusion import build_tiny_diffusion

        # Per engine: each environment's diffusers writes (and would rebuild) its own copy.
        out = Path(__file__).resolve().parents[1] / "build" / "models" / f"tiny-diffusion-{args.engine}"
        model_dir = str(build_tiny_diffusion(out) / "text-to-image")
    engine_args = json.loads(args.engine_args) if args.engine_args else FALLBACK_ARGS[args.engine]
    main_module = importlib.import_module(f"services.workers.{args.engine.replace('-', '_')}.main")
    limits = dataclasses.replace(MediaLimits(), size_multiple=16, max_n=2)
    try:
        started = time.monotonic()
        engine = main_module.start_engine(model_dir, engine_args, limits)
        print(json.dumps({"engine": args.engine, "model_dir": model_dir, "load_s": round(time.monotonic() - started)}))
        try:
            results = checks(engine)
        finally:
            engine.close()
    except Exception as e:  # noqa: BLE001 - the check reports whatever the engine raised
        traceback.print_exc()
        print(json.dumps({"engine": args.engine, "ok": False, "error": f"{type(e).__name__}: {e}"}))
        return 1
    for result in results:
        print(json.dumps({"engine": args.engine, **result}))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
