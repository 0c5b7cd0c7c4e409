"""PortSample: one RDMA port (InfiniBand or RoCE) of a node, as the kernel's sysfs shows it.

The agent reads ``/sys/class/infiniband/<device>/ports/<n>/`` (the kernel's
``Documentation/ABI/stable/sysfs-class-infiniband``): the port's ``state`` and ``phys_state`` (the
numbers before the colon of ``4: ACTIVE`` and ``5: LinkUp``), its ``rate`` in Gb/s, its
``link_layer``, the InfiniBand PortCounters under ``counters/``, a driver's ``hw_counters/`` where the
driver has them (mlx5's RoCE congestion and retransmission counters), and for a port with a network
device (RoCE, IPoIB) that device's ``carrier_changes``.

Counters are cumulative exactly as the kernel reports them, like the GPU counters: consumers derive rates
and handle resets (a driver reload or a port reset zeroes them). ``None`` is a file the port does not
have (no ``hw_counters/`` on a non-mlx5 driver, no netdev on a plain IB port). The two data counters are
converted to bytes here: the kernel's ``port_xmit_data`` and ``port_rcv_data`` count octets divided by 4.
"""

from __future__ import annotations

from typing import Any, Final

import pydantic

PORTS_MAX: Final = 64
"""RDMA ports in one frame (an 8-GPU node has 8 to 10 HCA ports, a few dual-port NICs twice that)."""
RATE_MAX_GBPS: Final = 10_000.0
"""Port rates, Gb/s (XDR 4X is 800 Gb/s)."""

PORT_STATES: Final[dict[int, str]] = {
    0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"
}  # fmt: skip
"""``state``: the IB PortState the kernel prints before its name (``4: ACTIVE``)."""
PHYS_STATES: Final[dict[int, str]] = {
    1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining", 5: "LinkUp",
    6: "LinkErrorRecovery", 7: "Phy Test",
}  # fmt: skip
"""``phys_state``: the PortPhysicalState (``5: LinkUp``)."""
ACTIVE: Final = 4
LINK_UP: Final = 5

COUNTERS: Final[dict[str, str]] = {
    # field → the file under ports/<n>/counters/ (the data counters are x4: octets divided by 4 there)
    "symbol_error": "symbol_error",
    "link_error_recovery": "link_error_recovery",
    "link_downed": "link_downed",
    "port_rcv_errors": "port_rcv_errors",
    "port_rcv_remote_physical_errors": "port_rcv_remote_physical_errors",
    "port_xmit_discards": "port_xmit_discards",
    "local_link_integrity_errors": "local_link_integrity_errors",
    "excessive_buffer_overrun_errors": "excessive_buffer_overrun_errors",
    "port_xmit_wait": "port_xmit_wait",
    "port_xmit_data_bytes": "port_xmit_data",
    "port_rcv_data_bytes": "port_rcv_data",
}
"""The PortCounters read, field name → sysfs file name."""
DATA_COUNTERS: Final = frozenset({"port_xmit_data_bytes", "port_rcv_data_bytes"})
"""Counters the kernel reports in 4-byte words; the reader multiplies them by 4."""
HW_COUNTERS: Final = (
    "out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "rnr_nak_retry_err",
    "implied_nak_seq_err", "duplicate_request", "req_cqe_error", "resp_cqe_error",
    "np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled", "rp_cnp_ignored",
    "roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart",
)  # fmt: skip
"""The mlx5 ``hw_counters/`` read (same name as the file): RoCE retransmission and congestion."""
ALL_COUNTERS: Final[tuple[str, ...]] = (*COUNTERS, *HW_COUNTERS, "carrier_changes")
"""Every cumulative PortSample field (reset by a driver reload, a port reset or a reboot)."""
ERROR_COUNTERS: Final = frozenset(ALL_COUNTERS) - DATA_COUNTERS - {"port_xmit_wait"}
"""Counters whose rise is a fault signal (the data and wait counters rise on a healthy busy port)."""


