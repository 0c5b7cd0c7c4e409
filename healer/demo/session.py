"""Running the demo: nats-server, controller, simulated fleet and observer, started and stopped in order.

Everything runs in this process except the nats-server (the embedded binary, a child process with its
state in a temporary directory). Start order: server → streams and buckets → controller (enforce mode,
the log actuator unless told otherwise, the power actuator that talks to the node agents) → observer →
the simulated fleet (``healer.agent.sim_fleet.LiveFleet``: frames, events and the agents' command
executors, so a power cap really cools the simulated GPU). Stop order is the reverse, and it runs however
the run ends: at the end of ``duration_s``, on ``stop`` (the CLI sets it on SIGINT / SIGTERM) or on an
error.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pathlib
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
import yaml

from healer import config, errors
from healer.actuators import factory, gpu_reset, power
from healer.agent import sim_fleet
from healer.bus import base, embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.controller.core import service
from healer.demo import stage, watch
from healer.schemas import codec
from healer.sim import scenarios, simulation

log = structlog.get_logger(__name__)


@dataclasses.dataclass
class Options:
    duration_s: float = 150.0
    nodes: int = 32
    gpus: int = 8
    seed: int = 0
    scenario: str | None = None
    """Scenario file; default: healer/demo/scenario.yaml."""
    rules: str | None = None
    """The rule pack; default: rules/ of the checkout."""
    overrides: str | None = None
    """Rules replacing the pack's rules of the same id; default healer/demo/rules/; "" for none."""
    actuator: str = "log"
    config_file: str | None = None
    slurm_nodes: tuple[str, ...] = ("gpu01", "gpu02", "gpu03", "gpu04")
    """With the Slurm actuator: the Slurm nodes the story's nodes stand for, in order of their faults."""
    warmup_s: float = stage.WARMUP_S
    model: str | None = None
    """Anomaly model; default: models/default of the checkout when present; "" for none."""
    ui: bool = True
    """Serve the status page (``ui`` settings; port 9744, or any free port when that one is taken)."""


Tick = Callable[[watch.Observer, float], None]
STRAGGLER_WINDOW_S = 15.0
"""The fail-slow scorer's window in the demo (the shipped 60 s would confirm a straggler after the
demo's 150 s): a straggler is named after 3 lagging windows, within about a minute."""


POWER_HOLD_S = 5.0
"""The power story's hold time (the shipped default is 10 s)."""
POWER_RESTORE_AFTER_S = 10.0
"""The power story's headroom before restoring, in one step (shipped: 120 s, 10 % steps): the demo's
rack is restored within its 150 s."""
DEMO_ACTIONS_PER_MINUTE = 200
"""A budget's per-GPU limits count in the rate limit: 32 GPUs capped, then restored, next to the rest of
the story's actions."""


def settings_for(opts: Options, url: str, rules_dir: pathlib.Path, tmp: pathlib.Path) -> config.Settings:
    raw = config.load(opts.config_file).model_dump()
    raw["nats"]["url"] = url
    raw["controller"].update(
        rules_dir=str(rules_dir),
        mode="enforce",
        actuator=opts.actuator,
        metrics_port=0,
        gpus_per_node=opts.gpus,
        max_gpus_per_node=max(opts.gpus, 16),
        cluster="demo",
        admission="first-seen",  # the simulated fleet is whatever the demo starts
    )
    sc = stage.load_scenario(opts.scenario)
    if sc.rack_size:  # the simulated fleet, admitted from an inventory whose entries carry their rack
        inventory = tmp / "inventory.yaml"
        inventory.write_text(yaml.safe_dump({"nodes": stage.inventory(sc, opts.nodes)}))
        raw["controller"].update(admission="file", inventory_file=str(inventory))
    if opts.config_file is None:  # room in the breaker for the rack's cordons before the mass fault
        raw["controller"].update(breaker_max_nodes=8, breaker_max_percent=25.0)
        raw["controller"].update(straggler_window_s=STRAGGLER_WINDOW_S)
        rack = stage.rack_nodes(sc, opts.nodes, "rack", stage.POWER_RACK) if sc.rack_size else []
        if rack:  # the power story (#30): the rack's budget, 80 % of what its GPUs draw at full load
            full_w = stage.full_load_w(sc, opts.nodes, opts.gpus, opts.seed, rack)
            raw["controller"].update(
                power_budgets=[{
                    "key": "rack", "value": stage.POWER_RACK, "hold_s": POWER_HOLD_S,
                    "contract_kw": round(stage.POWER_BUDGET_FRACTION * full_w / 1000.0, 2),
                    "restore_after_s": POWER_RESTORE_AFTER_S, "restore_step_percent": 100.0,
                }],
                actions_per_minute=DEMO_ACTIONS_PER_MINUTE,
            )  # fmt: skip
    model = stage.find_model(opts.model)
    if model is not None:
        raw["controller"]["model"] = str(model)
    if opts.actuator == "slurm" and not raw["actuators"].get("node_map_file"):
        sim = scenarios.build(sc, nodes=opts.nodes, gpus=opts.gpus, seed=opts.seed)
        mapping = dict(zip(stage.story_nodes(sim), opts.slurm_nodes, strict=False))
        (tmp / "node-map.yaml").write_text(yaml.safe_dump(mapping))
        raw["actuators"]["node_map_file"] = str(tmp / "node-map.yaml")
    return config.Settings.model_validate(raw)


