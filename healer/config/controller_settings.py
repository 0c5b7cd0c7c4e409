"""The controller's settings (``controller.*``), with its failure domains' limits and power budgets."""

from __future__ import annotations

from typing import Literal

import pydantic

from healer.config import actuator_settings, base
from healer.schemas import incidents


class DomainLimit(base.Group):
    """How much of one failure domain healer may take out of service in the breaker's window (#27)."""

    max_nodes: int | None = pydantic.Field(default=None, ge=1)
    """At most this many nodes of any one domain of this key."""
    max_percent: float | None = pydantic.Field(default=None, gt=0, le=100)
    """At most this percentage of any one domain of this key (never fewer than one node)."""


class SharedCauseRule(base.Group):
    """Shared-cause detection for one kind of signal: the rules whose id matches (#27). A field left
    unset is the fleet-wide ``shared_cause_window_s`` / ``shared_cause_min_nodes``."""

    window_s: float | None = pydantic.Field(default=None, ge=0)
    """Nodes of one domain opening incidents of this rule within this long make a shared cause (a node
    going silent with its PDU is seconds; a coolant rise over a row can take minutes); 0: never."""
    min_nodes: int | None = pydantic.Field(default=None, ge=2)
    """How many nodes of one domain with this rule make a shared cause."""


class PowerBudget(base.Group):
    """A power budget for one failure domain (#30): the GPUs of the domain together stay under it."""

    key: str = pydantic.Field(min_length=1, max_length=63)
    """The domain key of the topology (``rack``, ``pdu``, ``row``, any key)."""
    value: str = pydantic.Field(min_length=1, max_length=253)
    """The domain (``r7``): the nodes whose ``key`` label has this value."""
    breaker_kw: float | None = pydantic.Field(default=None, gt=0, le=100000)
    """Source ``breaker``: the breaker's rating in kW; the budget is ``breaker_kw x derating``."""
    derating: float = pydantic.Field(default=0.8, gt=0, le=1)
    """Fraction of the breaker's rating that may be drawn continuously (0.8: the NEC's 80 % rule)."""
    contract_kw: float | None = pydantic.Field(default=None, gt=0, le=100000)
    """Source ``contract``: the budget in kW as agreed (a colocation contract). Exactly one of
    ``breaker_kw`` or ``contract_kw``."""
    gpu_share: float = pydantic.Field(default=1.0, gt=0, le=1)
    """The part of the budget the GPUs may draw (the rest is CPUs, fans, network: healer sees only GPU
    power)."""
    hold_s: float = pydantic.Field(default=10.0, ge=0, le=3600)
    """The longest the domain may run over its budget before healer's lower limits hold (a short spike is
    not capped: breakers trip on sustained load). The caps are decided that much earlier as their
    limits take to show in the readings (the lag of the domain's last cap step, at most half of this)."""
    hysteresis_percent: float = pydantic.Field(default=5.0, ge=0, le=50)
    """Caps aim this far under the budget, and limits are raised again only while the domain, with the
    next step fully drawn, stays this far under it: no cap / restore oscillation."""
    restore_after_s: float = pydantic.Field(default=120.0, ge=0)
    """Headroom must last this long before the first restore step, and between steps."""
    restore_step_percent: float = pydantic.Field(default=10.0, gt=0, le=100)
    """Each restore step raises a capped GPU's limit by this percentage of its default limit."""
    policy: Literal["proportional", "priority"] = "proportional"
    """proportional: every GPU gives up the same share of what it draws above its minimum limit;
    priority: lower-priority GPUs are capped first (to their minimum), higher ones only if that is not
    enough."""
    priority_label: str = "priority"
    """Under ``policy: priority``, a GPU whose job ``controller.power_priority`` does not rank is ranked by
    this label of its node (from the inventory file or the scheduler's node labels)."""
    priorities: dict[str, int] = pydantic.Field(default_factory=dict)
    """Rank of each ``priority_label`` value (higher: capped later); a node without the label, or with a
    value not listed, ranks ``controller.power_priority.default``."""

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> PowerBudget:
        if (self.breaker_kw is None) == (self.contract_kw is None):
            raise ValueError("a power budget takes exactly one of 'breaker_kw' or 'contract_kw'")
        return self

    @property
    def source(self) -> Literal["breaker", "contract"]:
        return "breaker" if self.breaker_kw is not None else "contract"

    @property
    def domain(self) -> str:
        return f"{self.key}={self.value}"

    @property
    def gpu_budget_w(self) -> float:
        """What the domain's GPUs may draw together, in W."""
        kw = self.breaker_kw * self.derating if self.breaker_kw is not None else self.contract_kw
        assert kw is not None
        return kw * 1000.0 * self.gpu_share


