"""Reading Slurm nodes' state for the Slurm actuator (#43): a narrow ``sinfo`` of the nodes asked about,
with ``sinfo --json`` of every node as the fallback.

``sinfo --json`` prints every node of the cluster with some sixty fields (about 1.4 KB a node: 14 MB at
10,000 nodes) whatever names it is given, and each state read of a burst parsed all of it. The read that
``read_states`` makes first is ``sinfo -a -h -N -n <the asked nodes> -O
NodeList:0|,StateComplete:0|,Reason:0``: one line per node and partition (``-a``: hidden partitions
too), ``gpu01|idle+drain+reboot_requested|healer: inc-1 ...``, the same three facts as the JSON's
``state``, ``state_flags`` and ``reason`` (``StateComplete`` is Slurm's ``node_state_string_complete``:
the base state, then ``+`` and each flag; ``none`` is sinfo's word for no reason, so an operator's
reason of just ``none`` reads as none). The reason is the last field, so a ``|`` in it is kept. The JSON
is read instead when the narrow output is not exactly that (a line that does not parse, a node whose
lines disagree: a reason with a line break), when an asked node is missing from it (sinfo lists only
nodes in a partition: the JSON says whether Slurm knows the node at all), or when ``sinfo`` fails with
an error that is not temporary (a temporary one is raised, and retried by the caller as before).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from healer import errors
from healer.actuators import base
from healer.actuators.batching import Ran

FORMAT = "NodeList:0|,StateComplete:0|,Reason:0"
"""``sinfo -O``: name, state with its flags, reason; ``|`` after each but the last."""
MAX_NAMES_CHARS = 100_000
"""A longer ``-n`` list (Linux takes 128 KiB in one argument) is left out: every node is read."""


@dataclasses.dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    state: str
    flags: tuple[str, ...]
    reason: str

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def healer_owned(self) -> bool:
        return self.reason.startswith(base.REASON_PREFIX)

    @property
    def incident(self) -> str:
        """The incident id in healer's reason (``healer: <id> <summary>``), or ``""``."""
        parts = self.reason.removeprefix(base.REASON_PREFIX).split(None, 1)
        return parts[0] if self.healer_owned and parts else ""

    @property
    def down(self) -> bool:
        return self.state.lower() == "down"

    @classmethod
    def of(cls, entry: dict[str, Any]) -> NodeState:
        """From a node of ``sinfo --json`` (or ``parse``, which gives the same keys)."""
        return cls(
            name=str(entry.get("name", "")),
            state=str(entry.get("state", "")),
            flags=tuple(str(f) for f in entry.get("state_flags") or ()),
            reason=str(entry.get("reason") or ""),
        )


def parse(text: str, asked: Iterable[str] | None = None) -> dict[str, dict[str, Any]] | None:
    """The narrow ``sinfo`` output as ``sinfo --json``'s node entries (``name``, ``state``,
    ``state_flags``, ``reason``) by name; ``None`` when it cannot be read for sure (module docstring).
    ``asked``: the nodes it was asked for (a line for another node is not taken)."""
    wanted = None if asked is None else set(asked)
    entries: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition("|")
        state, sep2, reason = rest.partition("|")
        if not (sep and sep2 and name and state) or (wanted is not None and name not in wanted):
            return None
        base_state, *flags = state.strip().split("+")
        entry = {
            "name": name,
            "state": base_state,
            "state_flags": [f.upper() for f in flags],
            "reason": "" if reason == "none" else reason,
        }
        if entries.setdefault(name, entry) != entry:
            return None
    return entries


async def read_states(
    names: Sequence[str],
    run: Callable[[Sequence[str], str | None], Awaitable[Ran]],
    argv: Callable[..., list[str]],
    read_all: Callable[[], Awaitable[dict[str, Any]]],
    classify: Callable[[str], type[errors.HealerError]],
) -> dict[str, dict[str, Any]]:
    """The node entries of ``names`` (by name; a node Slurm does not know is absent): the narrow read,
    else ``read_all()`` (``sinfo --json``). Raises ``TemporaryError`` when Slurm cannot be reached."""
    unique = list(dict.fromkeys(names))
    listed = ",".join(unique)
    few = bool(unique) and len(listed) <= MAX_NAMES_CHARS
    result = await run(argv("sinfo", "-a", "-h", "-N", *(("-n", listed) if few else ()), "-O", FORMAT), None)
    if result.rc != 0 and classify(result.error) is errors.TemporaryError:
        raise errors.TemporaryError(f"sinfo: {result.error}")
    entries = parse(result.stdout, unique if few else None) if result.rc == 0 else None
    if entries is None or any(n not in entries for n in unique):
        entries = {str(e.get("name")): e for e in (await read_all()).get("nodes", [])}
    return entries
