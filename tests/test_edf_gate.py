"""The batching replica's EDF queue (faro_serve/serving/edf_gate.py, issue 20): requests
wait while a batch runs, then go through earliest deadline first, up to the batch size in
force, together; a client that leaves does not hold the queue."""

import asyncio

import pytest

from faro_serve.serving.edf_gate import EDFGate


async def _serve(gate, deadline, log, hold):
    async with gate.slot(deadline):
        log.append(deadline)
        await hold.wait()


def test_requests_wait_for_the_batch_running_and_go_earliest_deadline_first():
    async def run():
        gate, log = EDFGate(2), []
        holds = {d: asyncio.Event() for d in (0, 5, 1, 4, 2, 3)}
        tasks = [asyncio.create_task(_serve(gate, 0, log, holds[0]))]
        await asyncio.sleep(0)
        assert log == [0] and gate.batches == [1]  # nothing else queued: a batch of one, at once
        for d in (5, 1, 4, 2, 3):  # come while it runs: they wait
            tasks.append(asyncio.create_task(_serve(gate, d, log, holds[d])))
        await asyncio.sleep(0.01)
        assert log == [0] and gate.waiting == 5
        for expect in ([1, 2], [3, 4], [5]):
            running = log[-1]
            holds[running].set()
            if running != 0:
                holds[log[-2]].set()
            await asyncio.sleep(0.01)
            assert log[-len(expect) :] == expect
        holds[5].set()
        await asyncio.gather(*tasks)
        assert gate.batches == [1, 2, 2, 1] and gate.waiting == 0

    asyncio.run(run())


def test_the_batch_size_in_force_bounds_what_goes_through_together():
    async def run():
        gate, log, hold = EDFGate(1), [], asyncio.Event()
        first = asyncio.create_task(_serve(gate, 0.0, log, hold))
        await asyncio.sleep(0)
        rest = [asyncio.create_task(_serve(gate, float(d), log, hold)) for d in range(1, 11)]
        await asyncio.sleep(0.01)
        gate.batch_size = 8  # set live (the replica's reconfigure)
        hold.set()
        await asyncio.gather(first, *rest)
        assert gate.batches == [1, 8, 2] and log == [float(d) for d in range(11)]

    asyncio.run(run())


def test_a_client_that_leaves_does_not_hold_the_queue():
    async def run():
        gate, log = EDFGate(4), []
        busy, later = asyncio.Event(), asyncio.Event()
        first = asyncio.create_task(_serve(gate, 0, log, busy))
        await asyncio.sleep(0)
        gone = asyncio.create_task(_serve(gate, 1, log, later))  # leaves while it waits
        stays = asyncio.create_task(_serve(gate, 2, log, later))
        await asyncio.sleep(0.01)
        gone.cancel()
        busy.set()
        later.set()
        await asyncio.wait_for(asyncio.gather(first, stays), 2)
        assert log == [0, 2] and gate.batches == [1, 1]
        with pytest.raises(asyncio.CancelledError):
            await gone
        # let through, then cancelled before it resumed: its place is given back
        gate.batch_size = 1
        hold_a, hold = asyncio.Event(), asyncio.Event()
        hold.set()
        a = asyncio.create_task(_serve(gate, 3, log, hold_a))
        await asyncio.sleep(0)
        b = asyncio.create_task(_serve(gate, 4, log, hold))
        c = asyncio.create_task(_serve(gate, 5, log, hold))
        await asyncio.sleep(0.01)
        hold_a.set()
        while gate.waiting == 2:  # a ends and lets b through; b has not run yet
            await asyncio.sleep(0)
        b.cancel()
        await asyncio.wait_for(asyncio.gather(a, b, c, return_exceptions=True), 2)
        assert b.cancelled() and log[-2:] == [3, 5] and gate._running == 0 and gate.waiting == 0

    asyncio.run(run())
