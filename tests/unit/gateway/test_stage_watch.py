"""Readiness from the stages' reachability (services/gateway/stage_watch.py), on a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from services.gateway import models_api, stage_watch
from services.gateway.stage_watch import StageWatch

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_stage_is_unavailable_only_once_unreachable_for_the_whole_grace():
    clock, down = Clock(), {"preprocessor": False, "router": False}
    watch = StageWatch({name: (lambda n=name: down[n]) for name in down}, grace_s=5, clock=clock)
    assert watch.poll() == []
    down["router"] = True
    assert watch.poll() == []  # a restart: requests wait for it, the gateway stays ready
    clock.now += 4.9
    assert watch.poll() == []
    clock.now += 0.1
    assert watch.poll() == ["router"] and watch.unavailable == ["router"]
    down["router"] = False
    assert watch.poll() == []
    down["router"] = True
    clock.now += 1
    assert watch.poll() == []  # reachable in between: the grace counts again from here


def test_a_stage_not_reached_since_the_start_is_unavailable_without_grace():
    """A gateway started before its stages (a preprocessor importing an engine takes seconds) is not ready:
    every request would wait for them, and `meshfront run` announced the mesh up while they were starting."""
    clock, down = Clock(), {"preprocessor": True, "router": False}
    watch = StageWatch({name: (lambda n=name: down[n]) for name in down}, grace_s=5, clock=clock)
    assert watch.poll() == ["preprocessor"]
    clock.now += 1
    down["preprocessor"] = False
    assert watch.poll() == []
    down["preprocessor"] = True
    assert watch.poll() == []  # reached once: from now on a restart gets the grace


def test_health_names_the_unavailable_stages_and_is_not_ready():
    models = {"m": ["card"]}
    assert models_api.health(models, unavailable=[])[0]  # type: ignore[arg-type]
    ready, body = models_api.health(models, unavailable=["preprocessor", "router"])  # type: ignore[arg-type]
    assert not ready
    assert body == {"status": "unavailable", "models": {"m": 1}, "unavailable": ["preprocessor", "router"],
                    "message": "the preprocessor and the router are unavailable"}


async def test_grpc_health_is_not_serving_while_a_stage_is_unavailable_and_serving_again_after(monkeypatch):
    monkeypatch.setattr(stage_watch, "POLL_S", 0.001)
    monkeypatch.setattr(stage_watch, "STEADY_POLL_S", 0.001)  # the router's 10 ms away below must be seen
    down = {"router": True}
    watch = StageWatch({"router": lambda: down["router"]}, grace_s=0)
    states: list[bool] = []
    may_serve = {"now": True}

    async def set_serving(serving: bool) -> None:
        states.append(serving)

    task = asyncio.create_task(watch.run(set_serving, lambda: may_serve["now"]))
    while len(states) < 3:
        await asyncio.sleep(0.001)
    assert set(states) == {False}  # asserted at every poll, so nothing else marks it serving meanwhile
    down["router"] = False
    while states[-1] is False:
        await asyncio.sleep(0.001)
    count = len(states)
    await asyncio.sleep(0.02)
    assert len(states) == count  # serving is set once, on the way back
    may_serve["now"] = False  # draining: a stage coming back must not make it serving
    down["router"] = True
    await asyncio.sleep(0.01)
    down["router"] = False
    await asyncio.sleep(0.02)
    assert states[-1] is False
    task.cancel()
