"""The incident archive at fleet scale: a month of a 10,000-node fleet's incidents written into SQLite
through the archive's own write path, then ``healer report``'s figures and page built from it (#42).

Incidents are generated (seeded): each opens at a uniform time in the month on a random node (a GPU of
it, or the whole node for a tenth of them), is contained after 30 s to 10 min, and is repaired after a
log-normal time (median 1 h); one in twenty is still open at the end, one in ten ends a recovery ladder,
one in five gets an operator's verdict. Each incident is three events (opened, action, resolved), each
built and encoded as the controller does and stored with ``store.Archive.add_incident`` in batches of
64, as ``healer archive`` commits them.

Prints the write rate, the report's build and render times, and the file's size:

    .venv/bin/python benchmarks/archive_report.py [--nodes 10000] [--days 30] [--per-node-month 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import random
import tempfile
import time
from typing import Any

from healer.archive import figures, page, store
from healer.schemas import codec, incidents, verdicts

T0 = 1_798_761_600.0  # 2027-01-01 00:00 UTC
RULES: list[tuple[str, incidents.Severity, bool]] = [
    ("ecc-uncorrectable", "critical", False),
    ("xid-fatal", "critical", False),
    ("gpu-overheating", "warning", False),
    ("nvlink-crc-storm", "major", False),
    ("node-silent", "major", True),
]


def one_incident(rng: random.Random, n: int, nodes: int, span_s: float) -> list[incidents.IncidentEvent]:
    rule, severity, node_wide = RULES[n % len(RULES)] if n % 10 else RULES[4]
    node_wide = node_wide or n % 10 == 0
    opened = T0 + rng.uniform(0, span_s)
    contained = opened + rng.uniform(30, 600)
    repaired = contained + math.exp(rng.gauss(math.log(3600), 1.0))
    data = incidents.IncidentData(
        incident_id=f"inc-{n:07d}", rule_id=rule, severity=severity, node=f"node-{rng.randrange(nodes):05d}",
        gpu_index=None if node_wide else rng.randrange(8), state="open", summary=f"generated incident {n}",
        evidence={"gpus_expected": 8} if node_wide else {}, mode="enforce",
    )  # fmt: skip
    cordon = incidents.ActionRecord(kind="cordon", status="done", at=contained)
    iid = data.incident_id
    out = [
        incidents.build(event_id=f"{iid}.1", cluster="bench", change="opened", data=data, ts=opened),
        incidents.build(
            event_id=f"{iid}.2", cluster="bench", change="action",
            data=data.model_copy(update={"actions": [cordon]}), ts=contained,
        ),
    ]  # fmt: skip
    if n % 20 and repaired < T0 + span_s:
        evidence = {"ladder": "gpu", "outcome": "recovered"} if n % 10 == 1 else {}
        done = data.model_copy(
            update={"actions": [cordon], "state": incidents.IncidentState.RESOLVED, "evidence": evidence}
        )
        out.append(
            incidents.build(event_id=f"{iid}.3", cluster="bench", change="resolved", data=done, ts=repaired)
        )
    return out


def generate(
    db: store.Archive, *, nodes: int, days: float, per_node_month: float, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    span_s = days * 86400
    count = round(nodes * per_node_month * days / 30)
    events = 0
    started = time.perf_counter()
    for n in range(count):
        for ev in one_incident(rng, n, nodes, span_s):
            events += 1
            db.add_incident(ev, codec.encode(ev), events)
        if n % 5 == 0:
            v = verdicts.Verdict.CONFIRMED if n % 3 else verdicts.Verdict.FALSE_ALARM
            data = verdicts.VerdictData(incident_id=f"inc-{n:07d}", verdict=v, by="bench")
            vev = verdicts.build(cluster="bench", data=data, ts=T0 + span_s, event_id=f"v-{n}")
            events += 1
            db.add_verdict(vev, codec.encode(vev), events)
        if n % 64 == 63:
            db.commit()
    db.commit()
    elapsed = time.perf_counter() - started
    return {"incidents": count, "events": events, "seconds": elapsed, "events_per_s": events / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--per-node-month", type=float, default=1.0, help="incidents per node per 30 days")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "archive.db"
        with store.Archive(path) as db:
            written = generate(
                db, nodes=args.nodes, days=args.days, per_node_month=args.per_node_month, seed=args.seed
            )
        opts = figures.Options(
            end=T0 + args.days * 86400, since_s=args.days * 86400, fleet_gpus=args.nodes * 8
        )
        started = time.perf_counter()
        with store.Archive(path, readonly=True) as db:
            report = figures.build(db, opts)
        built = time.perf_counter() - started
        started = time.perf_counter()
        html = page.render(report)
        rendered = time.perf_counter() - started
        size = sum(p.stat().st_size for p in pathlib.Path(tmp).iterdir())
    result: dict[str, Any] = {
        "fleet": {
            "nodes": args.nodes,
            "days": args.days,
            "per_node_month": args.per_node_month,
            "seed": args.seed,
        },
        "write": written,
        "report": {
            "build_s": built,
            "render_s": rendered,
            "html_bytes": len(html),
            "incidents": report["totals"]["incidents"],
        },
        "archive_bytes": size,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    w = result["write"]
    print(
        f"{args.nodes} nodes, {args.days:g} days: {w['incidents']} incidents, {w['events']} events "
        f"written in {w['seconds']:.1f} s ({w['events_per_s']:.0f}/s), archive {size / 2**20:.1f} MiB; "
        f"report built in {built:.2f} s, page rendered in {rendered:.3f} s ({len(html) / 1024:.0f} KiB)"
    )


if __name__ == "__main__":
    main()