def _counter(description: str) -> Any:
    return pydantic.Field(default=None, ge=0, description=description)


class PortSample(pydantic.BaseModel):
    """One RDMA port's readings at one instant."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    device: str = pydantic.Field(
        min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="e.g. mlx5_0"
    )
    port: int = pydantic.Field(ge=0, le=255, description="port number (1 on an HCA)")
    link_layer: str | None = pydantic.Field(
        default=None, max_length=32, description="`InfiniBand` or `Ethernet` (RoCE)"
    )
    state: int | None = pydantic.Field(
        default=None, ge=0, le=15, description="PortState: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER"
    )
    phys_state: int | None = pydantic.Field(
        default=None,
        ge=0,
        le=15,
        description="PortPhysicalState: 1 Sleep, 2 Polling, 3 Disabled, 4 Training, 5 LinkUp, "
        "6 LinkErrorRecovery, 7 Phy Test",
    )
    rate_gbps: float | None = pydantic.Field(
        default=None, ge=0, le=RATE_MAX_GBPS, description="active width x speed, Gb/s (`rate`)"
    )
    netdev: str | None = pydantic.Field(
        default=None, max_length=32, description="the port's network device (RoCE, IPoIB)"
    )
    carrier_changes: int | None = _counter("the netdev's carrier_changes (link up/down transitions)")
    symbol_error: int | None = _counter("minor link errors on one or more lanes")
    link_error_recovery: int | None = _counter("successful link error recoveries")
    link_downed: int | None = _counter("link error recoveries that failed and downed the link")
    port_rcv_errors: int | None = _counter("packets received with an error")
    port_rcv_remote_physical_errors: int | None = _counter("packets received marked bad (EBP)")
    port_xmit_discards: int | None = _counter("outbound packets discarded (port down or congested)")
    local_link_integrity_errors: int | None = _counter("local physical errors past their threshold")
    excessive_buffer_overrun_errors: int | None = _counter("input buffer overruns")
    port_xmit_wait: int | None = _counter("ticks with data to send and nothing sent (congestion)")
    port_xmit_data_bytes: int | None = _counter("bytes sent (the kernel's port_xmit_data x 4)")
    port_rcv_data_bytes: int | None = _counter("bytes received (the kernel's port_rcv_data x 4)")
    out_of_sequence: int | None = _counter("hw: packets received out of sequence")
    packet_seq_err: int | None = _counter("hw: NAK sequence errors received")
    local_ack_timeout_err: int | None = _counter("hw: ACK timeouts on the sending side")
    rnr_nak_retry_err: int | None = _counter("hw: RNR NAK retries exceeded")
    implied_nak_seq_err: int | None = _counter("hw: implied NAK sequence errors")
    duplicate_request: int | None = _counter("hw: duplicate requests received")
    req_cqe_error: int | None = _counter("hw: requester completions with error")
    resp_cqe_error: int | None = _counter("hw: responder completions with error")
    np_cnp_sent: int | None = _counter("hw: congestion notification packets sent (notification point)")
    np_ecn_marked_roce_packets: int | None = _counter("hw: ECN-marked RoCE packets received")
    rp_cnp_handled: int | None = _counter("hw: CNPs handled by the reaction point (rate lowered)")
    rp_cnp_ignored: int | None = _counter("hw: CNPs ignored by the reaction point")
    roce_adp_retrans: int | None = _counter("hw: adaptive retransmissions (RoCE)")
    roce_adp_retrans_to: int | None = _counter("hw: adaptive retransmission timeouts (RoCE)")
    roce_slow_restart: int | None = _counter("hw: slow restarts after retransmission (RoCE)")

    @property
    def name(self) -> str:
        """``<device>/<port>``, as node_exporter and ibstat name a port."""
        return f"{self.device}/{self.port}"
