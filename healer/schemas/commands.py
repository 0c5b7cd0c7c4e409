"""Command and CommandResult: controller → agent requests on ``healer.cmd.<node>`` and their replies.

Every command carries the issuing leader's fencing token (the revision of its lease in KV) and an
expiry. The agent refuses expired commands and tokens older than the newest it has seen, so a deposed
leader's late command can never undo its successor's work.
"""

from __future__ import annotations

import enum
from typing import Annotated, Final, Literal, Self

import pydantic

from healer import actions
from healer.schemas import base, telemetry

SCHEMA: Final = "healer.command.v1"
RESULT_SCHEMA: Final = "healer.command_result.v1"


def _registered(action: str) -> str:
    if action not in actions.AGENT_COMMANDS:
        raise ValueError(f"unknown command {action!r} (known: {', '.join(actions.AGENT_COMMANDS)})")
    return action


CommandAction = Annotated[
    str, pydantic.AfterValidator(_registered), actions.EnumSchema(actions.AGENT_COMMANDS, "Action")
]
"""The node agent's commands: the registry's ``AgentCommand`` names (``actions.AGENT_COMMANDS``); what each
takes is said there, once."""


SETS_LIMIT: Final = actions.commands_where(lambda c: c.sets_limit)
"""Commands that take exactly one of ``watts`` or ``percent_of_default``. This and the sets below are
read from the registry live (``actions.View``): a command registered after import is in them."""
RECOVERY: Final = actions.commands_where(lambda c: c.recovery)
"""The recovery commands (actuators.gpu_reset): no watts, no percent."""
NEEDS_PORTS: Final = actions.commands_where(lambda c: c.ports == "required")
RESET_TIMEOUT_MAX_S: Final = 600.0
PORT_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}/[0-9]{1,3}$"
"""An RDMA port as ``<device>/<port>`` (``mlx5_0/1``, ``fabric.PortSample.name``)."""
PORTS_MAX: Final = 64


class ResultStatus(enum.StrEnum):
    """What the agent says came of a command (and of each GPU or port in it), declared once. Not an
    action's status: the actuators read it into one (``incidents.ActionStatus``)."""

    APPLIED = "applied"
    ALREADY = "already"
    """It was so already (nothing done)."""
    REFUSED = "refused"
    FAILED = "failed"

    @property
    def rank(self) -> int:
        """Worse is higher: a command's status is its worst GPU's."""
        return _RESULT_RANK[self]


_RESULT_RANK: Final = {
    ResultStatus.ALREADY: 0, ResultStatus.APPLIED: 1, ResultStatus.REFUSED: 2, ResultStatus.FAILED: 3,
}  # fmt: skip
Status = Annotated[ResultStatus, base.inline(ResultStatus, "Status")]
"""A result's status field, published as the plain list of words it was before the enum."""


class Command(base.WireModel):
    schema_: Literal["healer.command.v1"] = pydantic.Field(default=SCHEMA, alias="schema")
    id: str = pydantic.Field(min_length=1, max_length=128, description="idempotency key")
    node: str = pydantic.Field(min_length=1, max_length=253, pattern=telemetry.NODE_PATTERN)
    action: CommandAction
    gpu_index: int | None = pydantic.Field(default=None, ge=0, le=255, description="None: every GPU")
    watts: float | None = pydantic.Field(default=None, gt=0)
    percent_of_default: float | None = pydantic.Field(default=None, gt=0, le=200)
    fencing_token: int = pydantic.Field(ge=1, description="issuer's lease revision")
    issued_at: float = pydantic.Field(gt=0)
    expires_at: float = pydantic.Field(gt=0)
    issuer: str = pydantic.Field(default="controller", max_length=128)
    reason: str = pydantic.Field(default="", max_length=1024, description="incident id / why")
    holder: str = pydantic.Field(
        default="",
        max_length=128,
        description="set/restore_power_limit: who holds the limit (the incident id). The agent keeps one "
        "limit per holder and applies the lowest; a restore lifts only its holder's (empty: every holder's)",
    )
    timeout_s: float | None = pydantic.Field(
        default=None, gt=0, le=RESET_TIMEOUT_MAX_S, description="reset_gpu / validate: the most it may take"
    )
    soak_since: float | None = pydantic.Field(
        default=None, gt=0, description="validate: no XID may have arrived since this time (unix seconds)"
    )
    dcgm_level: int = pydantic.Field(
        default=0, ge=0, le=4, description="validate: dcgmi diag -r level where DCGM is installed; 0: none"
    )
    ports: list[Annotated[str, pydantic.Field(pattern=PORT_PATTERN)]] = pydantic.Field(
        default_factory=list,
        max_length=PORTS_MAX,
        description="reset_port: the RDMA ports to bounce (`mlx5_0/1`); validate: ports that must be "
        "ACTIVE and LinkUp at their expected rate, read from sysfs",
    )

    @pydantic.model_validator(mode="after")
    def _one_target(self) -> Self:
        what = actions.AGENT_COMMANDS[self.action]  # the registry says what each command takes
        if self.ports and what.ports == "none":
            raise ValueError(f"{self.action} takes no ports")
        if what.recovery:
            if self.watts is not None or self.percent_of_default is not None:
                raise ValueError(f"{self.action} takes no watts or percent_of_default")
            if what.gpu == "required" and self.gpu_index is None:
                raise ValueError(f"{self.action} needs gpu_index (one GPU at a time)")
            if what.gpu == "none" and self.gpu_index is not None:
                raise ValueError(f"{self.action} acts on the node's ports or the node: no gpu_index")
            if what.ports == "required" and not self.ports:
                raise ValueError(f"{self.action} needs ports (`mlx5_0/1`)")
            if len(set(self.ports)) != len(self.ports):
                raise ValueError("ports: each port at most once")
        elif what.sets_limit:
            if (self.watts is None) == (self.percent_of_default is None):
                raise ValueError(f"{self.action} needs exactly one of watts or percent_of_default")
        elif self.watts is not None or self.percent_of_default is not None:
            raise ValueError(f"{self.action} takes no watts or percent_of_default")
        if self.holder and what.recovery:
            raise ValueError(f"{self.action} takes no holder (only power limits are held)")
        if self.expires_at <= self.issued_at:
            raise ValueError("expires_at must be after issued_at")
        return self


