"""Flags every media worker kind shares: how many jobs run at once and how many may wait."""

from __future__ import annotations

import argparse
import dataclasses

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
