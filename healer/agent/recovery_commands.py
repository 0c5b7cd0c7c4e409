"""The agent's recovery commands (``commands.RECOVERY``), each a ``@RECOVERY.handler`` function
``(executor, command, bound log) -> result`` the ``CommandExecutor`` dispatches to once a command passed
its checks (docs in ``execution``: rules 5 to 8).

``reset_gpu`` resets one GPU only while no compute process runs on it, within the command's
``timeout_s`` (default ``RESET_TIMEOUT_S``); ``validate`` reads the runner's health view (and ``dcgmi
diag``, and the ports fresh from sysfs where the agent reads them); ``reboot_node`` is remembered and
saved before the host goes down; ``reset_port`` bounces each named port and waits for it to come back
(default ``PORT_RESET_TIMEOUT_S``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from healer import actions, errors
from healer.agent import validation
from healer.schemas import commands, telemetry

if TYPE_CHECKING:
    from healer.agent import execution

RESET_TIMEOUT_S = 120.0
"""A reset's time limit when the command names none (nvidia-smi --gpu-reset takes ~10-60 s)."""
PORT_RESET_TIMEOUT_S = 60.0
"""A port link reset's time limit, bounce and wait, when the command names none."""

RECOVERY: Final = actions.Handlers("agent", actions.AGENT_COMMANDS)
"""The recovery commands, each with its ``@RECOVERY.handler`` function ``(executor, command, bound log)
-> result``; the rest set or restore power limits (``power_limits``)."""


@RECOVERY.handler("reset_gpu")
def reset_gpu(ex: execution.CommandExecutor, cmd: commands.Command, bound: Any) -> commands.CommandResult:
    assert cmd.gpu_index is not None  # the schema requires it
    index = cmd.gpu_index
    if ex.gpu is None:
        return ex.result(
            cmd,
            commands.ResultStatus.REFUSED,
            "this agent's source cannot reset a GPU",
            [],
            remember=False,
        )
    try:
        pids = ex.gpu.compute_processes(index)
    except errors.HealerError as e:
        kind = "temporary" if isinstance(e, errors.TemporaryError) else "permanent"
        report = commands.GpuReset(index=index, status="failed", detail=f"{kind}: {e}")
        return ex.result(cmd, commands.ResultStatus.FAILED, report.detail, [], remember=False, reset=report)
    if pids:
        detail = f"compute processes still run on GPU {index}: pids {', '.join(map(str, pids))}"
        report = commands.GpuReset(index=index, status="refused", pids=pids, detail=detail)
        bound.warning("commands.reset_refused", gpu=index, pids=pids)
        return ex.result(cmd, commands.ResultStatus.REFUSED, detail, [], remember=False, reset=report)
    timeout_s = cmd.timeout_s or RESET_TIMEOUT_S
    started = ex.clock()
    try:
        message = ex.gpu.reset_gpu(index, timeout_s)
    except errors.HealerError as e:
        kind = "temporary" if isinstance(e, errors.TemporaryError) else "permanent"
        report = commands.GpuReset(
            index=index, status="failed", duration_s=ex.clock() - started, detail=f"{kind}: {e}"
        )
        bound.error("commands.reset_failed", gpu=index, error=str(e))
        return ex.result(cmd, commands.ResultStatus.FAILED, report.detail, [], remember=True, reset=report)
    if ex.originals.pop(index, None) is not None:
        message += "; the reset returned the default power limit (healer's cap is gone)"
    report = commands.GpuReset(
        index=index, status="applied", duration_s=ex.clock() - started, detail=message[:1024]
    )
    bound.warning("commands.gpu_reset", gpu=index, duration_s=report.duration_s)
    return ex.result(cmd, commands.ResultStatus.APPLIED, report.detail, [], remember=True, reset=report)


@RECOVERY.handler("validate")
def validate(ex: execution.CommandExecutor, cmd: commands.Command, bound: Any) -> commands.CommandResult:
    if ex.health is None:
        return ex.result(
            cmd,
            commands.ResultStatus.REFUSED,
            "this agent cannot validate (no health view)",
            [],
            remember=False,
        )
    health = ex.health(cmd.soak_since)
    ports = health.ports
    if ex.ports is not None:
        try:
            ports = ex.ports.read_ports()  # fresh: a port that just came back is not missed
        except OSError as e:
            bound.warning("commands.ports_unreadable", error=str(e))
    dcgm = ex.dcgm(cmd.dcgm_level, cmd.timeout_s) if cmd.dcgm_level else None
    report = validation.check(
        health.gpus, health.expected, health.events, dcgm, cmd.dcgm_level, ports=ports,
        expect_ports=cmd.ports if ports is not None else (),
    )  # fmt: skip
    report = report.model_copy(update={"devices": devices(ex, health.gpus)})
    failed = [
        f"{c.name}{'' if c.gpu_index is None else f' gpu{c.gpu_index}'}" for c in report.checks if not c.ok
    ]
    detail = "passed" if report.passed else "failed: " + ", ".join(failed)
    bound.info("commands.validated", passed=report.passed, failed=failed)
    return ex.result(cmd, commands.ResultStatus.APPLIED, detail[:4096], [], remember=True, validation=report)


