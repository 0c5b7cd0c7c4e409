"""Batching a burst's scheduler calls (#43): a thousand nodes faulting at once must not mean a thousand
``sinfo --json`` and a thousand ``scontrol`` processes, nor a thousand API calls at once.

``Coalesced`` is the one mechanism: the calls that arrive while a batch is being carried out form the next
batch, and each caller gets its own answer. A call never joins a batch that started before it (so a read
it gets was made after it asked), and a batch of one is the call on its own. The actuators keep their
contract (one request in, one outcome out): each node's outcome is still decided and recorded on its own,
with the controller's fencing, breaker and domain limits applied per node before the actuator is asked.

- Slurm (``SlurmBatch``): the state reads of concurrent actions share one ``sinfo`` of their nodes
  (``slurm_state``: a narrow one, ``sinfo --json`` as the fallback); concurrent
  drains go out as one ``scontrol`` process reading one ``update`` line per node from its standard input
  (a hostlist line, ``NodeName=a,b,c``, for nodes drained with the same reason). Slurm rejects a
  hostlist with one unknown name as a whole and reports a failed line without naming its node, so every
  node's outcome is read back from a fresh ``sinfo``: drained with its reason is done; any other
  node is drained again on its own, with its own command, which gives Slurm's own error text for that
  node only. A reason that ``scontrol``'s line parser could read differently (quotes, backslashes) is
  never put in a line: that node's drain runs on its own, as before. Nothing is done twice: a retried
  action reads the node first, and a node already drained by healer is ``already-done``. The jobs of
  concurrent migrates are listed by one ``squeue -w a,b,c`` with each job's node list (``%N``), split per
  node; when that fails, or a node list cannot be read, each node is listed by its own ``squeue -w``
  (which gives Slurm's error text for that node only). Commands run in the actuator's own threads
  (``run_command``), never blocking the event loop.
- Kubernetes (``BoundedPool``): the synchronous client's calls run in the actuator's own pool of
  ``KUBE_CONCURRENCY`` threads, so a burst's cordons go out concurrently, bounded, and never wait
  behind (or starve) the process's default executor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import subprocess
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")

KUBE_CONCURRENCY = 16
"""Kubernetes API calls one actuator has in flight at most (its own worker threads)."""
UNSAFE_IN_A_LINE = frozenset("\"'\\\n\r#")
"""Characters that ``scontrol``'s own line parser treats specially: a reason with one is never batched."""


class Coalesced(Generic[T, R]):
    """``await coalesced(item)``: ``run`` is called with every item that arrived while the batch before
    was running, and returns one answer per item, in order (an exception: every caller of the batch
    gets it).

    The caller that finds no batch running runs the next one; the others wait for the end of the batch
    running, all woken at once (not one after another through a lock, each a turn of the event loop
    later: under a burst the last of a batch's callers heard its answer dozens of turns late, #43)."""

    def __init__(self, run: Callable[[list[T]], Awaitable[list[R]]]) -> None:
        self._run = run
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._running: asyncio.Event | None = None
        """Set when the batch running ends; ``None`` when none runs."""
        self.batches = 0
        """Batches run so far (for tests and benchmarks)."""

    async def __call__(self, item: T) -> R:
        answer: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, answer))
        while not answer.done():
            if self._running is not None:
                await self._running.wait()
                continue
            self._running = running = asyncio.Event()
            try:
                await self._batch(answer)
            finally:
                self._running = None
                running.set()
        return answer.result()

    async def _batch(self, own: asyncio.Future[R]) -> None:
        """One batch, run by the caller whose answer is ``own``."""
        await asyncio.sleep(0)  # the calls made in the same turn of the loop join this batch
        batch, self._waiting = self._waiting, []
        self.batches += 1
        try:
            results = await self._run([i for i, _ in batch])
        except Exception as e:
            for _, f in batch:
                if not f.done():
                    f.set_exception(e)
                    f.exception()  # marked as seen: a caller cancelled meanwhile never reads it
        except BaseException:  # cancelled: the others' items go to the next batch
            self._waiting[:0] = [(i, f) for i, f in batch if f is not own and not f.done()]
            raise
        else:
            for (_, f), r in zip(batch, results, strict=True):
                if not f.done():
                    f.set_result(r)


