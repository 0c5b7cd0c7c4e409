"""The demo's terminal output: a live ``rich`` view on a terminal, plain lines elsewhere, and the summary.

Everything here reads the Observer; nothing here touches the bus. ``render`` builds one frame of the live
view (fleet health, hottest GPUs, cordoned nodes, open incidents, recent actions, the breaker);
``status_line`` and ``Observer.take_lines`` are the plain-text equivalent for logs and pipes;
``summary_text`` prints the summary a run ends with (``--json`` prints the same dict as JSON).
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from healer.demo import watch
from healer.schemas import incidents

SEVERITY_STYLE = {"info": "dim", "warning": "yellow", "major": "dark_orange", "critical": "bold red"}


def _where(node: str, gpu: int | None) -> str:
    return node if gpu is None else f"{node}/gpu{gpu}"


def _t(obs: watch.Observer, at: float) -> str:
    return f"{at - obs.t0:6.1f}s"


def render(obs: watch.Observer, now: float, *, duration_s: float, header: str) -> RenderableType:
    elapsed = now - obs.t0
    nodes = len(obs.frame_nodes)
    silent = obs.silent_nodes(now)
    cordoned = obs.cordoned()
    capped = obs.capped()
    breaker = obs.breaker
    title = Text.assemble(
        ("healer demo", "bold"),
        f"  {header}  t={elapsed:5.0f}s / {duration_s:.0f}s  ",
        ("BREAKER OPEN" if breaker.get("open") else "breaker closed", "bold white on red" if breaker.get(
            "open") else "green"),
    )  # fmt: skip

    health = Table(box=box.SIMPLE, show_header=False, expand=True)
    health.add_column("what", style="bold")
    health.add_column("value")
    health.add_row("nodes reporting", f"{nodes - len(silent)} / {nodes}" + (f"  silent: {', '.join(silent)}"
                   if silent else ""))  # fmt: skip
    health.add_row("GPUs", f"{len(obs.gpus)}  ({len(capped)} power-capped)")
    health.add_row("cordoned by healer", ", ".join(cordoned) or "-")
    if obs.power is not None:  # the power story's rack (#30): its GPUs' draw against its budget
        p = obs.power
        over = p.total() > p.budget_w
        health.add_row(
            f"power {p.domain}",
            Text(f"{p.total() / 1000:.1f} kW of {p.budget_w / 1000:.1f} kW", style="red" if over else ""),
        )
    health.add_row("frames / feed events", f"{obs.frames} / {obs.feed_events}")
    if breaker.get("open"):
        health.add_row("breaker", Text(str(breaker.get("reason", ""))[:160], style="red"))

    hot = Table(title="hottest GPUs", box=box.SIMPLE_HEAD, expand=True)
    for col in ("GPU", "temp", "power", "limit"):
        hot.add_column(col, justify="right" if col != "GPU" else "left")
    for g in obs.hottest(4):
        style = "red" if g.temp_c >= 85 else "yellow" if g.temp_c >= 80 else ""
        limit = f"{g.limit_w:.0f} W" + (" (capped)" if g.limit_w < g.default_w - 0.5 else "")
        hot.add_row(
            _where(g.node, g.index), Text(f"{g.temp_c:.0f} C", style=style), f"{g.power_w:.0f} W", limit
        )

    inc = Table(title="open incidents", box=box.SIMPLE_HEAD, expand=True)
    for col in ("opened", "severity", "rule", "where", "last action"):
        inc.add_column(col)
    for i in obs.open_incidents()[-8:]:
        last = i.actions[-1] if i.actions else None
        inc.add_row(
            _t(obs, i.opened_at),
            Text(i.severity, style=SEVERITY_STYLE.get(i.severity, "")),
            i.rule_id,
            _where(i.node, i.gpu),
            f"{last.kind}: {last.status}" if last else "-",
        )

    acts = Table(title="recent actions", box=box.SIMPLE_HEAD, expand=True)
    for col in ("at", "action", "status", "where", "rule"):
        acts.add_column(col)
    for a in obs.actions[-6:]:
        style = (
            "green"
            if a.status in watch.OK
            else "red"
            if a.status == incidents.ActionStatus.REFUSED
            else "yellow"
        )
        acts.add_row(_t(obs, a.at), a.kind, Text(a.status, style=style), _where(a.node, a.gpu), a.rule_id)

    lines = Text("\n".join(f"{_t(obs, at)}  {line}" for at, line in list(obs.log)[-4:]), style="dim")
    top = Table.grid(expand=True)
    top.add_column(ratio=1)
    top.add_column(ratio=1)
    top.add_row(health, hot)
    return Group(
        Panel(top, title=title, title_align="left"),
        inc,
        acts,
        Panel(lines, title="feed", title_align="left"),
    )


def status_line(obs: watch.Observer, now: float) -> str:
    hot = obs.hottest(1)
    hottest = f"{_where(hot[0].node, hot[0].index)} {hot[0].temp_c:.0f}C" if hot else "-"
    return (
        f"t={now - obs.t0:.0f}s nodes={len(obs.frame_nodes) - len(obs.silent_nodes(now))}/"
        f"{len(obs.frame_nodes)} hottest={hottest} capped={len(obs.capped())} "
        f"cordoned={len(obs.cordoned())} open_incidents={len(obs.open_incidents())} "
        f"breaker={'OPEN' if obs.breaker.get('open') else 'closed'}"
        + (
            f" {obs.power.domain}={obs.power.total() / 1000:.1f}/{obs.power.budget_w / 1000:.1f}kW"
            if obs.power
            else ""
        )
    )


def summary_text(s: dict[str, Any]) -> str:
    out = [
        "",
        f"healer demo summary ({s['fleet']['nodes']} nodes, {s['fleet']['gpus']} GPUs, "
        f"{s['duration_s']:.0f} s{', interrupted' if s['interrupted'] else ''})",
        f"  faults injected {s['faults_injected']}, detected {s['faults_detected']}, "
        f"acted on {s['faults_acted_on']}",
    ]
    for group in _grouped(s["faults"]):
        r = group[0]
        where = r["node"] + (f" GPU {r['gpu']}" if r["gpu"] is not None else "")
        if len(group) > 1:
            where = f"{len(group)} nodes ({', '.join(g['node'] for g in group[:3])}, ...)"
        latency = f"{r['latency_to_action_s']:.1f} s" if r["latency_to_action_s"] is not None else "-"
        out.append(
            f"  t={r['t_start_s']:6.1f}s {r['kind']:<20} {where:<20} rules: {', '.join(r['rules']) or '-'}"
        )
        out.append(
            f"            visible->first action {latency:>8}  actions: {', '.join(r['actions']) or '-'}"
            + ("  [resolved]" if r["resolved"] else "")
            + (" (each)" if len(group) > 1 else "")
        )
    out.append("  actions: " + ", ".join(f"{k} x{v}" for k, v in s["actions"].items()))
    out.append(f"  cordoned by healer: {', '.join(s['cordoned_nodes']) or '-'}")
    b = s["breaker"]
    out.append("  breaker: " + (f"OPEN ({b.get('reason')})" if b.get("open") else "closed"))
    if s["incidents"]["unexpected"]:
        out.append("  incidents without an injected fault: " + ", ".join(s["incidents"]["unexpected"]))
    out.append("  story: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in s["story"].items()))
    return "\n".join(out)


def _grouped(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Faults of one kind that started together and got the same handling print as one line."""
    groups: list[list[dict[str, Any]]] = []
    for r in rows:
        g = groups[-1] if groups else None
        if (
            g
            and r["kind"] == g[0]["kind"]
            and r["t_start_s"] == g[0]["t_start_s"]
            and r["actions"] == g[0]["actions"]
            and r["rules"] == g[0]["rules"]
        ):
            g.append(r)
        else:
            groups.append([r])
    return groups