@RECOVERY.handler("reboot_node")
def reboot_node(ex: execution.CommandExecutor, cmd: commands.Command, bound: Any) -> commands.CommandResult:
    if ex.reboot is None:
        detail = "this agent does not reboot its host (agent.reboot_command is unset)"
        return ex.result(cmd, commands.ResultStatus.REFUSED, detail, [], remember=False)
    busy = busy_gpus(ex, cmd)  # a lost GPU lists nothing: that is what the reboot is for
    if busy:
        detail = "compute processes still run: " + "; ".join(busy)
        return ex.result(cmd, commands.ResultStatus.REFUSED, detail, [], remember=False)
    result = ex.result(
        cmd, commands.ResultStatus.APPLIED, "reboot started", [], remember=True
    )  # saved before it goes down
    try:
        message = ex.reboot()
    except errors.HealerError as e:
        ex.recent.pop(cmd.id, None)
        bound.error("commands.reboot_failed", error=str(e))
        return ex.result(cmd, commands.ResultStatus.FAILED, f"permanent: {e}", [], remember=False)
    bound.warning("commands.rebooting", message=message)
    return result


def busy_gpus(ex: execution.CommandExecutor, cmd: commands.Command) -> list[str]:
    """The GPUs compute processes still run on (a lost GPU lists nothing)."""
    busy: list[str] = []
    if ex.gpu is not None:
        for index in ex.targets(cmd):
            try:
                pids = ex.gpu.compute_processes(index)
            except errors.HealerError:
                continue
            if pids:
                busy.append(f"GPU {index}: pids {', '.join(map(str, pids))}")
    return busy


@RECOVERY.handler("reset_port")
def reset_port(ex: execution.CommandExecutor, cmd: commands.Command, bound: Any) -> commands.CommandResult:
    if ex.ports is None:
        detail = (
            "permanent: this agent cannot reset RDMA ports (agent.rdma_ports is off, or a simulated node)"
        )
        return ex.result(cmd, commands.ResultStatus.FAILED, detail, [], remember=False)
    try:
        known = {p.name for p in ex.ports.read_ports()}
    except OSError as e:
        return ex.result(
            cmd, commands.ResultStatus.FAILED, f"temporary: ports unreadable: {e}", [], remember=False
        )
    unknown = [p for p in cmd.ports if p not in known]
    if unknown:
        listed = ", ".join(sorted(known)) or "none"
        detail = f"permanent: no such port {', '.join(unknown)} (sysfs lists {listed}); nothing was reset"
        bound.warning("commands.port_reset_unknown", ports=unknown)
        return ex.result(cmd, commands.ResultStatus.FAILED, detail[:4096], [], remember=False)
    busy = busy_gpus(ex, cmd)
    if busy:
        detail = "compute processes still run: " + "; ".join(busy)
        return ex.result(cmd, commands.ResultStatus.REFUSED, detail, [], remember=False)
    timeout_s = cmd.timeout_s or PORT_RESET_TIMEOUT_S
    started = ex.clock()
    reports: list[commands.PortReset] = []
    for name in cmd.ports:
        left = max(0.0, timeout_s - (ex.clock() - started))  # shared: the controller waits timeout_s
        reports.append(ex.ports.reset_port(name, left))
    bad = [r for r in reports if r.status is not commands.ResultStatus.APPLIED]
    status: commands.ResultStatus = commands.ResultStatus.FAILED if bad else commands.ResultStatus.APPLIED
    detail = "; ".join(r.detail for r in (bad or reports))
    if bad and not detail.startswith(("permanent:", "temporary:")):
        detail = f"permanent: {detail}"
    bound.warning("commands.ports_reset", status=status, ports=list(cmd.ports), failed=[r.port for r in bad])
    return ex.result(cmd, status, detail[:4096], [], remember=True, port_resets=reports)


def devices(ex: execution.CommandExecutor, gpus: list[telemetry.GpuSample]) -> list[commands.Device]:
    """Each answering GPU's identity, for a hardware replacement's evidence."""
    out = []
    for g in sorted(gpus, key=lambda g: g.index):
        try:
            info = ex.gpu.device_info(g.index) if ex.gpu is not None else {}
        except errors.HealerError:
            info = {}
        out.append(commands.Device(index=g.index, **{**info, "uuid": info.get("uuid") or g.uuid}))
    return out
