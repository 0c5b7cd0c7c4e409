"""Slurm actuator: drain, resume and migrate nodes with the Slurm commands every site already has.

- ``cordon``: ``scontrol update NodeName=X State=DRAIN Reason="healer: <incident> <summary>"``. A node
  an operator already drained keeps the operator's reason (healer would otherwise later lift it).
- ``uncordon``: ``State=RESUME``, only when the current reason starts with ``healer:`` and names this
  incident; an operator's drain is never lifted. A node that came back DOWN from healer's reboot
  (``nextstate=DOWN``) is resumed the same way: this is "return to service" after validation.
- ``reboot_node``: ``scontrol reboot ASAP nextstate=DOWN reason="healer: <incident> <summary>" X``:
  Slurm reboots the node once its jobs are gone (``RebootProgram``) and brings it back DOWN, so nothing
  runs on it before healer's validation; ``reboot_status`` says how far it got (requested, issued,
  complete, timed out). A node an operator drained is never rebooted.
- ``migrate``: drain, optionally signal the node's jobs to checkpoint and wait a grace period, then
  ``scontrol requeue`` each job listed by ``squeue -w X`` (concurrent migrates: one ``squeue`` for
  all their nodes, ``batching``) and lift the requeue hold with
  ``scontrol update JobId=ID StartTime=now``. Jobs that cannot be requeued are reported one by one.

A node's state is read by a narrow ``sinfo`` of the nodes asked about (``slurm_state``; ``sinfo --json``
when that cannot be read), jobs through ``squeue`` (Slurm 22.05 has no ``scontrol --json``).
Every command runs from an argument list (never a shell) with a timeout. Slurm's error texts are
classified into permanent and temporary errors in ``classify``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import structlog

from healer import config, errors
from healer.actuators import base, batching, slurm_state
from healer.actuators.slurm_state import NodeState
from healer.schemas import incidents

log = structlog.get_logger(__name__)

TEMPORARY_TEXTS = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Connection refused",
    "Zero Bytes were transmitted",
    "try again later",
    "Resource temporarily unavailable",
    "Slurm backup controller in standby mode",
)
"""Error texts that mean the controller is away or busy: worth another try."""

MAX_REASON_CHARS = 256


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str

    @property
    def error(self) -> str:
        return (self.stderr.strip() or self.stdout.strip() or f"exit status {self.rc}")[:1000]


def classify(text: str) -> type[errors.HealerError]:
    """Which error a Slurm error text is: ``TemporaryError`` for an unreachable or busy controller,
    ``PermanentError`` for everything else (invalid node name, invalid job id, missing reason, access
    denied ...)."""
    return errors.TemporaryError if any(t in text for t in TEMPORARY_TEXTS) else errors.PermanentError


def requeue_blocker(job: dict[str, Any] | None) -> str:
    """Why ``squeue --json`` says a job cannot be requeued, or ``""``."""
    if job is None:
        return ""
    if job.get("batch_flag") is False:
        return "an interactive job (srun/salloc): Slurm requeues batch jobs only"
    if job.get("requeue") is False:
        return "submitted with --no-requeue, or the cluster has JobRequeue=0"
    return ""


def _would(blocker: str) -> str:
    return f"cannot be requeued: {blocker}" if blocker else "would requeue"


def _explain(item: base.ItemResult, blocker: str) -> base.ItemResult:
    if item.status != incidents.ActionStatus.FAILED_PERMANENT or not blocker:
        return item
    return item.model_copy(update={"detail": f"{item.detail} ({blocker})"})


def reason_for(request: base.ActionRequest) -> str:
    text = f"{base.REASON_PREFIX} {request.incident_id} {request.summary}".strip()
    return " ".join(text.split())[:MAX_REASON_CHARS]


HANDLERS: Final = base.handlers("slurm")
"""What this actuator carries out, one decorated method per request (a new scheduler verb adds one)."""


class SlurmActuator:
    name = "slurm"

    def __init__(
        self,
        settings: config.ActuatorSettings | None = None,
        names: base.NodeNames | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.settings = settings or config.ActuatorSettings()
        self.names = names or base.NodeNames(self.settings.node_name_template)
        self._sleep = sleep
        self._env = dict(os.environ)
        if self.settings.slurm_conf:
            self._env["SLURM_CONF"] = self.settings.slurm_conf
        self._paths: dict[str, str] = {}
        self._pool = batching.BoundedPool(batching.SLURM_COMMANDS_AT_ONCE, "healer-slurm")
        self.batch = batching.SlurmBatch(self._run_argv, self._argv, self._read_states)
        """A burst's reads and drains, batched (#43, ``batching``)."""

    async def _read_states(self, names: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The entries of ``names`` by name (``slurm_state``: a narrow ``sinfo``, else ``sinfo --json``)."""
        return await slurm_state.read_states(
            names, self._run_argv, self._argv, lambda: self._json("sinfo", "--json"), classify
        )

    async def apply(self, request: base.ActionRequest) -> base.ActionOutcome:
        handlers = HANDLERS.bound(self)
        return await base.dispatch(self.name, self.settings, request, self.names(request.node), handlers)

    # -- reading state ------------------------------------------------------------------------------

    async def node_state(self, node: str) -> NodeState | None:
        """The node as Slurm shows it (read after the call; one read for concurrent calls, ``slurm_state``);
        ``None`` when Slurm does not know it."""
        entry = await self.batch.read(node)
        return None if entry is None else NodeState.of(entry)

    async def reboot_status(self, node: str) -> base.RebootStatus:
        """How far a reboot healer asked for has got (by healer's node name); ``NONE`` when the node
        shows none of healer's. Raises HealerError when Slurm cannot be read."""
        name = self.names(node)
        data = await self._json("sinfo", "--json")
        entry = next((e for e in data.get("nodes", []) if e.get("name") == name), None)
        if entry is None:
            raise errors.PermanentError(f"Invalid node name specified: Slurm does not know {name!r}")
        flags = {str(f) for f in entry.get("state_flags") or ()}
        reason = str(entry.get("reason") or "")
        boot = entry.get("boot_time")
        boot_time = int(boot) if isinstance(boot, int | float) else None
        if not reason.startswith(base.REASON_PREFIX):
            return base.RebootStatus(base.RebootPhase.NONE, reason, boot_time)
        if "REBOOT_ISSUED" in flags:
            phase = base.RebootPhase.ISSUED
        elif "REBOOT_REQUESTED" in flags:
            phase = base.RebootPhase.REQUESTED
        elif "reboot timed out" in reason.lower():
            phase = base.RebootPhase.TIMED_OUT
        elif str(entry.get("state", "")).lower() == "down" and reason.endswith("reboot complete"):
            phase = base.RebootPhase.COMPLETE
        else:
            phase = base.RebootPhase.NONE
        return base.RebootStatus(phase, reason, boot_time)

    async def node_labels(self, nodes: Sequence[str]) -> dict[str, dict[str, str]]:
        """Labels of ``nodes`` from one ``sinfo --json``, by healer node name: ``partition`` (the
        node's partitions, comma-separated) and ``features`` (its active features, comma-separated),
        for rules' ``match.labels`` (globs: ``{partition: "*train*"}``)."""
        data = await self._json("sinfo", "--json")
        by_name: dict[str, dict[str, str]] = {}
        for entry in data.get("nodes", []):
            features = entry.get("active_features") or entry.get("features") or ""
            by_name[str(entry.get("name"))] = {
                "partition": _csv(entry.get("partitions") or ()),
                "features": _csv(features),
            }
        return {node: by_name[self.names(node)] for node in nodes if self.names(node) in by_name}

    async def jobs_on(self, node: str) -> list[str]:
        """Ids of the jobs placed on ``node`` (pending jobs are on no node yet)."""
        job_ids, error = await self.batch.jobs(node)  # with the burst's other migrates (#43)
        if error:
            raise classify(error)(f"squeue -w {node}: {error}")
        return job_ids

    async def jobs(self) -> dict[str, dict[str, Any]]:
        """Every job ``squeue --json`` knows, by id (state, batch_flag, requeue, nodes ...)."""
        data = await self._json("squeue", "--json")
        return {str(job.get("job_id")): job for job in data.get("jobs", [])}

    # -- actions ------------------------------------------------------------------------------------

    @HANDLERS.handler("cordon")
    async def _cordon(self, node: str, request: base.ActionRequest) -> base.ActionOutcome:
        argv = self._argv(
            "scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason_for(request)}"
        )
        state = await self.node_state(node)
        if state is not None and state.drained:
            who = "healer" if state.healer_owned else "an operator"
            return base.ActionOutcome(
                status="already-done",
                detail=f"{node} already drained by {who}: {state.reason!r}",
                dry_run=request.dry_run,
            )
        if request.dry_run:
            return self._planned(f"would drain {node}", [argv])
        error = await self.batch.drain((node, reason_for(request), argv))  # with the burst's other drains
        if error:
            raise classify(error)(error)
        return base.ActionOutcome(status="done", detail=f"drained {node}", plan=[shlex.join(argv)])

    @HANDLERS.handler("uncordon")
    async def _uncordon(self, node: str, request: base.ActionRequest) -> base.ActionOutcome:
        argv = self._argv("scontrol", "update", f"NodeName={node}", "State=RESUME")
        state = await self.node_state(node)
        if state is None:
            raise errors.PermanentError(f"Invalid node name specified: Slurm does not know {node!r}")
        if not state.drained and not (state.down and state.healer_owned):
            return base.ActionOutcome(
                status="already-done",
                detail=f"{node} is not drained ({state.state})",
                dry_run=request.dry_run,
            )
        if not state.healer_owned:
            return base.ActionOutcome(
                status="refused",
                detail=f"{node} was drained by an operator ({state.reason!r}); healer leaves it drained",
                dry_run=request.dry_run,
            )
        if state.incident != request.incident_id and not request.params.get("any_incident"):
            return base.ActionOutcome(
                status="refused",
                detail=f"{node} drained by healer for incident {state.incident}, not {request.incident_id}",
                dry_run=request.dry_run,
            )
        if request.dry_run:
            return self._planned(f"would resume {node}", [argv])
        result = await self._run_argv(argv)
        if result.rc != 0:
            after = await self.node_state(node)
            if "Invalid node state" in result.error and after is not None and not after.drained:
                return base.ActionOutcome(status="already-done", detail=f"{node} is not drained")
            raise classify(result.error)(result.error)
        return base.ActionOutcome(status="done", detail=f"resumed {node}", plan=[shlex.join(argv)])

    @HANDLERS.handler("reboot_node")
    async def _reboot(self, node: str, request: base.ActionRequest) -> base.ActionOutcome:
        argv = self._argv(
            "scontrol", "reboot", "ASAP", "nextstate=DOWN", f"reason={reason_for(request)}", node
        )
        state = await self.node_state(node)
        if state is None:
            raise errors.PermanentError(f"Invalid node name specified: Slurm does not know {node!r}")
        if state.drained and not state.healer_owned:
            return base.ActionOutcome(
                status="refused",
                detail=f"{node} was drained by an operator ({state.reason!r}); healer does not reboot it",
                dry_run=request.dry_run,
            )
        if {"REBOOT_REQUESTED", "REBOOT_ISSUED"} & set(state.flags):
            return base.ActionOutcome(
                status="already-done",
                detail=f"{node} already has a reboot pending ({state.reason!r})",
                dry_run=request.dry_run,
            )
        if request.dry_run:
            return self._planned(f"would reboot {node} (ASAP, back DOWN for validation)", [argv])
        await self._checked(argv)
        return base.ActionOutcome(
            status="done",
            detail=f"reboot of {node} requested (ASAP, nextstate=DOWN)",
            plan=[shlex.join(argv)],
        )

    @HANDLERS.handler("migrate")
    async def _migrate(self, node: str, request: base.ActionRequest) -> base.ActionOutcome:
        drain = await self._cordon(node, request)
        job_ids = await self.jobs_on(node)
        signal = self.settings.slurm_checkpoint_signal
        if request.dry_run:
            plan = list(drain.plan)
            if signal and job_ids:
                plan += [
                    shlex.join(self._argv("scancel", f"--signal={signal}", "--full", j)) for j in job_ids
                ]
                plan.append(f"wait {self.settings.slurm_checkpoint_grace_s:g} s")
            for j in job_ids:
                plan.append(shlex.join(self._argv("scontrol", "requeue", j)))
                plan.append(shlex.join(self._argv("scontrol", "update", f"JobId={j}", "StartTime=now")))
            info = await self.jobs() if job_ids else {}
            items = [
                base.ItemResult(
                    item=f"job {j}", status="planned", detail=_would(requeue_blocker(info.get(j)))
                )
                for j in job_ids
            ]
            return base.ActionOutcome(
                status="planned",
                detail=f"{drain.detail}; would requeue {len(job_ids)} job(s)",
                items=items,
                plan=plan,
                dry_run=True,
            )
        plan = list(drain.plan)
        if signal and job_ids:
            for j in job_ids:
                argv = self._argv("scancel", f"--signal={signal}", "--full", j)
                plan.append(shlex.join(argv))
                result = await self._run_argv(argv)
                if result.rc != 0:
                    log.info("slurm.checkpoint_signal_failed", node=node, job_id=j, error=result.error)
            plan.append(f"wait {self.settings.slurm_checkpoint_grace_s:g} s")
            await self._sleep(self.settings.slurm_checkpoint_grace_s)
            job_ids = await self.jobs_on(node)
        items = [await self._requeue(j, plan) for j in job_ids]
        failed = [
            i
            for i in items
            if i.status == incidents.ActionStatus.FAILED_PERMANENT and "Invalid job id" in i.detail
        ]
        if failed:  # a job that vanished between squeue and requeue has ended: nothing left to move
            still_here = set(await self.jobs_on(node))
            items = [
                base.ItemResult(
                    item=i.item, status="already-done", detail=f"job ended before requeue ({i.detail})"
                )
                if i in failed and i.item.removeprefix("job ") not in still_here
                else i
                for i in items
            ]
        if any(i.status == incidents.ActionStatus.FAILED_PERMANENT for i in items):
            info = await self.jobs()
            items = [_explain(i, requeue_blocker(info.get(i.item.removeprefix("job ")))) for i in items]
        status = base.worst(items) if items else drain.status
        if status == incidents.ActionStatus.ALREADY_DONE and drain.status == incidents.ActionStatus.DONE:
            status = incidents.ActionStatus.DONE
        moved = sum(i.status in incidents.TOOK_EFFECT for i in items)
        return base.ActionOutcome(
            status=status,
            detail=f"{drain.detail}; {moved} of {len(items)} job(s) requeued",
            items=items,
            plan=plan,
        )

    async def requeue(self, job_id: str) -> base.ItemResult:
        """Requeue one job and lift its hold; never raises."""
        try:
            return await self._requeue(job_id, [])
        except errors.HealerError as e:
            return base.ItemResult(item=f"job {job_id}", status="failed-permanent", detail=str(e))

    async def _requeue(self, job_id: str, plan: list[str]) -> base.ItemResult:
        item = f"job {job_id}"
        argv = self._argv("scontrol", "requeue", job_id)
        plan.append(shlex.join(argv))
        result = await self._retried(argv)
        if result.rc != 0:
            if "is pending execution" in result.error:
                return base.ItemResult(item=item, status="already-done", detail="already pending")
            temporary = classify(result.error) is errors.TemporaryError
            status = (
                incidents.ActionStatus.FAILED_TEMPORARY
                if temporary
                else incidents.ActionStatus.FAILED_PERMANENT
            )
            return base.ItemResult(item=item, status=status, detail=result.error)
        # The requeued job sits in COMPLETING for a moment; once it is pending, lift the requeue hold.
        settle_until = time.monotonic() + self.settings.slurm_requeue_settle_s
        while time.monotonic() < settle_until:
            state = await self._run("squeue", "-h", "-o", "%T", "-j", job_id)
            if state.rc != 0 or state.stdout.strip() != "COMPLETING":
                break
            await self._sleep(0.1)
        argv = self._argv("scontrol", "update", f"JobId={job_id}", "StartTime=now")
        plan.append(shlex.join(argv))
        release = await self._run_argv(argv)
        if release.rc != 0 and "no longer pending" not in release.error:
            return base.ItemResult(item=item, status="done", detail=f"requeued; hold kept: {release.error}")
        return base.ItemResult(item=item, status="done", detail="requeued")

    # -- running commands ---------------------------------------------------------------------------

    def _planned(self, detail: str, argvs: Sequence[Sequence[str]]) -> base.ActionOutcome:
        return base.ActionOutcome(
            status="planned", detail=detail, plan=[shlex.join(a) for a in argvs], dry_run=True
        )

    def _argv(self, tool: str, *args: str) -> list[str]:
        path = self._paths.get(tool)
        if path is None:  # looked up once per tool (a PATH search per command cost ~0.3 ms of CPU, #43)
            if self.settings.slurm_bin_dir:
                path = os.path.join(self.settings.slurm_bin_dir, tool)
            else:
                path = shutil.which(tool, path=self._env.get("PATH")) or ""
            if path:  # not found: looked up again next time (and reported as not found now)
                self._paths[tool] = path
        return [path or tool, *args]

    async def _run(self, tool: str, *args: str) -> Result:
        return await self._run_argv(self._argv(tool, *args))

    async def _retried(self, argv: list[str]) -> Result:
        """Run, retrying while the error text is temporary; return the last result."""

        async def once() -> Result:
            result = await self._run_argv(argv)
            if result.rc != 0 and classify(result.error) is errors.TemporaryError:
                raise errors.TemporaryError(result.error)
            return result

        try:
            return await base.retry_policy(self.settings, None, log)(once)
        except errors.TemporaryError as e:
            return Result(tuple(argv), 1, "", str(e))

    async def _checked(self, argv: list[str]) -> Result:
        result = await self._run_argv(argv)
        if result.rc != 0:
            raise classify(result.error)(result.error)
        return result

    async def _json(self, tool: str, *args: str) -> dict[str, Any]:
        result = await self._run(tool, *args)
        if result.rc != 0:
            raise classify(result.error)(f"{tool}: {result.error}")
        try:
            data = json.loads(result.stdout)
        except ValueError as e:
            raise errors.TemporaryError(f"{tool} printed something that is not JSON: {e}") from e
        if not isinstance(data, dict):
            raise errors.TemporaryError(f"{tool} printed JSON that is not an object")
        return data

    async def _run_argv(self, argv: Sequence[str], stdin: str | None = None) -> Result:
        """Run one command in the actuator's own threads (``batching.run_command``: the event loop neither
        forks nor waits for asyncio's child-watcher thread to start, which under a burst held it for
        milliseconds per command, #43)."""
        timeout = self.settings.call_timeout_s
        try:
            rc, out, err = await self._pool.run(batching.run_command, argv, stdin, self._env, timeout)
        except FileNotFoundError as e:
            raise errors.PermanentError(
                f"{argv[0]} not found (install Slurm's client commands or set actuators.slurm_bin_dir)"
            ) from e
        except OSError as e:
            raise errors.PermanentError(f"cannot run {argv[0]}: {e}") from e
        except subprocess.TimeoutExpired as e:
            raise errors.TemporaryError(f"{shlex.join(argv)} timed out after {timeout:g} s") from e
        result = Result(tuple(argv), rc, out, err)
        log.debug("slurm.command", argv=list(argv), rc=result.rc, stderr=result.stderr.strip()[:200])
        return result


def _csv(value: Any) -> str:
    """A list or a comma-separated string (Slurm versions differ) as one comma-separated string."""
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    return ",".join(i.strip() for i in items if i.strip())