class PowerPriority(base.Group):
    """How a power budget's ``policy: priority`` ranks a GPU by the job running on it (#30;
    docs/power-budgets.md): the job's Slurm QOS, else its Slurm partition, else its Kubernetes priority
    class, as listed here (higher: capped later); a GPU whose job none of them ranks (no job known, or
    its values not listed) is ranked by its node's label (the budget's ``priority_label`` and
    ``priorities``), else ``default``. The job on each GPU and its QOS, partition or priority class come
    from the scheduler's job listing (Slurm ``squeue --json``, Kubernetes pods requesting
    ``nvidia.com/gpu``), every ``jobs_refresh_s``."""

    qos: dict[str, int] = pydantic.Field(default_factory=dict)
    """Slurm QOS name -> rank (e.g. ``{high: 10, normal: 5, low: 0}``). A job's QOS is known only with
    Slurm accounting (slurmdbd): without it ``squeue`` reports none, and the partition ranks it."""
    partition: dict[str, int] = pydantic.Field(default_factory=dict)
    """Slurm partition -> rank (e.g. ``{urgent: 10, batch: 0}``), for a job whose QOS is not listed."""
    priority_class: dict[str, int] = pydantic.Field(default_factory=dict)
    """Kubernetes ``priorityClassName`` of the job's pods -> rank (e.g. ``{training-high: 10}``)."""
    default: int = 0
    """The rank of a GPU that neither its job nor its node's label ranks (an idle GPU, a job started
    since the last listing, a value not listed)."""

    @property
    def by_job(self) -> bool:
        """Whether any job attribute is ranked at all."""
        return bool(self.qos or self.partition or self.priority_class)


