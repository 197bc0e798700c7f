"""close_nats: shutdown never fails or hangs on NATS' account, and a real cancel of the caller still cancels."""

import asyncio

import pytest

from services.common.nats_connection import close_nats

pytestmark = pytest.mark.unit


class Nats:
    is_connected = True

    def __init__(self, close_raises: BaseException | None = None, hang: bool = False, stubborn: bool = False):
        self.close_raises, self.hang, self.stubborn, self.flushed = close_raises, hang, stubborn, False

    async def flush(self, timeout: float) -> None:
        self.flushed = True

    async def close(self) -> None:
        if self.stubborn:  # nats-py's close swallows a cancel while it waits for its reconnect task
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                await asyncio.sleep(4)  # and carries on (ends by itself, after the test)
        if self.hang:
            await asyncio.sleep(3600)
        if self.close_raises is not None:
            raise self.close_raises


@pytest.mark.parametrize("raises", [asyncio.CancelledError(), ConnectionResetError(), RuntimeError("closed")])
async def test_a_close_that_nats_fails_or_cancels_is_quiet(raises):
    nc = Nats(raises)
    await close_nats(nc, flush=True)  # type: ignore[arg-type]
    assert nc.flushed
    await close_nats(None)


async def test_a_close_that_never_ends_is_left_behind_after_two_seconds():
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(close_nats(Nats(stubborn=True)), 5)  # type: ignore[arg-type]
    assert loop.time() - started < 3


async def test_a_cancel_of_the_closing_task_still_cancels_it():
    task = asyncio.create_task(close_nats(Nats(hang=True)))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_retry_loop_ends_on_its_cancel_even_when_nats_swallowed_it():
    from services.common.discovery import stop_if_cancelled

    attempts = 0

    async def retrying():
        nonlocal attempts
        while True:
            try:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:  # what nats-py does in places: the cancel becomes its error
                    raise RuntimeError("nats: flush failed") from None
            except Exception:  # noqa: BLE001 - the loop under test
                attempts += 1
                stop_if_cancelled()

    task = asyncio.create_task(retrying())
    await asyncio.sleep(0.05)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    assert done and task.cancelled() and attempts == 1
