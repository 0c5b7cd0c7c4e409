"""Fleet arrays → NodeFrame JSON bytes, without a pydantic model per GPU.

Validating 16,000 GpuSample models a second would cost more than the whole simulation, so the encoder
rounds each column the way NVML quantises it (temperatures and utilisation in whole units, power in
tenths of a watt, energy in millijoules), converts whole columns to Python lists in one call, and lets
orjson write the dicts. Tests decode the output with ``codec.decode_frame`` to keep it honest. The same
encoder serves live frames and frames rebuilt from a recording, so a replay is byte-for-byte the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson

from healer.schemas import telemetry
from healer.sim import profiles

FLOAT_FIELDS: Final = (("power_w", 1), ("power_limit_w", 1), ("energy_j", 3))
"""Float fields and the decimals they are rounded to."""

WHOLE_FIELDS: Final = ("temp_c", "mem_temp_c", "util_gpu_pct", "util_mem_pct", "mem_used_mib", "sm_clock_mhz")
"""Float fields NVML reports in whole units: rounded and written as JSON integers (cheaper to write;
they decode to the same floats)."""

INT_FIELDS: Final = (
    "clocks_event_reasons",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "ecc_sbe_aggregate",
    "ecc_dbe_aggregate",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "nvlink_links_up",
    "nvlink_crc_flit_errors",
    "nvlink_crc_data_errors",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
    "pcie_gen",
    "pcie_width",
    "pcie_replay_count",
    "recovery_action",
)
BOOL_FIELDS: Final = ("row_remap_pending", "row_remap_failure")
JOB_FIELD: Final = "job"
"""The GPU's job number (-1: no job), written as ``jobs: ["<run id>-j<number>"]`` (``[]``: none)."""
DYNAMIC_FIELDS: Final = (
    *(f for f, _ in FLOAT_FIELDS), *WHOLE_FIELDS, *INT_FIELDS, *BOOL_FIELDS, "present", JOB_FIELD,
)  # fmt: skip
"""Everything that changes from frame to frame (``present`` = the GPU answers on the bus)."""

AGENT_VERSION: Final = "healer-sim/0.1"


class Encoder:
    """Writes one step of the fleet as one JSON document per reporting node."""

    def __init__(
        self,
        node_names: Sequence[str],
        static: Sequence[Sequence[Mapping[str, Any]]],
        *,
        source: telemetry.Source = "sim",
        agent_version: str = AGENT_VERSION,
        job_prefix: str = "",
    ) -> None:
        self.node_names = list(node_names)
        self.job_prefix = job_prefix
        self._job_ids: dict[int, list[str]] = {-1: []}
        self.static = [[dict(g) for g in row] for row in static]
        self.gpus = len(static[0]) if static else 0
        self.source = source
        self.agent_version = agent_version
        self._float_names = tuple(f for f, _ in FLOAT_FIELDS)
        self._int_names = (*WHOLE_FIELDS, *INT_FIELDS)

    def encode(
        self,
        cols: Mapping[str, npt.NDArray[Any]],
        nodes: npt.NDArray[np.intp],
        seq: npt.NDArray[np.int64],
        boot_ids: Sequence[str],
        ts: float,
        ports: Any = None,
    ) -> list[tuple[int, bytes]]:
        """Frames of ``nodes`` (indices), with their ``seq`` and ``boot_ids`` (both indexed by node);
        ``ports``: the fleet's RDMA ports (sim/hca.py), which make the frames v2."""
        if not len(nodes):
            return []
        floats = np.stack(
            [np.round(cols[f][nodes].astype(np.float64), d) for f, d in FLOAT_FIELDS], axis=-1
        ).tolist()
        whole = [np.rint(cols[f][nodes]).astype(np.int64) for f in WHOLE_FIELDS]
        ints = np.stack(whole + [cols[f][nodes] for f in INT_FIELDS], axis=-1).tolist()
        bools = np.stack([cols[f][nodes] for f in BOOL_FIELDS], axis=-1).tolist()
        present = cols["present"][nodes].tolist()
        job_col = cols.get(JOB_FIELD)
        jobs = None if job_col is None else job_col[nodes].tolist()
        seqs = seq[nodes].tolist()
        ts = round(ts, 3)
        out = []
        fnames, inames, bnames = self._float_names, self._int_names, BOOL_FIELDS
        for k, n in enumerate(nodes.tolist()):
            static_row, frow, irow, brow, prow = self.static[n], floats[k], ints[k], bools[k], present[k]
            gpus = []
            for g in range(self.gpus):
                if not prow[g]:
                    continue
                d = static_row[g].copy()
                d.update(zip(fnames, frow[g]))  # noqa: B905 - lengths fixed by construction
                d.update(zip(inames, irow[g]))  # noqa: B905
                d.update(zip(bnames, brow[g]))  # noqa: B905
                if jobs is not None:
                    d["jobs"] = self._job(jobs[k][g])
                gpus.append(d)
            doc: dict[str, Any] = {
                "schema": telemetry.SCHEMA,
                "node": self.node_names[n],
                "ts": ts,
                "seq": seqs[k],
                "boot_id": boot_ids[n],
                "agent_version": self.agent_version,
                "source": self.source,
                "gpus_expected": self.gpus,
                "gpus": gpus,
            }
            if ports is not None:
                doc["schema"] = telemetry.SCHEMA_V2
                doc["ports"] = ports.docs(n)
            out.append((n, orjson.dumps(doc)))
        return out

    def job_id(self, no: int) -> str:
        """The id frames carry for job number ``no`` (``<run id>-j<number>``)."""
        return f"{self.job_prefix}-j{no}"

    def _job(self, no: int) -> list[str]:
        ids = self._job_ids.get(no)
        if ids is None:
            if len(self._job_ids) > 100_000:
                self._job_ids = {-1: []}
            ids = self._job_ids[no] = [self.job_id(no)]
        return list(ids)


def encode_event(event: Mapping[str, Any]) -> bytes:
    return orjson.dumps(event)


def static_fields(
    node_profiles: Sequence[profiles.Profile], uuids: Sequence[Sequence[str]]
) -> list[list[dict[str, Any]]]:
    """The GpuSample fields that never change, per node and GPU (``uuids[node][gpu]``)."""
    out = []
    for i, prof in enumerate(node_profiles):
        sheet = prof.sheet
        row = []
        for g in range(len(uuids[i])):
            row.append(
                {
                    "index": g,
                    "uuid": uuids[i][g],
                    "model": sheet.model,
                    "pci_bus_id": f"00000000:{0x18 + g * 0x10:02X}:00.0",
                    "slowdown_temp_c": sheet.slowdown_temp_c,
                    "shutdown_temp_c": sheet.shutdown_temp_c,
                    "mem_max_temp_c": sheet.mem_max_temp_c,
                    "power_default_w": sheet.power_default_w,
                    "power_min_w": sheet.power_min_w,
                    "power_max_w": sheet.power_max_w,
                    "mem_total_mib": sheet.mem_total_mib,
                    "sm_clock_max_mhz": sheet.sm_clock_max_mhz,
                    "nvlink_links_total": sheet.nvlink_links,
                    "pcie_gen_max": sheet.pcie_gen_max,
                    "pcie_width_max": sheet.pcie_width_max,
                }
            )
        out.append(row)
    return out
