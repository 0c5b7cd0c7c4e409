"""Burst absorption (#43): N fatal XIDs at once in a 10,000-node fleet, against the recording scheduler
(the controller alone), the real Slurm and the fake Kubernetes API server; NVSentinel's published figures
printed beside, labelled as published.

    nice -n 10 .venv/bin/python benchmarks/burst.py [--bursts 100,200,400,1000]
        [--backends memory,slurm,kubernetes] [--json FILE]

The harness is healer/evals/burst_bench.py (``healer bench burst`` runs its recording-scheduler rows);
this script adds the two schedulers from the test tree:

- **slurm**: tests/slurm/start.sh's real slurmctld with four real slurmd (gpu01-gpu04). The stand-in for
  the rest of the fleet: every one of the 10,000 healer node names is mapped (``node_map_file``) onto one
  of the four, so every node's cordon makes the real calls (``sinfo --json``, ``scontrol``, ``squeue``)
  against the real slurmctld; the first drain of each Slurm node is real, the others find it drained
  already (``already-done``). A slurmctld with 10,000 nodes would answer larger ``sinfo`` documents.
  The four are resumed between bursts.
- **kubernetes**: tests/fakes/fake_kube_api.py in a process of its own, a fresh one per burst, with all
  10,000 nodes and RBAC, answering at once (no network round trip, no etcd write: a lower bound for the
  API server's share).

Every burst runs on a nats-server of its own (no incident of an earlier burst to join).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import multiprocessing
import os
import pathlib
import subprocess
import sys
import tempfile
import zlib
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import structlog
import yaml

from healer import config, testing
from healer.actuators import kubernetes, slurm
from healer.evals import burst_bench
from tests.slurm import cluster as slurm_cluster

SLURM_NODES = slurm_cluster.NODES


def _actuator_settings(**kw: Any) -> config.ActuatorSettings:
    return config.ActuatorSettings(retry_attempts=3, retry_initial_delay_s=0.05, call_timeout_s=30, **kw)


class Slurm:
    """tests/slurm's cluster, started and stopped here (by the PIDs in its pid files)."""

    def __init__(self, tmp: pathlib.Path, fleet: int) -> None:
        self.state = pathlib.Path(tempfile.mkdtemp(prefix="healer-burst-slurm-"))
        self.state.chmod(0o711)
        self.env = {**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"}
        base = slurm_cluster._free_ports(5)
        start = slurm_cluster.HERE / "start.sh"
        subprocess.run([str(start), str(self.state), str(base), str(base + 1)], env=self.env, check=True,
                       capture_output=True, timeout=60)  # fmt: skip
        self.conf = self.state / "etc" / "slurm.conf"
        self.map = tmp / "slurm-map.yaml"
        names = {
            n: SLURM_NODES[zlib.crc32(n.encode()) % len(SLURM_NODES)]
            for n in map(burst_bench.node_name, range(fleet))
        }
        self.map.write_text(yaml.safe_dump(names))

    def actuator(self) -> slurm.SlurmActuator:
        settings = _actuator_settings(slurm_conf=str(self.conf), node_map_file=str(self.map))
        return slurm.SlurmActuator(settings, slurm.base.NodeNames.from_settings(settings))

    def resume(self) -> None:
        env = {**self.env, "SLURM_CONF": str(self.conf)}
        for node in SLURM_NODES:
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=env,
                           capture_output=True, timeout=30, check=False)  # fmt: skip

    def stop(self) -> None:
        stop = slurm_cluster.HERE / "stop.sh"
        subprocess.run([str(stop), str(self.state)], env=self.env, timeout=60, check=False)


def _kube_server(fleet: int, kubeconfig: str, ready: Any, done: Any) -> None:
    from tests.actuators.test_kube_actuator import rbac_rules
    from tests.fakes import fake_kube_api

    api = fake_kube_api.FakeKubeAPI(rbac_rules=rbac_rules())
    for i in range(fleet):
        api.add_node(burst_bench.node_name(i))
    api.start()
    api.write_kubeconfig(kubeconfig)
    ready.set()
    done.wait()
    api.stop()


def _one(n: int, make: Any, backend: str, tmp: pathlib.Path, rules: str, fleet: int) -> burst_bench.Result:
    result = asyncio.run(burst_bench.fresh_server_burst(n, make, backend, tmp, rules_dir=rules, fleet=fleet))
    print(burst_bench.table([result]).splitlines()[1], flush=True)
    return result


def _kube_burst(n: int, tmp: pathlib.Path, rules: str, fleet: int) -> burst_bench.Result:
    """One burst against a fresh fake API server (every node schedulable), in a process of its own."""
    ctx = multiprocessing.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    kubeconfig = str(tmp / f"kubeconfig-{n}")
    proc = ctx.Process(target=_kube_server, args=(fleet, kubeconfig, ready, done), daemon=True)
    proc.start()
    make = functools.partial(kubernetes.KubernetesActuator, _actuator_settings(kube_config=kubeconfig))
    try:
        ready.wait(120)
        return _one(n, make, "kubernetes (fake API)", tmp, rules, fleet)
    finally:
        done.set()
        proc.join(30)


def run(bursts: list[int], backends: list[str], fleet: int, rules: str) -> list[burst_bench.Result]:
    results: list[burst_bench.Result] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = pathlib.Path(tmp_name)
        for backend in backends:
            if backend == "memory":
                results += [
                    _one(n, testing.RecordingActuator, "recording scheduler", tmp, rules, fleet)
                    for n in bursts
                ]
            elif backend == "slurm":
                cluster = Slurm(tmp, fleet)
                try:
                    for n in bursts:
                        cluster.resume()
                        results.append(_one(n, cluster.actuator, "slurm (4 real + map)", tmp, rules, fleet))
                finally:
                    cluster.stop()
            elif backend == "kubernetes":
                results += [_kube_burst(n, tmp, rules, fleet) for n in bursts]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bursts", default="100,200,400,1000")
    parser.add_argument("--backends", default="memory,slurm,kubernetes")
    parser.add_argument("--fleet", type=int, default=burst_bench.FLEET)
    parser.add_argument("--rules", default="rules")
    parser.add_argument("--json", help="write every result here as JSON too")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    bursts = [int(x) for x in args.bursts.split(",") if x.strip()]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    print(f"burst of fatal XIDs in a {args.fleet:,}-node fleet, limits set to allow the burst", flush=True)
    results = run(bursts, backends, args.fleet, args.rules)
    print()
    print(burst_bench.table(results))
    for r in results:
        print(
            f"  {r.backend} N={r.n}: containment outcomes {r.contained.statuses}, publish {r.publish_s} s,"
            f" controller CPU {r.cpu_s} s, its subprocesses {r.children_cpu_s} s, wall {r.wall_s} s"
        )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
