"""The node's RDMA ports on ``/metrics`` under node_exporter's names, so the InfiniBand dashboards and
alerts a site has for node_exporter's ``infiniband`` collector work on healer's agent unchanged.

Every scrape renders the newest frame's ports (no second sysfs read). Names and labels are node_exporter's
(``collector/infiniband_linux.go``): ``node_infiniband_<metric>{device="mlx5_0",port="1"}``, counters with
``_total``, the data counters in bytes (node_exporter, too, multiplies the kernel's 4-byte words by 4),
the rate in bytes per second, and a RoCE or IPoIB port's netdev flaps as node_exporter's netclass
collector names them, ``node_network_carrier_changes_total{device="<ifname>"}``. node_exporter has no
names for a driver's ``hw_counters/``; they are ``healer_rdma_hw_counter_total{device,port,counter}``.
A reading the port does not have (``None``) has no series.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from prometheus_client import core as prom_core
from prometheus_client import registry as prom_registry

from healer.schemas import fabric, telemetry

LABELS: Final = ("device", "port")
COUNTERS: Final[tuple[tuple[str, str, str], ...]] = (
    # (PortSample field, node_exporter name without _total, help)
    ("symbol_error", "node_infiniband_symbol_error",
     "minor link errors on one or more lanes (counters/symbol_error)"),
    ("link_error_recovery", "node_infiniband_link_error_recovery",
     "link error recoveries that succeeded (counters/link_error_recovery)"),
    ("link_downed", "node_infiniband_link_downed",
     "link error recoveries that failed and took the link down (counters/link_downed)"),
    ("port_rcv_errors", "node_infiniband_port_errors_received",
     "packets received with an error (counters/port_rcv_errors)"),
    ("port_rcv_remote_physical_errors", "node_infiniband_port_receive_remote_physical_errors",
     "packets received marked bad by the sender, EBP (counters/port_rcv_remote_physical_errors)"),
    ("port_xmit_discards", "node_infiniband_port_discards_transmitted",
     "outbound packets dropped, port down or congested (counters/port_xmit_discards)"),
    ("local_link_integrity_errors", "node_infiniband_local_link_integrity_errors",
     "local physical error counts past their threshold (counters/local_link_integrity_errors)"),
    ("excessive_buffer_overrun_errors", "node_infiniband_excessive_buffer_overrun_errors",
     "input buffer overruns (counters/excessive_buffer_overrun_errors)"),
    ("port_xmit_wait", "node_infiniband_port_transmit_wait",
     "ticks with data to send and nothing sent (counters/port_xmit_wait)"),
    ("port_xmit_data_bytes", "node_infiniband_port_data_transmitted_bytes",
     "bytes sent (counters/port_xmit_data x 4)"),
    ("port_rcv_data_bytes", "node_infiniband_port_data_received_bytes",
     "bytes received (counters/port_rcv_data x 4)"),
)  # fmt: skip
"""The PortCounters, as node_exporter's infiniband collector names them."""


class PortCollector(prom_registry.Collector):
    def __init__(self) -> None:
        self._ports: list[fabric.PortSample] = []

    def observe(self, frame: telemetry.NodeFrame) -> None:
        """The newest frame; the next scrape serves its ports."""
        self._ports = list(frame.ports or ())

    def collect(self) -> Iterator[prom_core.Metric]:
        ports = self._ports
        if not ports:
            return
        state = prom_core.GaugeMetricFamily(
            "node_infiniband_state_id", "port state (ports/<n>/state): 1 down, 2 init, 3 armed, 4 active, "
            "5 active defer", labels=LABELS,
        )  # fmt: skip
        phys = prom_core.GaugeMetricFamily(
            "node_infiniband_physical_state_id", "physical port state (ports/<n>/phys_state): 1 sleep, "
            "2 polling, 3 disabled, 4 training, 5 link up, 6 link error recovery, 7 phy test",
            labels=LABELS,
        )  # fmt: skip
        rate = prom_core.GaugeMetricFamily(
            "node_infiniband_rate_bytes_per_second",
            "active width x speed (ports/<n>/rate), bytes per second",
            labels=LABELS,
        )
        for p in ports:
            labels = [p.device, str(p.port)]
            if p.state is not None:
                state.add_metric(labels, float(p.state))
            if p.phys_state is not None:
                phys.add_metric(labels, float(p.phys_state))
            if p.rate_gbps is not None:
                rate.add_metric(labels, p.rate_gbps * 1e9 / 8)
        yield from (state, phys, rate)
        for field, name, help_text in COUNTERS:
            family = prom_core.CounterMetricFamily(name, help_text, labels=LABELS)
            for p in ports:
                value = getattr(p, field)
                if value is not None:
                    family.add_metric([p.device, str(p.port)], float(value))
            yield family
        hw = prom_core.CounterMetricFamily(
            "healer_rdma_hw_counter", "A driver's hw_counters/ of the port (mlx5: RoCE retransmission and "
            "congestion), by file name", labels=(*LABELS, "counter"),
        )  # fmt: skip
        carrier = prom_core.CounterMetricFamily(
            "node_network_carrier_changes",
            "link up/down transitions of the port's netdev (class/net/<ifname>/carrier_changes)",
            labels=("device",),
        )
        for p in ports:
            for name in fabric.HW_COUNTERS:
                value = getattr(p, name)
                if value is not None:
                    hw.add_metric([p.device, str(p.port), name], float(value))
            if p.netdev is not None and p.carrier_changes is not None:
                carrier.add_metric([p.netdev], float(p.carrier_changes))
        yield from (hw, carrier)