class ControllerSettings(base.Group):
    rules_dir: str = "rules"
    """Directory of rule files (*.yaml); watched and hot-reloaded."""
    mode: incidents.Mode = incidents.Mode.DRY_RUN
    """enforce: act; dry-run: decide and publish, touch nothing; observe: incidents only."""
    actuator: actuator_settings.ActuatorName = "log"
    """Where cordon/drain/migrate go. Power limits always go to the node agent."""
    cluster: str = "default"
    """Cluster name, in every incident's CloudEvent ``source`` (healer://<cluster>/controller)."""
    tick_s: float = pydantic.Field(default=1.0, gt=0)
    """Rule evaluation interval."""
    frame_arrivals_s: float = pydantic.Field(default=0.1, ge=0)
    """How often, between ticks, the rules without ``for`` are evaluated on the nodes whose frames
    arrived since (a new ECC error, an XID counter, a port gone down): their faults are acted on within
    about this long of the frame, not at the next tick. Spaced further apart while it would take more
    than a tenth of the time. 0: only at ticks."""
    model: str | None = None
    """Anomaly model directory (``models/default``); unset: ``anomaly_score`` is 0 everywhere."""
    anomaly_interval_s: float = pydantic.Field(default=30.0, gt=0)
    """How often the anomaly model scores the fleet (one batch; the model's window bucket is 30 s)."""
    anomaly_save_s: float = pydantic.Field(default=300.0, gt=0)
    """How often the leader saves what the anomaly model learned about this fleet (per-GPU and per-node
    baselines) to KV ``anomaly.state``; also at shutdown. A restarted controller starts from it."""
    stragglers: bool = True
    """Fail-slow detection (docs/fail-slow.md): compare each loaded GPU with its job's other GPUs (or its
    own history) every minute; rules read the verdict as ``straggler_score``. Off: it reads 0."""
    straggler_window_s: float = pydantic.Field(default=60.0, gt=0)
    """The fail-slow scorer's window: GPUs are compared once per window and a straggler is confirmed
    after 3 lagging windows in a row; a node's frames are folded every twelfth of it."""
    jobs_refresh_s: float = pydantic.Field(default=60.0, ge=0)
    """How often the job placements (which job runs on which node) are read from the scheduler actuator
    (Slurm ``squeue --json``; Kubernetes pods requesting ``nvidia.com/gpu``) for the fail-slow peer
    groups and the power budgets' job priorities (``power_priority``; a job started since the last
    listing is not ranked by it yet); 0: never (the agents' job-mapping directories alone)."""
    jobs_unlisted_refresh_s: float = pydantic.Field(default=10.0, ge=0)
    """With ``power_priority`` ranking by job: a job id in the frames (the agents' job-mapping
    directories) that the last job listing did not describe, a job started since, brings the next
    listing forward, at most this often, so its QOS, partition or priority class is known within
    seconds rather than ``jobs_refresh_s``. An id that the listing after it does not describe either
    (another naming than the scheduler's) brings none again; 0: never."""
    reload_check_s: float = pydantic.Field(default=2.0, gt=0)
    """How often the rules directory is checked for changes."""
    labels_refresh_s: float = pydantic.Field(default=300.0, ge=0)
    """How often node labels for rules' ``match.labels`` are read from the scheduler actuator
    (Kubernetes node labels; Slurm ``partition`` and ``features``); 0: never. The log actuator has none."""
    labels_timeout_s: float = pydantic.Field(default=30.0, gt=0)
    """Longest a label refresh may take; past it the previous labels stay and the failure is counted."""
    telemetry_connection: bool = True
    """Receive telemetry on a NATS connection of its own: a flood of frames (and the server cutting a
    slow consumer off) then never delays lease renewals, KV and events, which use the main one."""
    frames_buffer_mib: float = pydantic.Field(default=128.0, gt=0)
    """Frames received and not yet ingested, at most (15,000 8-GPU frames at the default; each message
    counts 512 bytes beside its payload, so a flood of tiny ones is bounded too), in the telemetry
    subscription's backlog, which is fair by node (healer/bus/fair.py): past it frames are dropped and
    counted (``healer_controller_frames_dropped_total``), never queued without bound."""
    frames_per_node: int = pydantic.Field(default=4, ge=1, le=10_000)
    """Frames of one node (one telemetry subject) waiting to be ingested, at most: a node (or a
    flooder on its subject) sending faster than the controller ingests loses its own oldest frames,
    never another node's. Frames are ingested round-robin over the nodes, and a message that is
    certainly not a frame (too large, not JSON) is counted and dropped as it is read, before it queues."""
    gpus_per_node: int = pydantic.Field(default=8, ge=1, le=256)
    """Expected GPUs per node (fleet-state sizing; frames may carry fewer or more)."""
    stale_after_s: float = pydantic.Field(default=300.0, gt=0)
    """A node silent this long is dropped from the evaluated fleet (node-silent rules fire before)."""
    shards: int = pydantic.Field(default=1, ge=1)
    """Number of controller shards; each owns the nodes whose name hashes to it."""
    shard: int = pydantic.Field(default=0, ge=0)
    """This process's shard (0 .. shards-1)."""
    metrics_port: int = pydantic.Field(default=9742, ge=0, le=65535)
    """Prometheus /metrics port; 0 turns it off."""
    breaker_max_nodes: int = pydantic.Field(default=50, ge=1)
    """Circuit breaker: at most this many nodes cordoned/drained by healer in the window..."""
    breaker_max_percent: float = pydantic.Field(default=10.0, gt=0, le=100)
    """...and at most this percentage of the admitted fleet (``admission``; never fewer than one node)."""
    breaker_window_s: float = pydantic.Field(default=3600.0, gt=0)
    """Sliding window of the circuit breaker."""
    domain_limits: dict[str, DomainLimit] = pydantic.Field(default_factory=dict)
    """Blast radius per failure domain, by domain key (``rack``, ``switch``, ``nvl_domain``, any key of
    the topology): e.g. ``{rack: {max_nodes: 2}, switch: {max_percent: 25}}``. A node is taken out of
    service only while every domain it belongs to stays within its limit (nodes healer took out in the
    breaker's window, counted in the breaker's KV document); beyond it the action waits and the
    incident names the domain and the limit. Unlike the fleet-wide breaker it opens nothing: a rack at
    its limit does not stop remediation elsewhere. Empty: no per-domain limit."""
    power_budgets: list[PowerBudget] = pydantic.Field(default_factory=list)
    """Power budgets per failure domain (#30; docs/power-budgets.md): e.g. ``[{key: rack, value: r7,
    breaker_kw: 60, derating: 0.8}]``. Empty: no budget."""
    power_priority: PowerPriority = pydantic.Field(default_factory=PowerPriority)
    """How ``policy: priority`` budgets rank each GPU by its job's Slurm QOS or partition, or its
    Kubernetes priority class (#30; docs/power-budgets.md), e.g. ``{qos: {high: 10, low: 0}, partition:
    {urgent: 10}, priority_class: {training-high: 10}}``. Needs ``stragglers`` (the job index lives
    there) and ``jobs_refresh_s`` > 0. Empty: node labels alone rank."""
    energy_accounting: bool = False
    """Energy per failure domain and per job (#30; docs/power-budgets.md) from the frames' NVML energy
    counters: ``healer_controller_energy_joules_total{domain}`` and
    ``healer_controller_job_energy_joules_total{job}`` on /metrics, and the energy of a power-budget
    episode in its incident's evidence. Off: nothing is counted (a few microseconds per frame saved)."""
    energy_keys: list[str] = pydantic.Field(default_factory=list)
    """With ``energy_accounting``: the topology keys whose domains are counted (``[rack, pdu]``); empty:
    every key of the admitted topology."""
    action_cooldown_s: float = pydantic.Field(default=600.0, ge=0)
    """A power cap on the same node for another incident waits at least this long (no flapping)."""
    actions_per_minute: int = pydantic.Field(default=60, ge=1)
    """Fleet-wide rate limit per action kind. A step of per-GPU power changes (a budget's caps across a
    domain, a node-wide incident's caps) counts once per node it acts on, reserved whole."""
    repeat_faults: int = pydantic.Field(default=3, ge=2)
    """This many incidents on one GPU within ``repeat_window_s`` escalate to hardware inspection."""
    repeat_window_s: float = pydantic.Field(default=86400.0, gt=0)
    """Window for counting repeat faults on one GPU."""
    leaderless_margin_s: float = pydantic.Field(default=10.0, ge=0)
    """A shard whose lease no controller was seen holding for longer than ``nats.lease_ttl_s`` plus this
    is leaderless: ``healer_controller_leaderless`` says so (deploy/prometheus alerts on it)."""
    correlate_window_s: float = pydantic.Field(default=120.0, ge=0)
    """A rule firing on a GPU (or a node-scope rule on a node) that has an incident opened less than this
    long ago joins it instead of opening another: one incident per fault (docs/controller.md); 0 turns
    correlation off."""
    shared_cause_window_s: float = pydantic.Field(default=60.0, ge=0)
    """Shared-cause domain incidents (#27): when ``shared_cause_min_nodes`` nodes of one failure domain
    open incidents of the same rule within this long, healer opens one ``shared-cause`` incident naming
    the domain as the suspected component and holds its members' repairs (GPU reset, reboot, hardware
    replacement; containment such as a cordon or drain still runs) until the domain recovers; 0 turns
    it off. This is the window of every rule without its own in ``shared_cause_rules``."""
    shared_cause_min_nodes: int = pydantic.Field(default=3, ge=2)
    """How many nodes of one domain make a shared cause (every rule without its own count in
    ``shared_cause_rules``)."""
    shared_cause_rules: dict[str, SharedCauseRule] = pydantic.Field(default_factory=dict)
    """The window and the count per kind of signal, by rule id or a glob of rule ids (e.g. ``{node-silent:
    {window_s: 20, min_nodes: 4}, "inlet-*": {window_s: 300}}``): an exact id wins, then the longest
    matching glob; a rule matched by none uses ``shared_cause_window_s`` and ``shared_cause_min_nodes``."""
    shared_cause_keys: list[str] = pydantic.Field(default_factory=list)
    """Domain keys looked at for shared causes (e.g. ``[switch, pdu, rack, cooling_loop]``); empty: every
    key of the topology."""
    power_cap_escalate_s: float = pydantic.Field(default=900.0, gt=0)
    """An incident still firing this long after its power cap escalates to a cordon (the ladder)."""
    action_retries: int = pydantic.Field(default=3, ge=0)
    """Temporary action failures retried this many times (one per tick) before the incident escalates."""
    uncordon_hold_s: float = pydantic.Field(default=300.0, ge=0)
    """After an incident resolves, wait this long before undoing healer's cordon."""
    recovery: bool = True
    """Walk the recovery ladders the rule pack declares (``ladders:``; docs/remediation.md): reset the
    GPU, reboot the node, validate, return it to service, or ask for a hardware replacement. Off: every
    fault ends at containment (the node stays out until a person acts)."""
    max_concurrent_reboots: int = pydantic.Field(default=1, ge=1)
    """Recovery ladders: at most this many nodes rebooting at once (all shards together); a further
    reboot waits. One by default: a reboot is the biggest hammer healer has, and a fleet that needs
    several at once is more likely to have a shared cause (a bad driver roll-out) than bad GPUs."""
    admission: Literal["scheduler", "file", "first-seen"] = "scheduler"
    """Which node names the controller believes in. ``scheduler``: nodes the scheduler actuator lists
    (Slurm ``sinfo``, Kubernetes nodes; asked when an unknown name first reports, at most every
    ``admission_refresh_s``); ``file``: the names in ``inventory_file``; ``first-seen``: any name that
    reports (development and demos only: anyone able to publish telemetry grows the fleet). Frames and
    events from names not admitted are dropped and counted before they allocate any state, and only
    admitted nodes count toward the breaker's fleet size."""
    inventory_file: str | None = None
    """With ``admission: file``: a YAML list of node names, or a mapping with a ``nodes`` list (the
    ``healer nats config --nodes`` file works); re-read when it changes. An entry may carry failure
    domain labels: ``{name: gpu01, rack: r07, pdu: p3, switch: leaf-07}``, or ``nodes`` as a mapping
    from name to labels."""
    topology_file: str | None = None
    """Slurm's ``topology.conf`` (topology/tree or topology/block) read for failure domains, with any
    ``admission``: a node's leaf switch is domain ``switch``, the switch above it ``switch_l2`` and so
    on; a block is domain ``block``. Re-read when it changes; a bad line is logged and skipped."""
    domain_labels: dict[str, str] = pydantic.Field(default_factory=dict)
    """Domain key -> scheduler label name, for ``admission: scheduler`` (e.g. ``{rack:
    example.com/rack}``); every ``topology.kubernetes.io/<key>`` label is domain ``<key>`` anyway."""
    domain_features: dict[str, str] = pydantic.Field(default_factory=dict)
    """Domain key -> Slurm node feature prefix, for ``admission: scheduler`` with Slurm (e.g. ``{pdu:
    pdu_}``: a node with feature ``pdu_p3`` is in domain ``pdu`` ``p3``); a feature ``<key>=<value>``
    (``Features=h100,rack=r07`` in slurm.conf) is domain ``<key>`` anyway. A scheduler label
    (``domain_labels``, ``topology.kubernetes.io/*``) naming the same key wins."""
    admission_refresh_s: float = pydantic.Field(default=10.0, gt=0)
    """With ``admission: scheduler``: the scheduler is asked about names that reported but are not
    admitted at most this often (one node list call for all of them)."""
    max_clock_skew_s: float = pydantic.Field(default=60.0, gt=0)
    """A frame or event whose ``ts`` is further than this from the controller's receive time is counted
    as skewed (``healer_controller_clock_skewed_total``). Ordering, freshness, silence and quiet
    periods always use the controller's receive time, never a node's ``ts``."""
    max_gpus_per_node: int = pydantic.Field(default=16, ge=1, le=256)
    """Most GPUs a node may report (never fewer than ``gpus_per_node``): a frame with more GPUs, a GPU
    index at or past this, or a larger ``gpus_expected`` is rejected and counted (reason
    ``too_many_gpus``); fleet state never grows wider."""
    node_retention_s: float = pydantic.Field(default=86400.0, gt=0)
    """A node silent this long is forgotten: its fleet-state row is reused, and what its rules had
    firing (``node-silent`` above all) resolves with the reason, without running ``on_resolve``
    actions (healer's cordon on a node that left stays)."""

    @pydantic.model_validator(mode="after")
    def _shard_in_range(self) -> ControllerSettings:
        if self.shard >= self.shards:
            raise ValueError(
                f"shard {self.shard} does not exist with shards={self.shards}; "
                f"shard must be 0 .. {self.shards - 1}"
            )
        return self

    @pydantic.model_validator(mode="after")
    def _budgets_enforceable(self) -> ControllerSettings:
        """A budget is refused at load rather than enforced by half: with several shards each sums and caps
        only the frames of its own nodes, and a domain's nodes are spread over the shards by a hash of
        their names (a rack of 8 lies within one of 2 shards 1 time in 128), so every shard would hold
        the whole budget against its part of the draw. Two budgets for one domain would share one state."""
        if self.power_budgets and self.shards > 1:
            domains = ", ".join(b.domain for b in self.power_budgets)
            raise ValueError(
                f"power_budgets ({domains}) need one controller shard, not shards={self.shards}: each shard "
                "sees only its own nodes' frames, and a domain's nodes are spread over the shards, so each "
                "would hold the whole budget against part of the draw (docs/power-budgets.md)"
            )
        if self.power_priority.by_job and (not self.stragglers or not self.jobs_refresh_s):
            raise ValueError(
                "power_priority ranks GPUs by their jobs, which come from the job index: it needs "
                f"stragglers: true and jobs_refresh_s > 0 (stragglers: {str(self.stragglers).lower()}, "
                f"jobs_refresh_s: {self.jobs_refresh_s:g}; docs/power-budgets.md)"
            )
        seen: set[str] = set()
        for b in self.power_budgets:
            if b.domain in seen:
                raise ValueError(f"power_budgets: {b.domain} has two budgets; give each domain one")
            seen.add(b.domain)
        return self