class PowerChange(pydantic.BaseModel):
    """What happened to one GPU's power limit."""

    model_config = base.CONFIG

    index: int = pydantic.Field(ge=0, le=255)
    previous_w: float | None = None
    requested_w: float | None = None
    applied_w: float | None = None
    clamped: bool = False
    status: Status
    detail: str = ""


class GpuReset(pydantic.BaseModel):
    """What came of one GPU reset."""

    model_config = base.CONFIG

    index: int = pydantic.Field(ge=0, le=255)
    status: Status
    pids: list[int] = pydantic.Field(default_factory=list, max_length=1024, description="compute processes")
    duration_s: float | None = None
    detail: str = ""


class PortReset(pydantic.BaseModel):
    """What came of one port's link reset (``reset_port``): the bounce, then the port as sysfs read last."""

    model_config = base.CONFIG

    port: str = pydantic.Field(max_length=80, description="`mlx5_0/1`")
    status: Status
    link_layer: str | None = pydantic.Field(default=None, max_length=32)
    state: int | None = pydantic.Field(default=None, ge=0, le=15, description="PortState read last")
    phys_state: int | None = pydantic.Field(default=None, ge=0, le=15, description="PortPhysicalState")
    rate_gbps: float | None = pydantic.Field(default=None, ge=0)
    expected_rate_gbps: float | None = pydantic.Field(
        default=None, ge=0, description="the rate it had to come back at (its fastest same-layer peer)"
    )
    duration_s: float | None = None
    detail: str = pydantic.Field(default="", max_length=2048)


class Check(pydantic.BaseModel):
    """One validation check: what was checked, whether it passed, and why not."""

    model_config = base.CONFIG

    name: str = pydantic.Field(max_length=64)
    ok: bool
    gpu_index: int | None = pydantic.Field(default=None, ge=0, le=255)
    detail: str = pydantic.Field(default="", max_length=2048)


class Device(pydantic.BaseModel):
    """What identifies a GPU to the vendor (the evidence a hardware replacement needs)."""

    model_config = base.CONFIG

    index: int = pydantic.Field(ge=0, le=255)
    uuid: str | None = pydantic.Field(default=None, max_length=128)
    serial: str | None = pydantic.Field(default=None, max_length=64)
    board_part_number: str | None = pydantic.Field(default=None, max_length=64)
    vbios_version: str | None = pydantic.Field(default=None, max_length=64)
    driver_version: str | None = pydantic.Field(default=None, max_length=64)


class Validation(pydantic.BaseModel):
    """The agent's verdict on whether the node may return to service (``validate``)."""

    model_config = base.CONFIG

    passed: bool
    checks: list[Check] = pydantic.Field(default_factory=list, max_length=4096)
    dcgm_level: int = 0
    dcgm_ran: bool = False
    devices: list[Device] = pydantic.Field(default_factory=list, max_length=256)
    """Serial, board part number, VBIOS and driver of every GPU that answered (null: not readable)."""


class CommandResult(base.WireModel):
    schema_: Literal["healer.command_result.v1"] = pydantic.Field(default=RESULT_SCHEMA, alias="schema")
    command_id: str = pydantic.Field(max_length=128)
    node: str = pydantic.Field(max_length=253)
    status: Status
    detail: str = pydantic.Field(default="", max_length=4096)
    gpus: list[PowerChange] = pydantic.Field(default_factory=list, max_length=256)
    reset: GpuReset | None = None
    validation: Validation | None = None
    port_resets: list[PortReset] = pydantic.Field(default_factory=list, max_length=PORTS_MAX)
    """``reset_port``: one item per port, in the command's order."""
    ts: float
