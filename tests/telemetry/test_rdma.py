"""The RDMA port reader against the recorded sysfs trees in tests/fixtures/sysfs (ConnectX-7 InfiniBand,
ConnectX-6 Dx RoCE; healthy and one tree per fault), as the kernel lays them out."""

from __future__ import annotations

import pathlib
import shutil

import pytest
import structlog

from healer.schemas import codec, fabric, telemetry
from healer.telemetry import rdma

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"


def tree(tmp_path: pathlib.Path, name: str) -> pathlib.Path:
    root = tmp_path / name.removesuffix(".txt")
    return rdma.write_tree((FIXTURES / name).read_text(), root)


def by_name(ports: list[fabric.PortSample]) -> dict[str, fabric.PortSample]:
    return {p.name: p for p in ports}


def test_healthy_connectx7_infiniband_node_reads_eight_active_400g_ports(tmp_path: pathlib.Path) -> None:
    reader = rdma.PortReader(tree(tmp_path, "cx7-ib-healthy.txt"))
    ports = reader.read()
    assert [p.name for p in ports] == [f"mlx5_{i}/1" for i in range(8)]
    for p in ports:
        assert (p.state, p.phys_state, p.rate_gbps, p.link_layer) == (4, 5, 400.0, "InfiniBand")
        assert p.symbol_error == p.link_downed == p.port_rcv_errors == 0
        assert (p.netdev, p.carrier_changes) == (None, None), "a plain IB port has no netdev"
        assert p.out_of_sequence == 0, "mlx5 hw_counters are read where present"
        assert p.np_cnp_sent is None, "an IB port has no RoCE congestion counters"
    first = ports[0]
    words = 81_234_567_890 * 97  # the recorded counters/port_xmit_data of mlx5_0: octets divided by 4
    assert first.port_xmit_data_bytes == first.port_rcv_data_bytes == words * 4
    assert first.port_xmit_wait == 4_210_337
    assert reader.read_errors == 0


def test_roce_ports_carry_their_netdev_carrier_changes_and_congestion_counters(
    tmp_path: pathlib.Path,
) -> None:
    ports = by_name(rdma.PortReader(tree(tmp_path, "cx6dx-roce-healthy.txt")).read())
    assert set(ports) == {"mlx5_0/1", "mlx5_1/1"}
    p = ports["mlx5_1/1"]
    assert (p.link_layer, p.netdev, p.carrier_changes, p.rate_gbps) == ("Ethernet", "ens2f0np0", 2, 100.0)
    assert (p.np_cnp_sent, p.rp_cnp_handled, p.np_ecn_marked_roce_packets) == (1532, 1611, 1540)


@pytest.mark.parametrize(
    ("fixture", "port", "expect"),
    [
        ("cx7-ib-link-down.txt", "mlx5_3/1", {"state": 1, "phys_state": 2, "rate_gbps": 10.0}),
        ("cx7-ib-flap.txt", "mlx5_2/1", {"state": 4, "link_downed": 6, "link_error_recovery": 14}),
        ("cx7-ib-downtrained.txt", "mlx5_5/1", {"state": 4, "rate_gbps": 200.0}),
        ("cx7-ib-symbol-errors.txt", "mlx5_1/1", {"symbol_error": 65535, "port_rcv_errors": 2210}),
        ("cx7-ib-congested.txt", "mlx5_4/1", {"port_xmit_wait": 9_904_210_337}),
        ("cx6dx-roce-flap.txt", "mlx5_1/1", {"carrier_changes": 14, "roce_adp_retrans": 88}),
        ("cx6dx-roce-down.txt", "mlx5_0/1", {"state": 1, "phys_state": 3, "carrier_changes": 3}),
    ],
)
def test_each_fault_tree_reads_as_its_fault(
    tmp_path: pathlib.Path, fixture: str, port: str, expect: dict[str, object]
) -> None:
    ports = by_name(rdma.PortReader(tree(tmp_path, fixture)).read())
    got = {k: getattr(ports[port], k) for k in expect}
    assert got == expect
    others = [p for name, p in ports.items() if name != port]
    assert all(p.state == 4 and p.symbol_error == 0 for p in others), "the fault is on one port only"