def line_safe(reason: str) -> bool:
    """May ``reason`` go in an ``scontrol`` input line (between double quotes) and arrive verbatim?"""
    return not (UNSAFE_IN_A_LINE & set(reason))


def drain_script(drains: list[tuple[str, str]]) -> str:
    """``scontrol``'s input for ``(node, reason)`` pairs: one ``update`` line per reason, its nodes as a
    hostlist (every reason ``line_safe``)."""
    by_reason: dict[str, list[str]] = {}
    for node, reason in drains:
        nodes = by_reason.setdefault(reason, [])
        if node not in nodes:
            nodes.append(node)
    return "".join(
        f'update NodeName={",".join(nodes)} State=DRAIN Reason="{reason}"\n'
        for reason, nodes in by_reason.items()
    )


class Ran(Protocol):
    """A finished command: its exit status and its error text."""

    @property
    def rc(self) -> int: ...

    @property
    def stdout(self) -> str: ...

    @property
    def error(self) -> str: ...


SINGLES_AT_ONCE = 8
"""Drains run on their own (not in a line, or not done by the batch) at most this many at once."""


class SlurmBatch:
    """The Slurm actuator's shared state reads (``read``) and batched drains (``drain``): module docstring.
    ``run(argv, input)`` runs a command, ``argv(tool, *args)`` names it, ``read_nodes()`` is one
    ``sinfo --json``."""

    def __init__(
        self,
        run: Callable[[Sequence[str], str | None], Awaitable[Ran]],
        argv: Callable[..., list[str]],
        read_nodes: Callable[[Sequence[str]], Awaitable[dict[str, dict[str, Any]]]],
    ) -> None:
        self._cmd, self._argv, self._read_nodes = run, argv, read_nodes
        self.read: Coalesced[str, dict[str, Any] | None] = Coalesced(self._read_batch)
        """``await read(node)``: the node's entry (``sinfo --json``'s keys), read after the call was made;
        ``None`` when Slurm does not know the node."""
        self.drain: Coalesced[tuple[str, str, list[str]], str] = Coalesced(self.drain_all)
        """``await drain((node, reason, argv))``: ``""`` once drained with ``reason``, else Slurm's error
        text for that node (``argv``: the node's own drain command, run when the batch did not do it)."""
        self.jobs: Coalesced[str, tuple[list[str], str]] = Coalesced(self.jobs_all)
        """``await jobs(node)``: the ids of the jobs on the node, listed after the call was made, and
        ``""``; or ``[]`` and Slurm's error text for that node."""

    async def _read_batch(self, nodes: list[str]) -> list[dict[str, Any] | None]:
        entries = await self._read_nodes(nodes)
        return [entries.get(n) for n in nodes]

    async def drain_all(self, items: list[tuple[str, str, list[str]]]) -> list[str]:
        """One batch of drains, each ``(node, reason, its own argv)``: each node's error text or ``""``."""
        lined = [(node, reason) for node, reason, _ in items if line_safe(reason)]
        done: set[str] = set()
        if len(items) > 1 and len(lined) > 1:
            await self._cmd(self._argv("scontrol"), drain_script(lined))  # its text names no node: read back
            nodes = await self._read_nodes([node for node, _ in lined])
            done = {node for node, reason in lined if _drained_with(nodes.get(node), reason)}
        gate = asyncio.Semaphore(SINGLES_AT_ONCE)

        async def one(node: str, argv: list[str]) -> str:
            if node in done:
                return ""
            async with gate:
                result = await self._cmd(argv, None)
            return result.error if result.rc != 0 else ""

        return list(await asyncio.gather(*(one(node, argv) for node, _, argv in items)))

    async def jobs_all(self, nodes: list[str]) -> list[tuple[list[str], str]]:
        """Each node's ``(job ids, error text)``: one ``squeue`` for the batch's nodes, else each its own."""
        unique = list(dict.fromkeys(nodes))
        if len(unique) > 1:
            argv = self._argv("squeue", "-h", "-w", ",".join(unique), "-o", "%i|%N")
            result = await self._cmd(argv, None)
            split = jobs_by_node(result.stdout, unique) if result.rc == 0 else None
            if split is not None:
                return [(split[n], "") for n in nodes]
        gate = asyncio.Semaphore(SINGLES_AT_ONCE)

        async def one(node: str) -> tuple[list[str], str]:
            async with gate:
                result = await self._cmd(self._argv("squeue", "-w", node, "-h", "-o", "%i"), None)
            if result.rc != 0:
                return [], result.error
            return [line.strip() for line in result.stdout.splitlines() if line.strip()], ""

        answers = dict(zip(unique, await asyncio.gather(*(one(n) for n in unique)), strict=True))
        return [answers[n] for n in nodes]


