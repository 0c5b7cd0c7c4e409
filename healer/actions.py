"""The action kinds' registry: every action a rule or a recovery ladder may ask for is one registered
``ActionKind``, validated at load time.

This is the one list of what each action is: its parameters, which actuator runs it (power through the
node agent, cordon / drain / migrate / inspect through Kubernetes or Slurm, notify into the incident
feed), the scheduler verb it becomes, whether it takes capacity out of service (the circuit breaker
counts those), whether it has a per-node cooldown, the node agent's command that carries it out
(``AgentCommand``: what the wire command takes) and, for a recovery-ladder rung, its place, phase and
budget (``Rung``). The controller, the actuators, the agent, ``healer act`` and the demo read these facts
from here; the wire's command vocabulary (``schemas.commands.CommandAction``), the actuators' request
vocabulary (``actuators.base.RequestKind``) and the ladder's rungs (``rules.recovery.RUNGS``) are derived
from it. An actuator says which requests it carries out with a ``Handlers`` table, one decorated method
per request (kopf's registry style). A rule names actions either bare (``cordon``) or with parameters
(``power_limit: {percent_of_default: 80}``).

Adding a kind: ``register(ActionKind(...))`` (here, for one that ships) and a handler in the actuator that
runs it (docs/remediation.md, "Adding an action").

The recovery ladder's steps (``reset_gpu``, ``reset_port``, ``validate``, ``reboot_node``,
``return_to_service``, ``hardware_replacement``; healer.controller.remediation.healing) are actions of the
incident too, run through the same gates; the ``ladder_only`` ones are added by the controller, never named in
a rule.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Set
from typing import Any, Final, Literal, TypeVar

import pydantic


class _Params(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class NoParams(_Params):
    pass


class PowerLimitParams(_Params):
    """Exactly one of ``watts`` or ``percent_of_default``; the agent clamps to the GPU's min/max."""

    watts: float | None = pydantic.Field(default=None, gt=0, le=5000, description="absolute limit in W")
    percent_of_default: float | None = pydantic.Field(
        default=None, ge=10, le=100, description="limit as a percentage of the GPU's default limit"
    )

    @pydantic.model_validator(mode="after")
    def _exactly_one(self) -> PowerLimitParams:
        if (self.watts is None) == (self.percent_of_default is None):
            raise ValueError("power_limit takes exactly one of 'watts' or 'percent_of_default'")
        return self


class ReasonParams(_Params):
    reason: str | None = pydantic.Field(default=None, max_length=200, description="shown with the action")


class NotifyParams(_Params):
    message: str | None = pydantic.Field(default=None, max_length=1000, description="added to the incident")


class ResetParams(_Params):
    when_idle: bool = pydantic.Field(default=True, description="wait until no job uses the GPU")


class Actuator(enum.Enum):
    """Who carries an action out."""

    SCHEDULER = "scheduler"
    """Kubernetes or Slurm (``scheduler_verb`` says what it is asked to do)."""
    POWER = "power"
    """The node agent, over the bus."""
    GPU = "gpu"
    """The node agent's recovery commands (GPU reset, port link reset, validate), over the bus
    (actuators.gpu_reset)."""
    NONE = "none"
    """Nobody: the controller records it (notify, hardware_replacement)."""


Need = Literal["required", "optional", "none"]


@dataclasses.dataclass(frozen=True, slots=True)
class AgentCommand:
    """The node agent's command that carries a kind out (``schemas.commands.Command.action``) and what the
    wire command takes with it (``Command`` checks these)."""

    name: str
    gpu: Need = "optional"
    """``gpu_index``: required (one GPU at a time), optional (None: every GPU) or none (the node, its
    ports)."""
    ports: Need = "none"
    """``ports`` (``mlx5_0/1``): required (the ports to bounce), optional (ports to check) or none."""
    sets_limit: bool = False
    """Takes exactly one of ``watts`` or ``percent_of_default``."""
    recovery: bool = False
    """A recovery command (actuators.gpu_reset): no watts, no percent, no holder."""
    timeout: str | None = None
    """The ``ActuatorSettings`` field bounding how long it may take on the node (None: no bound)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Rung:
    """A recovery ladder's rung (healer.controller.remediation.ladder): tried in ``order``, smallest hammer
    first, each followed by validation."""

    order: int
    phase: str
    """The ladder's ``Phase`` (by name) while the rung runs."""
    budget_s: float
    """How long it may take, from the request to its outcome; past it the rung counts as failed."""


