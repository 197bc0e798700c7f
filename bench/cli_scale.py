"""``python -m bench scale``'s command line (bench/scale.py): the parser and the runner bench/cli.py dispatches to."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
from pathlib import Path

from bench.cli_common import emit, ints, machine_line, speedup


def quota(text: str) -> tuple[str, float]:
    """``STAGE=CORES`` -> (stage, cores)."""
    from bench.scale import STAGES

    stage, _, cores = text.partition("=")
    if stage not in STAGES or not cores:
        raise argparse.ArgumentTypeError(f"expected STAGE=CORES with STAGE one of {STAGES}, got {text!r}")
    value = float(cores)
    if not 0 < value <= 64:
        raise argparse.ArgumentTypeError(f"cores must be in (0, 64], got {cores}")
    return stage, value


def add_scale_parser(sub) -> None:
    from bench.scale import KV_CASE, STAGES, ScaleConfig

    d = ScaleConfig()
    s = sub.add_parser("scale", help="each stateless stage at 1, 2 and 4 replicas, each replica in its own network "
                       "namespace under a CPU quota (a small host); needs root")
    s.add_argument("--stages", default=",".join(d.stages), help=f"comma list of {', '.join((*STAGES, KV_CASE))} "
                   f"({KV_CASE}: the router under kv routing on group-prefix prompts, cached share per replica count)")
    s.add_argument("--replicas", type=ints, default=d.replicas, help="replica counts (default 1,2,4)")
    s.add_argument("--kv-replicas", type=ints, default=d.kv_replicas, help=f"router replica counts of {KV_CASE}")
    s.add_argument("--quota", type=quota, action="append", default=[], metavar="STAGE=CORES",
                   help="CPU cores per replica of STAGE (repeatable); defaults: "
                   + ", ".join(f"{k} {v:g}" for k, v in d.quotas))
    s.add_argument("--period-us", type=int, default=d.period_us, help="the quota's scheduler period")
    s.add_argument("--concurrency", type=int, default=d.concurrency, help="closed-loop streams per replica")
    s.add_argument("--requests", type=int, default=d.requests, help="measured requests per replica and row (bounded "
                   "by --level-timeout too; router-kv rows all take this times the most --kv-replicas, and as many "
                   "streams, since the cached share depends on both)")
    s.add_argument("--level-timeout", type=float, default=d.level_timeout_s, help="seconds one row's load may take")
    s.add_argument("--settle-requests", type=int, default=d.settle_requests, help="requests after the quota is set, "
                   "before the measured window, per replica")
    s.add_argument("--max-tokens", type=int, default=d.max_tokens)
    s.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens)
    s.add_argument("--workers", type=int, default=d.workers, help="mocker workers (unthrottled)")
    s.add_argument("--speedup", type=speedup, default=d.speedup, help="mocker --speedup-ratio (over-provisioned)")
    s.add_argument("--rounds", type=int, default=d.rounds, help="every row this many times, the replica order "
                   "alternating; the goals are then judged on each case's medians")
    s.add_argument("--markdown", default="", help="append the table to this file")


def run_scale(args: argparse.Namespace, command: str) -> int:
    from bench import scale, scale_report

    stages = tuple(x.strip() for x in args.stages.split(",") if x.strip())
    known = (*scale.STAGES, scale.KV_CASE)
    bad = [x for x in stages if x not in known]
    if bad or not stages:
        raise SystemExit(f"unknown stage(s) {bad}; choose from {known}")
    d = scale.ScaleConfig()
    cfg = dataclasses.replace(
        d, stages=stages, replicas=args.replicas, kv_replicas=args.kv_replicas,
        quotas=tuple({**dict(d.quotas), **dict(args.quota)}.items()), period_us=args.period_us,
        concurrency=args.concurrency, requests=args.requests, level_timeout_s=args.level_timeout,
        settle_requests=args.settle_requests, max_tokens=args.max_tokens, prompt_tokens=args.prompt_tokens,
        workers=args.workers, speedup=args.speedup, rounds=args.rounds)
    if cfg.rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {cfg.rounds}")
    started = datetime.datetime.now().astimezone()
    emit(f"# {started:%Y-%m-%d %H:%M %Z}; {machine_line()}")
    measured = scale.run(cfg, emit)
    # Tables per round, then the medians the goals are judged on (a single round: its own rows).
    tables = [(f"round {n}", [r for r in measured if r.round == n]) for n in range(1, cfg.rounds + 1)]
    if cfg.rounds > 1:
        tables.append((f"medians of {cfg.rounds} rounds", scale_report.medians(measured)))
    judged = tables[-1][1]
    goals = scale_report.goal_lines(judged)
    text = "\n\n".join((f"{title}:\n" if cfg.rounds > 1 else "") + scale_report.text_table(rows)
                        for title, rows in tables)
    emit("\n" + text + "\n\n" + scale_report.LEGEND + "".join("\n" + g for g in goals))
    if args.markdown:
        markdown = "\n\n".join((f"{title.capitalize()}:\n\n" if cfg.rounds > 1 else "")
                                + scale_report.markdown_table(rows) for title, rows in tables)
        with Path(args.markdown).open("a") as f:
            f.write(f"\n### `{command}`\n\n{started:%Y-%m-%d %H:%M %Z}. Machine: {machine_line()}.\n"
                    f"Setting: {setting_line(cfg)}.\n\n{markdown}\n\n{scale_report.LEGEND}\n"
                    + "".join(f"\n- {g}" for g in goals) + ("\n" if goals else ""))
    return 0


def setting_line(cfg) -> str:
    return (f"{cfg.workers} mocker workers (speed-up {cfg.speedup:g}), prompts ~{cfg.prompt_tokens} words, "
            f"{cfg.max_tokens} tokens out, closed loop of {cfg.concurrency} streams and {cfg.requests} requests per "
            f"replica (at most {cfg.level_timeout_s:g} s per row), quota period {cfg.period_us} us, quotas "
            + ", ".join(f"{k} {v:g}" for k, v in cfg.quotas)
            + (f", {cfg.rounds} rounds (the replica order alternating)" if cfg.rounds > 1 else ""))