def jobs_by_node(text: str, nodes: Sequence[str]) -> dict[str, list[str]] | None:
    """``squeue -h -o '%i|%N'``'s lines as each of ``nodes``' job ids, in squeue's order; None when a line
    or a node list cannot be read (the caller then asks node by node)."""
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for line in text.splitlines():
        if not line.strip():
            continue
        job, sep, hosts = line.strip().partition("|")
        try:
            names = expand_hostlist(hosts)
        except ValueError:
            return None
        if not sep or not job:
            return None
        for name in names:
            if name in out and job not in out[name]:
                out[name].append(job)
    return out


MAX_HOSTS = 65536


def expand_hostlist(expr: str) -> list[str]:
    """Slurm's compressed host list (``gpu[01-03,07],rack[1-2]-n[1-2]``) as names, as ``scontrol show
    hostnames`` gives them (zero padding kept, bracket groups of one name multiplied). Raises
    ``ValueError`` for one it cannot read."""
    names: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(expr + ","):
        depth += (ch == "[") - (ch == "]")
        if depth < 0 or depth > 1:
            raise ValueError(f"unbalanced brackets in host list {expr[:80]!r}")
        if ch == "," and depth == 0:
            part = expr[start:i].strip()
            start = i + 1
            if part:
                names.extend(_expand_name(part))
            if len(names) > MAX_HOSTS:
                raise ValueError(f"host list {expr[:80]!r} names more than {MAX_HOSTS} nodes")
    if depth:
        raise ValueError(f"unbalanced brackets in host list {expr[:80]!r}")
    return names


def _expand_name(name: str) -> list[str]:
    head, sep, rest = name.partition("[")
    if not sep:
        if "]" in name:
            raise ValueError(f"unbalanced brackets in host name {name!r}")
        return [name]
    body, sep, tail = rest.partition("]")
    if not sep:
        raise ValueError(f"unbalanced brackets in host name {name!r}")
    values: list[str] = []
    for item in body.split(","):
        lo, dash, hi = item.strip().partition("-")
        hi = hi if dash else lo
        if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo) or int(hi) - int(lo) >= MAX_HOSTS:
            raise ValueError(f"bad range {item!r} in host name {name!r}")
        values.extend(str(v).zfill(len(lo)) for v in range(int(lo), int(hi) + 1))
    return [f"{head}{v}{t}" for v in values for t in _expand_name(tail)]


def _drained_with(entry: dict[str, Any] | None, reason: str) -> bool:
    return entry is not None and "DRAIN" in (entry.get("state_flags") or ()) and entry.get("reason") == reason


SLURM_COMMANDS_AT_ONCE = 16
"""Slurm commands one actuator runs at once at most (its own worker threads, ``run_command``)."""


def run_command(
    argv: Sequence[str], stdin: str | None, env: dict[str, str], timeout_s: float
) -> tuple[int, str, str]:
    """Run ``argv`` (no shell) with ``stdin``'s text as its input: its exit status, output and error text.
    Blocking (the Slurm actuator runs it in its ``BoundedPool``). On ``timeout_s`` the command is killed
    and reaped and ``subprocess.TimeoutExpired`` raised (its pipes are not read again: a process it left
    behind holding them cannot hang the caller)."""
    with subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    ) as proc:
        try:
            out, err = proc.communicate(None if stdin is None else stdin.encode(), timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


class BoundedPool:
    """Runs synchronous calls in ``size`` worker threads of its own (``asyncio.to_thread``'s context
    handling, another executor)."""

    def __init__(self, size: int = KUBE_CONCURRENCY, name: str = "healer-actuator") -> None:
        self.size = size
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=size, thread_name_prefix=name)

    async def run(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await loop.run_in_executor(self._executor, call)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
