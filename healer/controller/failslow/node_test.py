"""The fail-slow scorer's node test: a whole node whose GPUs' median clock lags its job's other nodes'
(jobs on ``Settings.min_nodes`` nodes or more), ``persist`` windows in a row (#28)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from healer.controller.failslow import straggler_settings


class NodeTest:
    """Per (job, node): its lagging streak; ``score`` once per window."""

    def __init__(self, settings: straggler_settings.Settings) -> None:
        self.s = settings
        self.streak: dict[tuple[str, str], int] = {}

    def pending(self) -> set[str]:
        """Jobs with a node lagging but not (yet) a straggler."""
        return {job for (job, _), n in self.streak.items() if 0 < n < self.s.persist}

    def score(
        self,
        keys: Sequence[tuple[str, int]],
        codes: np.ndarray,
        job_names: Sequence[str],
        clock: np.ndarray,
        valid: np.ndarray,
    ) -> tuple[dict[str, list[str]], dict[tuple[str, int | None], straggler_settings.Straggler]]:
        """Whole nodes against their job's other nodes: each job's nodes with a loaded window (the port
        test compares them) and the nodes confirmed as stragglers. ``keys`` are the slots' (node, GPU),
        ``codes`` their job codes (``peer_stats.codes``), ``clock`` their mean clock ratios."""
        per: dict[tuple[int, str], list[float]] = {}
        for i in np.flatnonzero(valid & (codes >= 0)).tolist():
            per.setdefault((int(codes[i]), keys[i][0]), []).append(float(clock[i]))
        by_job: dict[int, dict[str, float]] = {}
        for (code, node), values in per.items():
            by_job.setdefault(code, {})[node] = float(np.median(values))
        job_nodes = {job_names[code]: list(nodes) for code, nodes in by_job.items()}
        found: dict[tuple[str, int | None], straggler_settings.Straggler] = {}
        seen: set[tuple[str, str]] = set()
        for code, nodes in by_job.items():
            if len(nodes) < self.s.min_nodes:
                continue
            arr = np.array(list(nodes.values()))
            med = float(np.median(arr))
            mad = max(1.4826 * float(np.median(np.abs(arr - med))), self.s.mad_floor)
            for node, v in nodes.items():
                key = (job_names[code], node)
                seen.add(key)
                lagging = (v - med) / mad <= -self.s.z_min and 1 - v / med >= self.s.min_deficit
                self.streak[key] = self.streak.get(key, 0) + 1 if lagging else 0
                if self.streak[key] >= self.s.persist:
                    ev: dict[str, float | str] = {
                        "straggler.job": job_names[code],
                        "straggler.node_clock_ratio": round(v, 4),
                        "straggler.reference_clock_ratio": round(med, 4),
                        "straggler.nodes": len(nodes),
                    }
                    job = job_names[code]
                    found[(node, None)] = straggler_settings.Straggler(node, None, job, "nodes", ev)
        for key in [k for k in self.streak if k not in seen]:
            del self.streak[key]
        return job_nodes, found
