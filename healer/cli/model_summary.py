"""The text summary of ``healer model eval``: per fault kind, against the static rules, false alarms."""

from __future__ import annotations

from typing import Any


def _minutes(v: float | None) -> str:
    return "-" if v is None else f"{v / 60:+.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def format_summary(result: dict[str, Any]) -> str:
    lines = [
        f"{'fault kind':<22} {'n':>3} {'recall':>7} {'prec':>6} {'rules':>6} "
        f"{'lead min':>9} {'flag lead':>9} {'lead>=10m':>9} {'model 1st':>9}  rule",
    ]
    for kind, k in result["per_kind"].items():
        lines.append(
            f"{kind:<22} {k['faults']:>3} {_pct(k['model_recall']):>7} {_pct(k['model_precision']):>6} "
            f"{_pct(k['rule_recall']):>6} {_minutes(k['median_lead_s']):>9} "
            f"{_minutes(k['median_flag_lead_s']):>9} "
            f"{_pct(k['share_lead_ge_600s']):>9} {_pct(k['share_model_first']):>9}  {k['rule'] or '-'}"
        )
    lines.append("")
    lines.append(
        f"{'vs static rule':<22} {'rule':<24} {'recall':>7} {'lead min':>9} {'before':>7} {'>=10m':>6} "
        f"{'flag before':>11} {'flag>=10m':>9}"
    )
    for kind, k in result["per_kind"].items():
        if k["static_rule"]:
            lines.append(
                f"{kind:<22} {k['static_rule']:<24} {_pct(k['static_rule_recall']):>7} "
                f"{_minutes(k['median_lead_vs_static_s']):>9} {_pct(k['share_before_static']):>7} "
                f"{_pct(k['share_10min_before_static']):>6} {_pct(k['share_flag_before_static']):>11} "
                f"{_pct(k['share_flag_10min_before_static']):>9}"
            )
    rate = result["model_false_per_1000_node_days"]
    rrate = result["rule_false_per_1000_node_days"]
    lines.append(
        f"healthy node-days {result['healthy_node_days']:.2f}: model false incidents "
        f"{result['model_false_incidents']} ({'-' if rate is None else f'{rate:.1f}'} per 1,000 node-days), "
        f"rules {result['rule_false_incidents']} ({'-' if rrate is None else f'{rrate:.1f}'} per 1,000)"
    )
    by_component = result.get("model_false_by_component") or {}
    if by_component:
        lines.append(
            "false incidents by component: " + ", ".join(f"{k} {v}" for k, v in sorted(by_component.items()))
        )
    held = result.get("healthy_max_held") or {}
    if held:
        top = max(held, key=held.__getitem__)
        lines.append(
            f"closest a healthy GPU came to an incident: {held[top]:.2f} of the level, held for the whole "
            f"hold ({top}; " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(held.items())) + ")"
        )
    return "\n".join(lines)