async def run(
    opts: Options,
    *,
    stop: asyncio.Event | None = None,
    on_tick: Tick | None = None,
    say: Callable[[str], None] = lambda line: None,
    tick_s: float = 0.25,
) -> dict[str, Any]:
    """Run the demo; returns the summary (the dict ``--json`` prints)."""
    if opts.actuator not in ("log", "slurm"):
        raise errors.PermanentError(f"the demo runs the log or slurm actuator, not {opts.actuator!r}")
    stop = stop or asyncio.Event()
    sc = stage.load_scenario(opts.scenario)
    stage.check_fleet(sc, opts.nodes, opts.gpus, opts.seed)  # a bad fleet size fails here, early
    pack = stage.find_rule_pack(opts.rules)
    stage.check_rule_pack(pack)  # errors against the user's files, not the merged copy
    overrides = stage.default_overrides() if opts.overrides is None else (
        pathlib.Path(opts.overrides) if opts.overrides else None
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="healer-demo-") as tmp_name:
        tmp = pathlib.Path(tmp_name)
        replaced = stage.merge_rules(pack, overrides, tmp / "rules")
        with embedded.EmbeddedServer(tmp / "nats") as srv:
            log.info("demo.nats_started", pid=srv.pid, url=srv.url, tmp=str(tmp))
            say(f"nats-server (pid {srv.pid}) on {srv.url}, state in {tmp}")
            say(f"rules: {pack}, with {', '.join(replaced) or 'nothing'} replaced from {overrides}")
            s = settings_for(opts, srv.url, tmp / "rules", tmp)
            return await _run_with_server(opts, s, sc, stop, on_tick, say, tick_s)


async def _run_with_server(
    opts: Options,
    s: config.Settings,
    sc: scenarios.Scenario,
    stop: asyncio.Event,
    on_tick: Tick | None,
    say: Callable[[str], None],
    tick_s: float,
) -> dict[str, Any]:
    subj = subjects.Subjects(s.nats.prefix)
    buses: list[natsbus.NatsBus] = []
    names: list[str] = []
    ctl: service.Controller | None = None
    fleet: sim_fleet.LiveFleet | None = None
    fleet_stop = asyncio.Event()
    fleet_task: asyncio.Task[sim_fleet.Stats] | None = None
    page: Any = None
    story = stage.power_story(sc, s.controller, opts.nodes, opts.duration_s)
    power_watch = watch.PowerWatch(story.domain, story.names, story.budget_w) if story else None
    obs = watch.Observer(time.time(), power=power_watch)
    started = time.monotonic()
    try:

        async def connect(name: str) -> natsbus.NatsBus:
            bus = await natsbus.NatsBus.connect(s.nats.url, name=name, nats_settings=s.nats, retry=s.retry)
            buses.append(bus)
            names.append(name)
            return bus

        ctl_bus = await connect("healer-demo-controller")
        await provision.ensure(ctl_bus, subj, s.nats)
        gpu = gpu_reset.GpuRecoveryActuator(ctl_bus, subj, s.actuators)
        ctl = await service.build(
            s, ctl_bus, scheduler=factory.scheduler(s), gpu=gpu,
            power=lambda c: power.PowerActuator(ctl_bus, c, subj, s.actuators),
        )  # fmt: skip
        await ctl.start()
        say(f"controller: mode {s.controller.mode}, actuator {s.controller.actuator}")
        if opts.ui:
            page = await _status_page(await connect("healer-demo-ui"), s)
            say(f"status page: {page.url}")

        watch_bus = await connect("healer-demo-watch")
        await watch_bus.subscribe(subj.all_telemetry, _frames(obs))
        await watch_bus.subscribe(subj.all_incidents, _incidents(obs))

        sim = stage.build_fleet(
            sc, nodes=opts.nodes, gpus=opts.gpus, seed=opts.seed, start_ts=time.time(),
            warmup_s=opts.warmup_s, idle=story.nodes if story else (),
        )  # fmt: skip
        obs.t0 = sim.t
        fleet = sim_fleet.LiveFleet(sim, await connect("healer-demo-fleet"), subj, truth_sink=obs.on_truth)
        await fleet.start()
        fleet_task = asyncio.create_task(fleet.run(stop=fleet_stop), name="demo-fleet")
        say(f"fleet: {opts.nodes} simulated nodes x {opts.gpus} GPUs, scenario {sc.name!r}")
        log.info("demo.started", nodes=opts.nodes, duration_s=opts.duration_s)
        started = time.monotonic()
        await _play(opts, sim, obs, fleet_task, story, stop, on_tick, tick_s)
        await _final_breaker(ctl, obs)
    finally:
        fleet_stop.set()
        if fleet_task is not None:
            await _quietly("fleet", fleet_task)
        if fleet is not None:
            await _quietly("fleet commands", fleet.close())
        if page is not None:
            await _quietly("status page", page.stop())
        if ctl is not None:
            await _quietly("controller", ctl.stop())
        for name, bus in reversed(list(zip(names, buses, strict=True))):
            await _quietly(f"bus {name}", bus.close())
        log.info("demo.stopped")
    return obs.summary(
        duration_s=time.monotonic() - started, nodes=opts.nodes, gpus=opts.gpus, interrupted=stop.is_set()
    )