@dataclasses.dataclass(frozen=True, slots=True)
class ActionKind:
    name: str
    params: type[_Params]
    description: str
    reversible_by: str | None = None
    """The action that undoes it (for the 'no way to resolve' lint)."""
    actuator: Actuator = Actuator.NONE
    scheduler_verb: str | None = None
    """The scheduler actuator's action: ``drain`` is a cordon that lets running work finish (Slurm DRAIN
    semantics); ``inspect`` is a cordon whose reason asks for hardware inspection."""
    takes_out_of_service: bool = False
    """Takes the node's capacity away: counted by the circuit breaker, and holds the node cordoned (an
    uncordon of another incident waits for it)."""
    per_node_cooldown: bool = False
    """Another incident's action of this kind on the same node waits ``action_cooldown_s`` (no cap /
    restore flapping). Cordon-like actions have none: they are idempotent and must never wait."""
    ladder_only: bool = False
    """A recovery-ladder step the controller adds to an incident; no rule may ask for it."""
    per_gpu: bool = False
    """Acts on one GPU: in a node-wide incident (``node_wide:``) it is planned once for each GPU that
    fired, and its on_resolve counterpart runs for each GPU as that GPU's firing resolves."""
    published_only: bool = False
    """Needs no actuator: recording and publishing it on the incident is the whole action (notify)."""
    per_port: bool = False
    """Acts on RDMA ports of the node: the incident's own port (``mlx5_0/1``) and those of the incidents
    following its ladder, passed to the actuator as the ``ports`` parameter."""
    runs_in_ladder_only: bool = False
    """Carried out only as a recovery-ladder step; named in a rule it is recorded as skipped (GPU reset)."""
    undoes_cordon: bool = False
    """Lifts a cordon: only healer's own, and only while no other open incident holds the node."""
    reboots: bool = False
    """Reboots the node: at most ``max_concurrent_reboots`` at once."""
    held_by_shared_cause: bool = False
    """A repair that presumes the node itself is broken (GPU reset, port link reset, reboot, hardware
    replacement): while
    a shared-cause incident suspects the node's failure domain (a leaf switch, a PDU) it waits, and a
    member that recovers on its own is returned without it (#27). Containment (cordon, drain, migrate,
    notify) is safe and never held."""
    agent_command: AgentCommand | None = None
    """The node agent's command that carries it out: the power and GPU actuators send it; ``reboot_node``
    has one for the nodes the scheduler cannot reboot (Kubernetes)."""
    rung: Rung | None = None
    """Its place in a recovery ladder's ``steps`` (reset_gpu, reset_port, reboot_node)."""
    drains: bool = False
    """Lets running work finish or requeues it (Slurm DRAIN, eviction): the node reads ``drained``, not
    ``cordoned``."""
    reads_identity: bool = False
    """Its outcome carries the GPU's identity as the agent read it (serial, VBIOS, driver): the
    hardware_replacement evidence bundle takes the newest."""
    caps_power: bool = False
    """Lowers the GPU's power limit: an incident still open ``power_cap_escalate_s`` after it took effect
    gets a cordon (``decide.ladder_step``)."""
    stronger: Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, Any]] | None = None
    """Two joined rules asking for this kind with different parameters: the stronger of the two (None:
    the first, a missing parameter filled from the other)."""


