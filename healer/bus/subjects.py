"""Every subject, stream and bucket name healer uses is built here and nowhere else; NATS's subject matching
(``subject_matches``, ``valid_subject``) is written here too, for the in-memory bus.

Node names may contain dots (FQDN-style Kubernetes node names), which NATS treats as token separators,
so a node name is escaped into exactly one subject token: ``%`` → ``%25``, ``.`` → ``%2E`` (and the
other characters NATS reserves, though valid node names never contain them). ``node_of`` reverses it.
"""

from __future__ import annotations

from healer.schemas import incidents

DEFAULT_PREFIX = "healer"

"""With this prefix the streams are HEALER_TELEMETRY, HEALER_EVENTS, HEALER_INCIDENTS and the KV
buckets healer-state, healer-leases (see the ``stream_*`` / ``kv_*`` properties)."""

IncidentChange = incidents.Change
"""What an incident subject names (the feed's change, ``schemas.incidents.Change``)."""

_ESCAPES = {"%": "%25", ".": "%2E", "*": "%2A", ">": "%3E", " ": "%20"}


def escape_node(node: str) -> str:
    if not node:
        raise ValueError("empty node name")
    return "".join(_ESCAPES.get(ch, ch) for ch in node)


def unescape_node(token: str) -> str:
    out = token
    for raw, esc in _ESCAPES.items():
        if raw != "%":
            out = out.replace(esc, raw)
    return out.replace("%25", "%")


class Subjects:
    """Subjects under one prefix (``healer`` unless configured; several fleets can share one NATS)."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        if not prefix or any(ch in prefix for ch in " *>") or prefix.startswith(".") or prefix.endswith("."):
            raise ValueError(f"bad subject prefix {prefix!r}")
        self.prefix = prefix

    def telemetry(self, node: str) -> str:
        return f"{self.prefix}.telemetry.{escape_node(node)}"

    def events(self, node: str) -> str:
        return f"{self.prefix}.events.{escape_node(node)}"

    def command(self, node: str) -> str:
        return f"{self.prefix}.cmd.{escape_node(node)}"

    def steps(self, job: str) -> str:
        """A training job's step times (schemas/stepreport.py; ``healer.steps`` publishes them)."""
        return f"{self.prefix}.steps.{escape_node(job)}"

    @property
    def power_shed(self) -> str:
        """Demand response (#30): ask a budget's domain to hold a lower budget for a time (request/reply,
        ``schemas/budgets.py``; the leader answers)."""
        return f"{self.prefix}.power.shed"

    @property
    def power_status(self) -> str:
        """Every power budget, its live draw, state and shed (request/reply; the leader answers)."""
        return f"{self.prefix}.power.status"

    @property
    def all_power(self) -> str:
        return f"{self.prefix}.power.*"

    @property
    def all_steps(self) -> str:
        return f"{self.prefix}.steps.*"

    def incident(self, change: IncidentChange, node: str) -> str:
        return f"{self.prefix}.incidents.{change}.{escape_node(node)}"

    def verdict(self, incident_id: str) -> str:
        """An operator's verdict on an incident (``schemas.verdicts``; stored in the incidents stream)."""
        return f"{self.prefix}.incidents.verdict.{escape_node(incident_id)}"

    def anomaly_shadow(self, node: str) -> str:
        """A would-be anomaly incident of a pool in shadow (``schemas.shadow``; in the incidents stream)."""
        return f"{self.prefix}.incidents.shadow.{escape_node(node)}"

    @property
    def rules_rejected(self) -> str:
        """Controller notices that a rule reload was rejected (stored in the incidents stream)."""
        return f"{self.prefix}.incidents.rules.rejected"

    @property
    def all_telemetry(self) -> str:
        return f"{self.prefix}.telemetry.*"

    @property
    def all_events(self) -> str:
        return f"{self.prefix}.events.*"

    @property
    def all_commands(self) -> str:
        return f"{self.prefix}.cmd.*"

    @property
    def all_incidents(self) -> str:
        return f"{self.prefix}.incidents.>"

    @property
    def stream_telemetry(self) -> str:
        return self._stream("TELEMETRY")

    @property
    def stream_events(self) -> str:
        return self._stream("EVENTS")

    @property
    def stream_incidents(self) -> str:
        return self._stream("INCIDENTS")

    @property
    def kv_state(self) -> str:
        return f"{self.prefix.replace('.', '-')}-state"

    @property
    def kv_leases(self) -> str:
        return f"{self.prefix.replace('.', '-')}-leases"

    @property
    def stream_leases(self) -> str:
        """The stream behind the leases bucket (its sequence numbers are the fencing tokens)."""
        return f"KV_{self.kv_leases}"

    def lease_subject(self, key: str) -> str:
        """The stream subject of one lease key (``leader.shard-0``)."""
        return f"$KV.{self.kv_leases}.{key}"

    @property
    def lease_read_api(self) -> str:
        """The JetStream API subject that reads one message of the leases stream (nodes may use it to
        check a fencing token against the lease; nothing else of JetStream)."""
        return f"$JS.API.STREAM.MSG.GET.{self.stream_leases}"

    def inbox(self, role: str, name: str) -> str:
        """Reply-inbox prefix of one identity (``NatsSettings.inbox_prefix``): ``_INBOX.<prefix>.<role>.
        <name>``. Each identity may subscribe only below its own, so nobody reads another's replies."""
        if not role or any(ch in role for ch in " .*>"):
            raise ValueError(f"bad role {role!r}")
        return f"_INBOX.{self.prefix}.{role}.{escape_node(name)}"

    def _stream(self, what: str) -> str:
        return f"{self.prefix.upper().replace('.', '_').replace('-', '_')}_{what}"

    def node_of(self, subject: str) -> str:
        """The node a per-node subject belongs to (its last token, unescaped)."""
        return unescape_node(subject.rsplit(".", 1)[-1])


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS matching of a concrete subject against a pattern with ``*`` and ``>``."""
    p_tokens = pattern.split(".")
    s_tokens = subject.split(".")
    for i, p in enumerate(p_tokens):
        if p == ">":
            return len(s_tokens) > i
        if i >= len(s_tokens):
            return False
        if p != "*" and p != s_tokens[i]:
            return False
    return len(p_tokens) == len(s_tokens)


def valid_subject(subject: str, *, wildcards: bool) -> bool:
    if not subject or subject != subject.strip() or " " in subject:
        return False
    tokens = subject.split(".")
    for i, t in enumerate(tokens):
        if not t:
            return False
        if t in ("*", ">"):
            if not wildcards or (t == ">" and i != len(tokens) - 1):
                return False
        elif "*" in t or ">" in t:
            return False
    return True
