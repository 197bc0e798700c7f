"""The fault probe of issue 23: looping streamed load, one SIGKILL per stage kind, as `make run` runs.

`meshfront run` (services/launcher) runs the split mesh with one replica of each stage and two mocker
workers, in its own session, supervising and restarting what dies. Each round runs LOOPS concurrent
loops of streamed chat completions (bounded by ROUND_S and MAX_REQUESTS) and SIGKILLs one process
KILL_AT_S into it. The mocker runs its pseudo-random chain (``--mocker-script ''``): an answer is a
function of the prompt and seed only, so every stream's text is checked against an undisturbed run of
the same request, and a stream that migrated or waited must still be token-identical.

- router, preprocessor, worker, NATS: no request fails (requests wait for the restarted stage; a
  worker's streams migrate).
- postprocessor: no request fails either. New requests wait for the restarted one; the gateway
  resumes each stream it was decoding at the kill on the restarted one, which replays the tokens
  already answered (docs/architecture.md "Failure handling"), so those are token-identical too.
- gateway: only streams open on it at the kill fail, and each fails visibly (an error event, an HTTP
  error or a cut connection), never as a clean-looking end without ``[DONE]``.

Run with -s to see each round's figures.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import signal
import time

import httpx
import pytest

from tests.mesh.chaos_client import StreamResult, chat, stream_chat
from tests.mesh.conftest import DEMO
from tests.mesh.test_launcher_supervision import Launcher

pytestmark = [pytest.mark.mesh, pytest.mark.timeout(300)]

LOOPS = 24
TOKENS = 40
SPEEDUP = "0.5"  # ~12 ms a token: a stream lasts about half a second
BODIES = 12  # distinct requests (prompt and seed); each has one right answer
ROUND_S = 7.0  # new requests start until then; the kill is KILL_AT_S in, the rest covers the restart
KILL_AT_S = 1.5
MAX_REQUESTS = 600
# A request sent right after the kill can still be written to Envoy's pooled connection to the dead
# gateway before Envoy has read its close: it was in flight at the kill, as far as anyone can tell.
RACE_S = 0.05
FIGURES: dict[str, str] = {}


@dataclasses.dataclass
class Outcome:
    started: float
    ended: float
    body: int
    result: StreamResult | str  # a str: the exception the client saw (a cut connection)

    @property
    def ok(self) -> bool:
        r = self.result
        return isinstance(r, StreamResult) and r.status == 200 and r.done and r.error is None and r.finish == "length"

    @property
    def visible_failure(self) -> bool:
        """Failed in a way the client can tell: an exception (cut), an HTTP error or an error event."""
        r = self.result
        return isinstance(r, str) or r.status != 200 or r.error is not None

    def describe(self) -> str:
        r = self.result
        if isinstance(r, str):
            return r[:200]
        if r.status != 200:
            return f"HTTP {r.status} {r.body[:300]!r}"
        return f"done={r.done} finish={r.finish} error={r.error} text={r.text[:60]!r}"


@pytest.fixture(scope="module")
def probe(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    tmp = tmp_path_factory.mktemp("fault-probe")
    lch = Launcher(tmp, "--model-dir", str(demo_model_dir), "--model-name", DEMO, "--mocker-script", "",
                   "--speedup-ratio", SPEEDUP)
    try:
        lch.wait_healthy(2, 120)
        yield lch, asyncio.run(_reference(lch.url))
    finally:
        lch.kill_everything()


def _body(i: int) -> dict:
    return chat(DEMO, i, TOKENS)


async def _reference(url: str) -> dict[int, str]:
    """Each body's answer, undisturbed."""
    async with httpx.AsyncClient(timeout=60) as client:
        results = await asyncio.gather(*(stream_chat(client, url, _body(i)) for i in range(BODIES)))
    for r in results:
        assert r.status == 200 and r.done and r.finish == "length", r
    return {i: r.text for i, r in enumerate(results)}


async def _round(lch: Launcher, name: str) -> tuple[list[Outcome], float]:
    """LOOPS loops of streams for ROUND_S; ``name`` gets SIGKILL at KILL_AT_S. (outcomes, kill time)."""
    outcomes: list[Outcome] = []
    start = time.monotonic()
    killed_at = float("inf")
    limits = httpx.Limits(max_connections=LOOPS + 4, max_keepalive_connections=LOOPS + 4)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        async def loop(j: int) -> None:
            k = 0
            while time.monotonic() - start < ROUND_S and len(outcomes) < MAX_REQUESTS:
                i = (j + k * LOOPS) % BODIES
                k += 1
                began = time.monotonic()
                result: StreamResult | str
                try:
                    result = await stream_chat(client, lch.url, _body(i))
                except (httpx.HTTPError, OSError, ValueError) as e:
                    result = repr(e)
                outcomes.append(Outcome(began, time.monotonic(), i, result))

        async def kill() -> None:
            nonlocal killed_at
            await asyncio.sleep(KILL_AT_S)
            os.kill(lch.pids()[name], signal.SIGKILL)
            killed_at = time.monotonic()

        await asyncio.wait_for(asyncio.gather(kill(), *(loop(j) for j in range(LOOPS))), ROUND_S + 60)
    return outcomes, killed_at


def _judge(name: str, outcomes: list[Outcome], killed_at: float, reference: dict[int, str]) -> tuple[list, list]:
    """(failed outcomes, garbled ones: a 200 whose text is not the undisturbed answer); prints the figures."""
    failed = [o for o in outcomes if not o.ok]
    garbled = [o for o in outcomes if o.ok and o.result.text != reference[o.body]]  # type: ignore[union-attr]
    open_at_kill = sum(o.started < killed_at < o.ended for o in outcomes)
    FIGURES[name] = (f"{len(failed)} failed of {len(outcomes)} ({open_at_kill} open at the kill), "
                     f"{len(garbled)} garbled")
    print(f"\n{name}: SIGKILL under {LOOPS} looping streams -> {FIGURES[name]}", flush=True)
    kinds = collections.Counter((o.started < killed_at, o.describe()[:120]) for o in failed)
    for (before, what), count in kinds.most_common(6):
        print(f"  {count} started {'before' if before else 'after'} the kill: {what}", flush=True)
    return failed, garbled


@pytest.mark.parametrize("name", ["router", "preprocessor", "mocker-0", "nats", "postprocessor", "gateway-0"])
def test_a_killed_process_costs_no_request_but_its_own_streams(probe, name):
    lch, reference = probe
    lch.wait_healthy(2, 60)
    outcomes, killed_at = asyncio.run(_round(lch, name))
    failed, garbled = _judge(name, outcomes, killed_at, reference)
    assert killed_at < float("inf") and len(outcomes) >= LOOPS * 2, (len(outcomes), lch.log()[-3000:])
    assert not garbled, [o.describe() for o in garbled[:3]]
    if name == "gateway-0":
        # It held these streams' client connections: they die with it, visibly, and only they.
        assert all(o.started < killed_at + RACE_S for o in failed), \
            [(round(o.started - killed_at, 2), o.describe()) for o in failed if o.started >= killed_at + RACE_S]
        assert all(o.visible_failure for o in failed), [o.describe() for o in failed if not o.visible_failure]
    else:
        assert not failed, [(round(o.started - killed_at, 2), o.describe()) for o in failed[:5]]
    lch.wait_healthy(2, 60)  # restarted and serving again for the next round

