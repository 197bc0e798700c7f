"""`meshfront run` serves the demo image and video models beside the text one (their flags, worker specs, ports)."""

from __future__ import annotations

import pytest

from services.launcher.plan import WORKER_MODULES, MeshPlan, specs
from services.launcher.run import (
    DEMO_IMAGE_MODEL_NAME,
    DEMO_VIDEO_MODEL_NAME,
    _placement,
    media_workers,
    parse_args,
)
from services.workers.mocker.config import parse_config

pytestmark = pytest.mark.unit


def test_one_image_and_one_video_simulator_by_default_each_a_valid_mocker_command_line(tmp_path):
    args = parse_args(["--speedup-ratio", "4"])
    workers = media_workers(args)
    assert [(w.kind, w.model_name) for w in workers] == [("mocker", DEMO_IMAGE_MODEL_NAME),
                                                         ("mocker", DEMO_VIDEO_MODEL_NAME)]
    plan = MeshPlan(workers=workers, worker_ports=[9503, 9504], run_dir=tmp_path)
    for i, (kind, name) in enumerate((("image", DEMO_IMAGE_MODEL_NAME), ("video", DEMO_VIDEO_MODEL_NAME))):
        [spec] = [s for s in specs(plan) if s.name == f"mocker-{i}"]
        assert spec.argv[1:3] == ["-m", WORKER_MODULES["mocker"]]
        cfg = parse_config(spec.argv[3:], env={})  # what the worker process will parse
        assert cfg.media is not None and cfg.media.kind == kind and cfg.media.speedup_ratio == 4.0
        assert cfg.worker.model_name == name and cfg.worker.model_dir == "" and cfg.worker.port == 9503 + i


def test_media_workers_can_be_scaled_or_turned_off_and_get_ports():
    args = parse_args(["--image-workers", "2", "--video-workers", "0", "--embedding-workers", "0"])
    assert [w.model_name for w in media_workers(args)] == [DEMO_IMAGE_MODEL_NAME] * 2
    assert len(_placement(args)["worker_ports"]) == 2 + 2  # the two text workers, the two image ones
    assert media_workers(parse_args(["--image-workers", "0", "--video-workers", "0"])) == []
    for flag in ("--image-workers", "--video-workers"):
        with pytest.raises(SystemExit):
            parse_args([flag, "-1"])
