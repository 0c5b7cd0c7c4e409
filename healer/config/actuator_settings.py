"""Which scheduler actuator acts, and how it reaches Slurm, Kubernetes and the agents (``actuators.*``)."""

from __future__ import annotations

from typing import Literal

import pydantic

from healer.config import base


class ActuatorSettings(base.Group):
    """How healer acts on schedulers and agents; see docs/remediation.md."""

    retry_attempts: int = pydantic.Field(default=3, ge=1)
    """Tries of one action when it fails temporarily (scheduler unreachable, a timeout, HTTP 5xx); after
    the last one the outcome is ``failed-temporary`` and the controller escalates the incident."""
    retry_initial_delay_s: float = pydantic.Field(default=0.5, ge=0)
    """First pause between tries; it doubles each time (or is the delay the error asked for, if longer)."""
    retry_max_delay_s: float = pydantic.Field(default=10.0, ge=0)
    """Ceiling of the pause between tries."""
    call_timeout_s: float = pydantic.Field(default=15.0, gt=0)
    """Timeout of one call to a scheduler (one ``scontrol``/``squeue``/``sinfo`` run, one API request)."""
    node_name_template: str = "{node}"
    """How a telemetry node name becomes the scheduler's node name: ``{node}`` is the full name,
    ``{short}`` the part before the first dot (``gpu01.dc1.example`` → ``gpu01``). Identity by default."""
    node_map_file: str | None = None
    """YAML file mapping telemetry node names to scheduler node names (``gpu01.dc1: gpu-a01``); an entry
    there wins over ``node_name_template``."""
    slurm_bin_dir: str | None = None
    """Directory holding ``scontrol``, ``squeue``, ``sinfo`` and ``scancel``; unset: found on PATH."""
    slurm_conf: str | None = None
    """``SLURM_CONF`` for the Slurm commands; unset: Slurm's own default (or the inherited variable)."""
    slurm_checkpoint_signal: str | None = None
    """Signal sent to a node's jobs before they are requeued (e.g. ``USR1``) so they can checkpoint;
    unset: no signal, requeue at once."""
    slurm_checkpoint_grace_s: float = pydantic.Field(default=60.0, ge=0)
    """How long to wait after the checkpoint signal before requeueing (only with a signal set)."""
    slurm_requeue_settle_s: float = pydantic.Field(default=10.0, ge=0)
    """How long to wait for a requeued job to become pending before lifting its requeue hold
    (``StartTime=now``); past it the job keeps Slurm's short hold and starts a little later."""
    kube_config: str | None = None
    """Kubeconfig file; unset: in-cluster service account, else the default kubeconfig."""
    kube_context: str | None = None
    """Kubeconfig context; unset: the current context."""
    kube_taint: bool = True
    """Also put the taint ``healer.io/gpu-fault:NoSchedule`` on nodes healer cordons."""
    kube_evict_timeout_s: float = pydantic.Field(default=300.0, gt=0)
    """How long migrate keeps retrying evictions a PodDisruptionBudget refuses (HTTP 429) before it
    reports the pods not moved."""
    kube_evict_backoff_s: float = pydantic.Field(default=5.0, gt=0)
    """First pause between eviction retries of one pod (doubles, at most 60 s)."""
    power_reply_timeout_s: float = pydantic.Field(default=5.0, gt=0)
    """How long to wait for the node agent's reply to a power command."""
    power_command_ttl_s: float = pydantic.Field(default=30.0, gt=0)
    """Expiry of a power command: the agent refuses it once this long has passed since it was issued."""
    power_confirm_timeout_s: float = pydantic.Field(default=10.0, gt=0)
    """How long to wait for a telemetry frame showing the new power limit after the agent's reply."""
    power_confirm_poll_s: float = pydantic.Field(default=0.5, gt=0)
    """How often the latest frames are looked at while confirming a power limit."""
    power_tolerance_w: float = pydantic.Field(default=1.0, ge=0)
    """A reported power limit within this many watts of the requested one counts as applied."""
    gpu_reset_timeout_s: float = pydantic.Field(default=120.0, gt=0, le=600)
    """The most a GPU reset may take on the node (``reset_gpu``'s ``timeout_s``); the reply is awaited
    this long plus ``power_reply_timeout_s``."""
    port_reset_timeout_s: float = pydantic.Field(default=120.0, gt=0, le=600)
    """The most a port link reset may take on the node (``reset_port``'s ``timeout_s``): the bounce, then
    the wait for sysfs to read the port ACTIVE again (an InfiniBand port waits for the subnet manager
    after it trained); the reply is awaited this long plus ``power_reply_timeout_s``."""
    validate_timeout_s: float = pydantic.Field(default=300.0, gt=0, le=600)
    """The most the node's validation may take (``dcgmi diag -r 1`` takes about a minute); the reply is
    awaited this long plus ``power_reply_timeout_s``."""


ActuatorName = Literal["log", "slurm", "kubernetes"]
"""The scheduler actuators (``actuators.factory.REGISTRY`` builds each; the CLI offers these)."""