def _lower_limit(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """A power cap: the lower limit (a limit in watts and one in percent cannot be compared without the
    GPU's default: the first stays)."""
    for unit in ("watts", "percent_of_default"):
        if current.get(unit) is not None and wanted.get(unit) is not None:
            return {unit: min(current[unit], wanted[unit])}
    return dict(current)


def _sooner_reset(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """A GPU reset: at once rather than when idle."""
    return {"when_idle": bool(current.get("when_idle", True)) and bool(wanted.get("when_idle", True))}


RESET_BUDGET_S: Final = 180.0
"""How long a GPU reset may take, from the command to the agent's answer (nvidia-smi needs ~10-60 s)."""
PORT_RESET_BUDGET_S: Final = 900.0
"""How long a port link reset may take, from the command to the agent's answer (the bounce, training and
the subnet manager's ACTIVE: seconds to a minute; the agent's own limit, ``port_reset_timeout_s``, is
at most 600 s)."""
REBOOT_BUDGET_S: Final = 1800.0
"""How long a node reboot may take, from the scheduler's reboot to the node answering again."""

_SCHEDULER = Actuator.SCHEDULER
_BUILT_IN: Final = (
        ActionKind(
            "power_limit", PowerLimitParams, "lower the GPU's power limit", "restore_power_limit",
            actuator=Actuator.POWER, per_node_cooldown=True, per_gpu=True, stronger=_lower_limit,
            agent_command=AgentCommand("set_power_limit", sets_limit=True), caps_power=True,
        ),
        ActionKind(
            "restore_power_limit", NoParams, "put back the power limit healer changed",
            actuator=Actuator.POWER, per_gpu=True, agent_command=AgentCommand("restore_power_limit"),
        ),
        ActionKind(
            "cordon", ReasonParams, "stop new work landing on the node", "uncordon",
            actuator=_SCHEDULER, scheduler_verb="cordon", takes_out_of_service=True,
        ),
        ActionKind(
            "uncordon", NoParams, "lift a cordon healer itself set (never an operator's)",
            actuator=_SCHEDULER, scheduler_verb="uncordon", undoes_cordon=True,
        ),
        ActionKind(
            "drain", ReasonParams, "cordon, and let running work finish or be requeued", "uncordon",
            actuator=_SCHEDULER, scheduler_verb="cordon", takes_out_of_service=True, drains=True,
        ),
        ActionKind(
            "migrate", NoParams, "evict pods (honouring PDBs) / requeue Slurm jobs elsewhere",
            actuator=_SCHEDULER, scheduler_verb="migrate", takes_out_of_service=True, drains=True,
        ),
        ActionKind(
            "notify", NotifyParams, "incident only: record and publish, act on nothing", published_only=True
        ),
        ActionKind(
            "reset_gpu", ResetParams,
            "reset the GPU once idle (a recovery-ladder step; named in a rule it is only recorded)",
            actuator=Actuator.GPU, per_gpu=True, runs_in_ladder_only=True, stronger=_sooner_reset,
            held_by_shared_cause=True,
            agent_command=AgentCommand(
                "reset_gpu", gpu="required", recovery=True, timeout="gpu_reset_timeout_s"
            ),
            rung=Rung(0, "RESETTING", RESET_BUDGET_S),
        ),
        ActionKind(
            "inspect", ReasonParams, "flag the GPU or node for hardware inspection (RMA candidate)",
            actuator=_SCHEDULER, scheduler_verb="cordon", takes_out_of_service=True,
        ),
        ActionKind(
            "validate", NoParams, "check the GPUs after a reset or reboot (soak, DBE, remaps, dcgmi diag)",
            actuator=Actuator.GPU, ladder_only=True, reads_identity=True,
            agent_command=AgentCommand(
                "validate", ports="optional", recovery=True, timeout="validate_timeout_s"
            ),
        ),
        ActionKind(
            "reset_port", NoParams,
            "bounce the incident's RDMA port's link and wait for it to be ACTIVE (a recovery-ladder step)",
            actuator=Actuator.GPU, ladder_only=True, per_port=True, held_by_shared_cause=True,
            agent_command=AgentCommand(
                "reset_port", gpu="none", ports="required", recovery=True, timeout="port_reset_timeout_s"
            ),
            rung=Rung(1, "PORT_RESETTING", PORT_RESET_BUDGET_S),
        ),
        ActionKind(
            "reboot_node", NoParams, "reboot the node through the scheduler (Slurm scontrol reboot)",
            actuator=_SCHEDULER, scheduler_verb="reboot_node", takes_out_of_service=True,
            ladder_only=True, reboots=True, held_by_shared_cause=True,
            agent_command=AgentCommand("reboot_node", gpu="none", recovery=True),
            rung=Rung(2, "REBOOTING", REBOOT_BUDGET_S),
        ),
        ActionKind(
            "return_to_service", NoParams, "lift healer's own cordon once validation passed",
            actuator=_SCHEDULER, scheduler_verb="uncordon", ladder_only=True, undoes_cordon=True,
        ),
        ActionKind(
            "hardware_replacement", ReasonParams, "the node stays out until its GPU is replaced",
            takes_out_of_service=True, ladder_only=True, held_by_shared_cause=True,
        ),
)  # fmt: skip
"""The kinds that ship, in catalogue order."""

CATALOG: Final[dict[str, ActionKind]] = {}
"""Every registered kind by name (``register``)."""
RULE_KINDS: Final[dict[str, ActionKind]] = {}
"""The actions a rule may name."""
SCHEDULER_VERBS: Final[list[str]] = []
"""What the scheduler actuators are asked to do for a rule (cordon, uncordon, migrate), in catalogue order
(the ladder adds ``reboot_node``)."""
TAKES_OUT_OF_SERVICE: Final[set[str]] = set()
"""Action kinds that take capacity out of service."""
REQUESTS: Final[set[str]] = set()
"""What an actuator may be asked to do (``actuators.base.RequestKind``): a scheduler action's verb (a drain
is a ``cordon`` request), else the kind's own name."""
HELD_BY_SHARED_CAUSE: Final[set[str]] = set()
"""Repairs a shared-cause domain incident holds on its members (``ActionKind.held_by_shared_cause``)."""
AGENT_COMMANDS: Final[dict[str, AgentCommand]] = {}
"""The node agent's commands by name (``schemas.commands.CommandAction``)."""
RUNGS: Final[list[str]] = []
"""The recovery ladders' rungs, smallest hammer first (the order a ladder's ``steps`` must keep)."""


def register(kind: ActionKind) -> ActionKind:
    """Add ``kind`` to the registry (every derived vocabulary follows). Raises ValueError for a name, an
    agent command or a rung place already taken."""
    if not kind.name or kind.name in CATALOG:
        raise ValueError(f"action kind {kind.name!r} is already registered (or has no name)")
    command = kind.agent_command
    if command is not None and command.name in AGENT_COMMANDS and AGENT_COMMANDS[command.name] != command:
        raise ValueError(f"agent command {command.name!r} is already registered differently")
    if kind.rung is not None and any(k.rung and k.rung.order == kind.rung.order for k in CATALOG.values()):
        raise ValueError(f"rung place {kind.rung.order} is taken")
    CATALOG[kind.name] = kind
    _derive()
    return kind


def unregister(name: str) -> None:
    """Take a kind out again (a test's toy kind)."""
    CATALOG.pop(name, None)
    _derive()


def _derive() -> None:
    kinds = list(CATALOG.values())
    RULE_KINDS.clear()
    RULE_KINDS.update((k.name, k) for k in kinds if not k.ladder_only)
    SCHEDULER_VERBS[:] = dict.fromkeys(
        k.scheduler_verb for k in RULE_KINDS.values() if k.scheduler_verb is not None
    )
    TAKES_OUT_OF_SERVICE.clear()
    TAKES_OUT_OF_SERVICE.update(k.name for k in kinds if k.takes_out_of_service)
    REQUESTS.clear()
    REQUESTS.update(
        k.scheduler_verb or k.name for k in kinds if k.actuator is not Actuator.NONE or k.published_only
    )
    HELD_BY_SHARED_CAUSE.clear()
    HELD_BY_SHARED_CAUSE.update(k.name for k in kinds if k.held_by_shared_cause)
    AGENT_COMMANDS.clear()
    AGENT_COMMANDS.update((k.agent_command.name, k.agent_command) for k in kinds if k.agent_command)
    RUNGS[:] = [k.name for k in sorted(kinds, key=lambda k: k.rung.order if k.rung else 0) if k.rung]


for _kind in _BUILT_IN:
    register(_kind)


class View(Set[str]):
    """Names computed from the registry each time they are read (``x in view``, iteration, ``|``, ``&``):
    a module's table of kinds or commands as a ``View`` also holds a kind registered after it was imported
    (a test's toy kind, a plugin's), where a ``frozenset`` built at import would miss it."""

    __slots__ = ("_names",)

    def __init__(self, names: Callable[[], Iterable[str]]) -> None:
        self._names = names

    def __contains__(self, name: object) -> bool:
        return any(n == name for n in self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(self._names()))

    def __len__(self) -> int:
        return len(set(self._names()))

    def __repr__(self) -> str:
        return f"View({sorted(self)})"

    @classmethod
    def _from_iterable(cls, it: Iterable[Any]) -> frozenset[Any]:
        return frozenset(it)


class EnumSchema:
    """A name field's JSON schema, ``{"enum": [...], "title": ..., "type": "string"}``, listing ``names``
    (a live table of the registry's, or a ``View``) when the schema is asked for: put it in the field's
    ``Annotated`` where ``pydantic.WithJsonSchema`` would freeze the list at import."""

    __slots__ = ("names", "title")

    def __init__(self, names: Iterable[str], title: str | None = None) -> None:
        self.names = names
        self.title = title

    def __get_pydantic_json_schema__(self, core: Any, handler: Any) -> dict[str, Any]:
        titled = {"title": self.title} if self.title else {}
        return {"enum": list(self.names), **titled, "type": "string"}


def commands_where(test: Callable[[AgentCommand], bool]) -> View:
    """The agent's commands for which ``test`` holds, read live (``View``)."""
    return View(lambda: (n for n, c in AGENT_COMMANDS.items() if test(c)))


def kinds_where(test: Callable[[ActionKind], bool]) -> View:
    """The registered kinds for which ``test`` holds, in catalogue order, read live (``View``)."""
    return View(lambda: (k.name for k in CATALOG.values() if test(k)))


def agent_commands(*, recovery: bool | None = None) -> frozenset[str]:
    """The agent's command names (``recovery``: only the recovery ones, or only the others)."""
    return frozenset(n for n, c in AGENT_COMMANDS.items() if recovery is None or c.recovery is recovery)


H = TypeVar("H", bound=Callable[..., Any])


class Handlers:
    """Which method of an actuator carries out which request, registered kopf-style: ``HANDLERS =
    Handlers("slurm", actions.REQUESTS)`` beside the class, ``@HANDLERS.handler("cordon")`` on the method,
    ``HANDLERS.bound(self)`` where it dispatches. A handler for a name the registry does not know is a
    ValueError at import, not a request that fails later."""

    def __init__(self, owner: str, known: Container[str]) -> None:
        self.owner = owner
        self._known = known
        self._by_name: dict[str, Callable[..., Any]] = {}

    def handler(self, *names: str) -> Callable[[H], H]:
        def register(fn: H) -> H:
            for name in names:
                if name not in self._known:
                    raise ValueError(f"{self.owner}: {name!r} is no registered request (actions.register)")
                if name in self._by_name:
                    raise ValueError(f"{self.owner}: {name!r} has a handler already")
                self._by_name[name] = fn
            return fn

        return register

    def remove(self, name: str) -> None:
        self._by_name.pop(name, None)

    def get(self, name: str, default: H) -> H:
        """The handler of ``name`` as registered (a plain function's table), else ``default``."""
        return self._by_name.get(name, default)  # type: ignore[return-value]

    def names(self) -> frozenset[str]:
        return frozenset(self._by_name)

    def bound(self, owner: object) -> dict[str, Callable[..., Any]]:
        """Each handler bound to ``owner`` (an actuator instance), by request name."""
        return {name: fn.__get__(owner, type(owner)) for name, fn in self._by_name.items()}


def per_port(name: str) -> bool:
    """``name`` acts on the incident's RDMA ports (``ActionKind.per_port``)."""
    return spec(name).per_port


def per_gpu(name: str) -> bool:
    """``name`` acts on one GPU (``ActionKind.per_gpu``)."""
    spec = CATALOG.get(name)
    return spec is not None and spec.per_gpu


def kind(name: str) -> ActionKind | None:
    """The catalogue entry of ``name``; None for a kind no rule may ask for."""
    return CATALOG.get(name)


NO_KIND: Final = ActionKind("", NoParams, "a kind not in the catalogue (its actuator says so)")
"""What a kind the catalogue does not know has: no property at all."""


def spec(name: str) -> ActionKind:
    """The catalogue entry of ``name``, or ``NO_KIND`` (every property off) for an unknown one."""
    return CATALOG.get(name, NO_KIND)


@dataclasses.dataclass(frozen=True, slots=True)
class Action:
    kind: str
    params: dict[str, Any] = dataclasses.field(default_factory=dict)


def build(kind: str, params: Any) -> Action:
    """Validate one action. Raises ValueError with a readable message."""
    spec = RULE_KINDS.get(kind)
    if spec is None:
        if kind in CATALOG:
            raise ValueError(f"{kind} is a recovery-ladder step: declare a ladder (ladders:) instead")
        raise ValueError(f"unknown action {kind!r} (known: {', '.join(RULE_KINDS)})")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ValueError(f"parameters of {kind} must be a mapping, got {type(params).__name__}")
    try:
        model = spec.params.model_validate(params)
    except pydantic.ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or kind}: {err['msg'].removeprefix('Value error, ')}"
            for err in e.errors()
        )
        raise ValueError(f"bad parameters for {kind}: {problems}") from e
    return Action(kind, model.model_dump(exclude_none=True, exclude_defaults=False))