async def _play(
    opts: Options,
    sim: simulation.Simulation,
    obs: watch.Observer,
    fleet_task: asyncio.Task[sim_fleet.Stats],
    story: stage.PowerStory | None,
    stop: asyncio.Event,
    on_tick: Tick | None,
    tick_s: float,
) -> None:
    """The demo's run: until ``stop`` or ``opts.duration_s``, the power story's steps and ``on_tick`` each
    ``tick_s``; an error in the fleet ends it with that error."""
    started = time.monotonic()
    power_watch = obs.power
    jobs = 0  # the power story: 0 before its jobs start, 1 while they run, 2 after they end
    while not stop.is_set() and time.monotonic() - started < opts.duration_s:
        if story is not None and power_watch is not None:
            jobs = _power_story(story, power_watch, obs, sim, jobs, time.monotonic() - started)
        if fleet_task.done():
            fleet_task.result()  # an error in the fleet ends the demo with that error
            raise errors.PermanentError("the simulated fleet stopped")
        if on_tick is not None:
            on_tick(obs, time.time())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=tick_s)
    if on_tick is not None:
        on_tick(obs, time.time())


async def _final_breaker(ctl: service.Controller, obs: watch.Observer) -> None:
    """The breaker as the demo ends, for the summary (left as it was if KV does not answer in time)."""
    with contextlib.suppress(errors.HealerError, TimeoutError):
        status = await asyncio.wait_for(ctl.breaker.status(), timeout=STOP_STEP_S)
        obs.breaker = {
            **obs.breaker,
            "open": bool(status.get("open")),
            "reason": status.get("reason", obs.breaker.get("reason")),
            "nodes_in_window": len(status.get("entries", [])),
            "limit": ctl.breaker.limit(max(len(ctl.nodes), 1)),
        }


def _power_story(
    story: stage.PowerStory,
    pw: watch.PowerWatch,
    obs: watch.Observer,
    sim: simulation.Simulation,
    jobs: int,
    elapsed: float,
) -> int:
    """Start the story's jobs at ``start_s`` and end them at ``end_s``; returns the new step."""
    if jobs == 0 and elapsed >= story.start_s:
        stage.start_jobs(sim, story)
        pw.jobs_started_at = sim.t
        n = len(story.nodes)
        obs.note(
            sim.t, f"jobs start on {story.domain} ({n} node{'s' * (n != 1)}): its GPUs ramp to full load"
        )
        return 1
    if jobs == 1 and elapsed >= story.end_s:
        stage.end_jobs(sim, story)
        pw.jobs_ended_at = sim.t
        obs.note(sim.t, f"the jobs on {story.domain} end: its GPUs go idle")
        return 2
    return jobs


async def _status_page(bus: natsbus.NatsBus, s: config.Settings) -> Any:
    """The status page on the demo's NATS (healer.ui.server), on ``ui.port`` or, if that is taken, any."""
    from healer.ui import server

    try:
        return await server.start(bus, s)
    except errors.PermanentError:
        if s.ui.port == 0:
            raise
        log.warning("demo.ui_port_taken", port=s.ui.port)
        return await server.start(bus, s.model_copy(update={"ui": s.ui.model_copy(update={"port": 0})}))


STOP_STEP_S = 8.0
"""The longest one part of the demo may take to stop before the next is stopped anyway (and the part
that did not is named in the log), so a Ctrl-C always ends the demo within seconds."""


async def _quietly(what: str, work: Awaitable[Any]) -> None:
    """Stopping goes on whatever one part does: everything the demo started must be stopped."""
    try:
        await asyncio.wait_for(work, timeout=STOP_STEP_S)
    except TimeoutError:
        log.error("demo.stop_timed_out", what=what, after_s=STOP_STEP_S)
    except Exception as e:
        log.error("demo.stop_failed", what=what, error=repr(e))


def _frames(obs: watch.Observer) -> Callable[[base.Msg], Any]:
    async def on_frame(msg: base.Msg) -> None:
        try:
            obs.on_frame(codec.decode_frame(msg.data))
        except errors.DecodeError as e:
            log.warning("demo.bad_frame", reason=e.reason)

    return on_frame


def _incidents(obs: watch.Observer) -> Callable[[base.Msg], Any]:
    async def on_incident(msg: base.Msg) -> None:
        if msg.subject.endswith(".rules.rejected") or b'"io.healer.incident.' not in msg.data:
            return
        try:
            obs.on_incident(codec.decode_incident(msg.data))
        except errors.DecodeError as e:
            log.warning("demo.bad_incident", reason=e.reason)

    return on_incident
