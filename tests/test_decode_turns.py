"""The decode workers' turns (refmount.decode.turns): at most as many jobs at once as
there are workers, each free turn to a job a reader waits for, else to the one a reader
going through in order comes to first, else to the oldest."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from refmount.decode.turns import Ticket, Turns
from refmount.decode.v3.shards import ShardLayout


def test_a_free_turn_goes_to_the_job_a_reader_waits_for_then_to_the_oldest() -> None:
    order: list[str] = []

    async def main() -> None:
        turns = Turns(1)
        release = trio.Event()

        async def job(name: str, ticket: Ticket, hold: trio.Event | None = None) -> None:
            async with turns.turn(ticket):
                order.append(name)
                if hold is not None:
                    await hold.wait()

        tickets = {name: Ticket() for name in ("running", "old", "newer", "waited")}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(job, "running", tickets["running"], release)
            await trio.testing.wait_all_tasks_blocked()
            for name in ("old", "newer", "waited"):
                nursery.start_soon(job, name, tickets[name])
                await trio.testing.wait_all_tasks_blocked()
            tickets["waited"].hurry()  # a reader comes to wait for it meanwhile
            release.set()
        urgent = Ticket(urgent=True)
        async with trio.open_nursery() as nursery:  # one slot held: the urgent one next
            hold = trio.Event()
            nursery.start_soon(job, "held", Ticket(), hold)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(job, "later", Ticket())
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(job, "urgent", urgent)
            await trio.testing.wait_all_tasks_blocked()
            hold.set()

        async with trio.open_nursery() as nursery:  # asked together: by rank, not start
            for rank in (5, 1, 3, 2):
                nursery.start_soon(job, f"rank {rank}", Ticket(rank=rank))

    trio.run(main)
    assert order == [
        *("running", "waited", "old", "newer", "held", "urgent", "later"),
        *("rank 1", "rank 2", "rank 3", "rank 5"),
    ]


def test_turns_run_as_many_at_once_as_slots_and_a_cancelled_wait_loses_none() -> None:
    async def main() -> None:
        turns, running, most = Turns(2), 0, 0

        async def job() -> None:
            nonlocal running, most
            async with turns.turn(Ticket()):
                running += 1
                most = max(most, running)
                await trio.sleep(0.01)
                running -= 1

        async def held(task_status=trio.TASK_STATUS_IGNORED) -> None:
            async with turns.turn(Ticket()):
                task_status.started()
                await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(job)
        assert most == 2
        with trio.move_on_after(0.05) as waited:  # both turns held: this wait is cancelled
            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    await nursery.start(held)
                async with turns.turn(Ticket()):
                    pytest.fail("a third turn while two are held")
        assert waited.cancelled_caught
        single = Turns(1)
        async with trio.open_nursery() as nursery:  # handed the turn as it is cancelled
            scope = trio.CancelScope()
            async with single.turn(Ticket()):
                nursery.start_soon(_wait_turn, single, scope)
                await trio.testing.wait_all_tasks_blocked()
                scope.cancel()
        with trio.fail_after(5):  # every turn came back
            async with turns.turn(Ticket()), turns.turn(Ticket()), single.turn(Ticket()):
                pass

    trio.run(main)


async def _wait_turn(turns: Turns, scope: trio.CancelScope) -> None:
    with scope:
        async with turns.turn(Ticket()):
            pytest.fail("a turn taken by a cancelled wait")


def test_inner_chunks_rank_as_a_reader_in_c_order_comes_to_them() -> None:
    """Two shards side by side: the first rows of the second come before the last rows
    of the first; an edge shard's inner chunks past the grid rank as the edge's."""
    layout = ShardLayout((8, 8), end=True, checksummed=True)
    first, second = layout.ranks((0, 0), (16, 16)), layout.ranks((0, 1), (16, 16))
    assert first[:9] == [0, 1, 2, 3, 4, 5, 6, 7, 16] and second[:9] == [*range(8, 16), 24]
    assert second[0] < first[8 * 4]  # (0, 8) before (4, 0)
    edge = layout.ranks((1, 1), (12, 12))
    assert (edge[0], edge[3], edge[4], edge[-1]) == (8 * 12 + 8, 8 * 12 + 11, 8 * 12 + 11, 143)
