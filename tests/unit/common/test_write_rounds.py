"""Writes in rounds (services/common/write_rounds.py): every writer of one loop turn goes out after all
of them arrived, and a round never holds a writer longer than that."""

from __future__ import annotations

import asyncio

import pytest

from services.common.write_rounds import WriteRounds


async def _writers(rounds: WriteRounds, n: int, events: list[str]) -> None:
    """``n`` tasks woken by one message (one future set), each doing its work before it writes."""
    message = asyncio.get_running_loop().create_future()

    async def writer(i: int) -> None:
        await message
        events.append(f"ready {i}")
        await rounds.turn()
        events.append(f"write {i}")

    tasks = [asyncio.create_task(writer(i)) for i in range(n)]
    await asyncio.sleep(0)  # every writer waits for the message
    message.set_result(None)
    await asyncio.gather(*tasks)


def test_the_writers_woken_by_one_message_write_after_all_of_them_are_ready():
    events: list[str] = []
    asyncio.run(_writers(WriteRounds(), 8, events))
    assert events == [f"ready {i}" for i in range(8)] + [f"write {i}" for i in range(8)]


def test_a_writer_that_arrives_after_the_release_goes_in_the_next_round():
    rounds = WriteRounds()
    events: list[str] = []

    async def main() -> None:
        async def late() -> None:
            await asyncio.sleep(0)
            await asyncio.sleep(0)  # two turns later: the first round is gone by then
            await rounds.turn()
            events.append("late")

        task = asyncio.create_task(late())
        await rounds.turn()
        events.append("first")
        await asyncio.wait_for(task, 1)

    asyncio.run(main())
    assert events == ["first", "late"]


def test_a_cancelled_writer_does_not_hold_the_others():
    rounds = WriteRounds()

    async def main() -> list[str]:
        done: list[str] = []

        async def writer(name: str) -> None:
            await rounds.turn()
            done.append(name)

        gone = asyncio.create_task(writer("gone"))
        kept = asyncio.create_task(writer("kept"))
        await asyncio.sleep(0)  # both wait in the round; its release is queued behind this task
        gone.cancel()
        await asyncio.wait_for(kept, 1)
        with pytest.raises(asyncio.CancelledError):
            await gone
        return done

    assert asyncio.run(main()) == ["kept"]


def test_a_round_left_by_a_loop_that_stopped_does_not_hold_the_next_loop():
    rounds = WriteRounds()
    old = asyncio.new_event_loop()

    async def open_round_then_stop() -> None:
        asyncio.ensure_future(rounds.turn())
        await asyncio.sleep(0)  # the writer opened the round; its release is queued for the next turn
        old.stop()  # which never comes

    try:
        old.create_task(open_round_then_stop())
        old.run_forever()
    finally:
        old.close()

    async def write() -> str:
        await asyncio.wait_for(rounds.turn(), 1)
        return "written"

    assert asyncio.run(write()) == "written"