def test_missing_hca_is_a_missing_port(tmp_path: pathlib.Path) -> None:
    ports = rdma.PortReader(tree(tmp_path, "cx7-ib-missing-hca.txt")).read()
    assert len(ports) == 7
    assert "mlx5_6/1" not in by_name(ports)


def test_a_node_without_rdma_reports_no_ports_and_no_error(tmp_path: pathlib.Path) -> None:
    reader = rdma.PortReader(tmp_path / "empty-sys")
    assert reader.read() == []
    assert reader.read_errors == 0


def test_an_hca_that_falls_off_between_frames_is_gone_from_the_next_frame(tmp_path: pathlib.Path) -> None:
    now = [0.0]
    root = tree(tmp_path, "cx7-ib-healthy.txt")
    reader = rdma.PortReader(root, rescan_s=3600, clock=lambda: now[0])
    assert len(reader.read()) == 8
    shutil.rmtree(root / "class/infiniband/mlx5_6")
    assert len(reader.read()) == 7, "its files vanished: the port is left out at once"
    assert [p.name for p in reader.read()] == [f"mlx5_{i}/1" for i in range(8) if i != 6]
    assert reader.scans == 2, "a vanished port triggers one rescan, not one per frame"


def test_a_new_hca_is_found_at_the_next_rescan(tmp_path: pathlib.Path) -> None:
    now = [0.0]
    root = tree(tmp_path, "cx7-ib-missing-hca.txt")
    reader = rdma.PortReader(root, rescan_s=30, clock=lambda: now[0])
    assert len(reader.read()) == 7
    rdma.write_tree((FIXTURES / "cx7-ib-healthy.txt").read_text(), root)
    now[0] = 29.0
    assert len(reader.read()) == 7
    now[0] = 30.0
    assert len(reader.read()) == 8


def test_an_unparsable_file_is_null_counted_and_logged_once(tmp_path: pathlib.Path) -> None:
    root = tree(tmp_path, "cx7-ib-healthy.txt")
    (root / "class/infiniband/mlx5_0/ports/1/counters/symbol_error").write_text("garbage\n")
    reader = rdma.PortReader(root)
    with structlog.testing.capture_logs() as logs:
        first = reader.read()
        reader.read()
    assert (first[0].symbol_error, first[0].link_downed) == (None, 0), "only that reading is lost"
    assert first[1].symbol_error == 0
    assert reader.read_errors == 2
    assert [e["event"] for e in logs].count("rdma.unreadable") == 1


def test_netdev_from_the_pci_device_when_there_is_no_gid_table(tmp_path: pathlib.Path) -> None:
    root = tree(tmp_path, "cx6dx-roce-healthy.txt")
    port = root / "class/infiniband/mlx5_0/ports/1"
    shutil.rmtree(port / "gid_attrs")
    (root / "class/infiniband/mlx5_0/device/net/ens1f0np0").mkdir(parents=True)
    assert by_name(rdma.PortReader(root).read())["mlx5_0/1"].netdev == "ens1f0np0"


def test_a_recording_line_may_not_escape_the_root(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="not a recorded sysfs line"):
        rdma.write_tree("../../etc/passwd:x", tmp_path / "root")


def test_ports_travel_in_a_v2_frame_and_a_frame_without_them_stays_v1(tmp_path: pathlib.Path) -> None:
    ports = rdma.PortReader(tree(tmp_path, "cx6dx-roce-healthy.txt")).read()
    common = {"node": "n1", "ts": 1.0, "seq": 0, "boot_id": "b", "agent_version": "t", "source": "sim"}
    v2 = telemetry.NodeFrame(**common, gpus=[], ports=ports, schema=telemetry.SCHEMA_V2)
    data = codec.encode(v2)
    assert codec.decode_frame(data) == v2
    view = codec.decode_frame_view(data)
    assert type(view) is not telemetry.NodeFrame, "a well-formed v2 frame takes the strict fast path"
    assert [p.carrier_changes for p in view.ports] == [2, 2]  # type: ignore[attr-defined]
    v1 = codec.encode(telemetry.NodeFrame(**common, gpus=[]))
    assert b'"ports"' not in v1
    assert b'"healer.telemetry.v1"' in v1
