"""The default pack's table in docs/rules.md, written from the rule files themselves.

The table is what an SRE reads before trusting the pack, so it must not drift from rules/*.yaml (it did:
the anomaly rule's hold read 600s while the file said 5m). ``table`` renders a RuleSet; ``update``
rewrites the part of a Markdown file between the ``BEGIN``/``END`` markers; ``make schemas`` runs
``python -m healer.rules.packdoc rules docs/rules.md`` and tests/rules/test_pack_docs.py fails when the
page and the files disagree.
"""

from __future__ import annotations

import pathlib
import sys

from healer import durations
from healer.rules import loader, ruleset

BEGIN = "<!-- default-pack table: generated from rules/*.yaml by `make schemas`; do not edit -->"
END = "<!-- end of default-pack table -->"
NONE = "\u2013"
"""An en dash: the cell of a rule without actions (as the hand-written table had it)."""


def condition(rule: ruleset.Rule) -> str:
    if rule.on_event is not None:
        text = f"on {rule.on_event.kind}"
        if rule.on_event.xids:
            text += " [" + ", ".join(str(x) for x in sorted(rule.on_event.xids)) + "]"
        for key, value in rule.on_event.details:
            text += f" {key}={str(value).lower() if isinstance(value, bool) else value}"
        if rule.on_event.repeat is not None:
            rep = rule.on_event.repeat
            text += f" x{rep.count} within {durations.to_text(rep.within_s)}"
            if rep.pids:
                text += f" from {rep.pids}+ processes"
    else:
        text = rule.when_text
    text = f"`{text}`"
    if rule.for_s:
        text += f", for {durations.to_text(rule.for_s)}"
    if rule.has_resolve and rule.resolve_text:
        text += f"; resolves when `{rule.resolve_text}`"
        if rule.resolve_for_s:
            text += f" for {durations.to_text(rule.resolve_for_s)}"
    if rule.cooldown_s:
        text += f"; cooldown {durations.to_text(rule.cooldown_s)}"
    return text


def table(rules: ruleset.RuleSet) -> str:
    lines = [
        "| file | rule | condition | severity | actions | on resolve |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for rule in sorted(rules.rules, key=lambda r: (pathlib.Path(r.path).stem, r.line)):
        actions = ", ".join(a.kind for a in rule.actions) or NONE
        on_resolve = ", ".join(a.kind for a in rule.on_resolve) or NONE
        cells = [pathlib.Path(rule.path).stem, f"`{rule.id}`", condition(rule), rule.severity]
        lines.append("| " + " | ".join([*cells, actions, on_resolve]) + " |")
    return "\n".join(lines) + "\n"


def update(markdown: str, rendered: str) -> str:
    """``markdown`` with the text between the markers replaced; ValueError if the markers are missing."""
    start, end = markdown.find(BEGIN), markdown.find(END)
    if start < 0 or end < start:
        raise ValueError("the page has no default-pack table markers")
    return markdown[: start + len(BEGIN)] + "\n" + rendered + markdown[end:]


def load(rules_dir: str | pathlib.Path) -> ruleset.RuleSet:
    result = loader.load_paths([rules_dir])
    if result.ruleset is None:
        raise ValueError("\n".join(str(d) for d in result.errors))
    return result.ruleset


def main(argv: list[str]) -> int:
    rules_dir, page = argv
    path = pathlib.Path(page)
    path.write_text(update(path.read_text(), table(load(rules_dir))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
