"""Flags every media worker kind shares: how many jobs run at once and how many may wait."""

from __future__ import annotations

import argparse
import dataclasses

from services.common.discovery import MediaLimits
from services.common.flags import FlagParser


@dataclasses.dataclass(frozen=True)
class JobLimits:
    # Jobs the engine runs at once. One by default: a diffusion step already fills the accelerator
    # (or every core), so a second job only slows the first.
    max_running: int = 1
    # Jobs waiting for a slot; one more is refused at once as overloaded (RESOURCE_EXHAUSTED, the
    # gateway's 503 with Retry-After) instead of queueing for minutes.
    max_waiting: int = 8

    def validate(self) -> list[str]:
        errors = []
        if self.max_running < 1:
            errors.append("--max-running-jobs must be at least 1")
        if self.max_waiting < 0:
            errors.append("--max-waiting-jobs must be >= 0")
        return errors


DEFAULT_JOBS = JobLimits()


def add_job_flags(p: FlagParser) -> None:
    p.add("--max-running-jobs", default=JobLimits.max_running, type=int,
          help="media jobs the engine runs at once")
    p.add("--max-waiting-jobs", default=JobLimits.max_waiting, type=int,
          help="media jobs that may wait for a slot; more are refused as overloaded (503 at the gateway)")


def job_limits_from_args(args: argparse.Namespace) -> JobLimits:
    return JobLimits(max_running=args.max_running_jobs, max_waiting=args.max_waiting_jobs)


def limit_errors(limits: MediaLimits, video: bool, flag_prefix: str = "--") -> list[str]:
    """What is inconsistent in a media kind's limit flags (named with the kind's ``flag_prefix``: the
    mocker's are ``--media-*``, a media worker's own ``--*``), so a card never advertises a default it
    would refuse."""
    f = flag_prefix
    errors = []
    m = limits.size_multiple
    if m < 1:
        errors.append(f"{f}size-multiple must be at least 1")
    elif limits.default_width % m or limits.default_height % m:
        errors.append(f"{f}default-size must be a multiple of {f}size-multiple ({m})")
    if limits.default_width > limits.max_width or limits.default_height > limits.max_height:
        errors.append(f"{f}default-size must fit within {f}max-size")
    if limits.max_n < 1:
        errors.append(f"{f}max-n must be at least 1")
    if not 1 <= limits.default_steps <= limits.max_steps:
        errors.append(f"{f}default-steps must be between 1 and {f}max-steps")
    if video:
        if not 1 <= limits.default_frames <= limits.max_frames:
            errors.append(f"{f}default-frames must be between 1 and {f}max-frames")
        if limits.default_fps <= 0:
            errors.append(f"{f}default-fps must be positive")
        if "mp4" in limits.output_formats and (limits.default_width % 2 or limits.default_height % 2):
            errors.append(f"{f}default-size must be even for mp4 (H.264)")
    return errors


def parse_size(text: str, flag: str, errors: list[str]) -> tuple[int, int] | None:
    """``WIDTHxHEIGHT`` as (width, height); None, with the problem in ``errors``, for anything else."""
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        errors.append(f"{flag} must be WIDTHxHEIGHT, got {text!r}")
        return None
    if w <= 0 or h <= 0:
        errors.append(f"{flag} must be positive, got {text!r}")
        return None
    return w, h
