"""The Slurm actuator's batching pieces without a cluster (#43): ``Coalesced`` answers a whole batch in one
turn of the event loop and survives its runner's cancellation; the narrow ``sinfo`` output is read as
``sinfo --json``'s entries, or not at all when it is not exactly that."""

from __future__ import annotations

import asyncio

import pytest

from healer.actuators import batching, slurm_state


async def test_every_caller_of_a_batch_hears_its_answer_in_the_same_turn_of_the_loop() -> None:
    turn = 0
    stop = False

    async def ticker() -> None:  # counts the turns of the event loop
        nonlocal turn
        while not stop:
            turn += 1
            await asyncio.sleep(0)

    async def run(items: list[int]) -> list[int]:
        await asyncio.sleep(0.01)
        return [i * 10 for i in items]

    coalesced: batching.Coalesced[int, int] = batching.Coalesced(run)
    heard: dict[int, int] = {}

    async def call(i: int) -> None:
        assert await coalesced(i) == i * 10
        heard[i] = turn

    tick = asyncio.ensure_future(ticker())
    await asyncio.gather(*(call(i) for i in range(50)))
    stop = True
    await tick
    assert coalesced.batches == 1
    turns = max(heard.values()) - min(heard.values())
    assert turns <= 1, "the runner, then the other 49 in one turn (a lock handed on: 49 turns)"


async def test_a_cancelled_runner_leaves_the_others_to_the_next_batch() -> None:
    seen: list[list[str]] = []
    gate = asyncio.Event()

    async def run(items: list[str]) -> list[str]:
        seen.append(items)
        if len(seen) == 1:
            await gate.wait()  # the first batch hangs until its runner is cancelled
        return [i.upper() for i in items]

    coalesced: batching.Coalesced[str, str] = batching.Coalesced(run)
    first = asyncio.ensure_future(coalesced("a"))  # its caller runs the batch
    others = [asyncio.ensure_future(coalesced(x)) for x in ("b", "c")]
    await asyncio.sleep(0.01)
    assert seen == [["a", "b", "c"]]
    first.cancel()
    assert await asyncio.gather(*others) == ["B", "C"]
    assert seen[1] == ["b", "c"], "the cancelled caller's item is not run again"
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_an_error_reaches_every_caller_of_the_batch() -> None:
    async def run(items: list[int]) -> list[int]:
        raise RuntimeError("slurm away")

    coalesced: batching.Coalesced[int, int] = batching.Coalesced(run)
    results = await asyncio.gather(*(coalesced(i) for i in range(3)), return_exceptions=True)
    assert [str(r) for r in results] == ["slurm away"] * 3


def test_the_narrow_sinfo_output_reads_as_the_json_entries() -> None:
    text = (
        "gpu01|idle|none\n"
        "gpu01|idle|none\n"  # one line per partition
        "gpu02|idle+drain|healer: inc-1 a|b\n"
        "gpu03|mixed+drain+reboot_requested|ops: fan\n"
    )
    entries = slurm_state.parse(text, ["gpu01", "gpu02", "gpu03"])
    assert entries == {
        "gpu01": {"name": "gpu01", "state": "idle", "state_flags": [], "reason": ""},
        "gpu02": {"name": "gpu02", "state": "idle", "state_flags": ["DRAIN"], "reason": "healer: inc-1 a|b"},
        "gpu03": {
            "name": "gpu03", "state": "mixed", "state_flags": ["DRAIN", "REBOOT_REQUESTED"],
            "reason": "ops: fan",
        },
    }  # fmt: skip
    state = slurm_state.NodeState.of(entries["gpu02"])
    assert state.drained
    assert state.incident == "inc-1"
    for unreadable in (
        "gpu01|idle|a\nb\n",  # a reason with a line break
        "gpu01|idle|x\ngpu01|idle|y\n",  # a node whose lines disagree
        "gpu09|idle|none\n",  # a node not asked about
        "not the format\n",
    ):
        assert slurm_state.parse(unreadable, ["gpu01"]) is None, unreadable
    assert slurm_state.parse("gpu09|idle|none\n") == {
        "gpu09": {"name": "gpu09", "state": "idle", "state_flags": [], "reason": ""}
    }, "every node read (no -n): any name is taken"
