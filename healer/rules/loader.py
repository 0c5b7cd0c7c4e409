"""Load rule files into a RuleSet, or report every error at once with its file:line:column.

YAML is composed (not just loaded) so each value keeps its position; the structure is checked per rule
against ``spec.RuleSpec`` and pydantic's error locations are mapped back to those positions; expressions
are parsed with errors placed at the column inside the ``when`` string. One bad rule never hides the
errors of the next. ``load_paths`` is a pure function: the caller (the controller's hot reload) keeps the
previous RuleSet when the result is not ``ok``.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterable
from typing import Any

import pydantic
import yaml

from healer import actions, durations
from healer.rules import parser, recovery, ruleset, spec, tree
from healer.schemas import fields, incidents

RULE_SUFFIXES = (".yaml", ".yml")
MAX_NODES = 100_000
"""Values in one file once aliases are expanded; past it the file is refused (alias bombs)."""


def expand(paths: Iterable[str | pathlib.Path]) -> list[pathlib.Path]:
    """Files as given; directories become their *.yaml / *.yml files (not recursive), sorted."""
    out: list[pathlib.Path] = []
    for raw in paths:
        path = pathlib.Path(raw)
        if path.is_dir():
            out += sorted(p for p in path.iterdir() if p.suffix in RULE_SUFFIXES and p.is_file())
        else:
            out.append(path)
    return out


def load_paths(paths: Iterable[str | pathlib.Path]) -> ruleset.LoadResult:
    """Every rule of every file, or every error. Warnings never stop a load."""
    files = expand(paths)
    diags: list[ruleset.Diagnostic] = []
    rules: list[ruleset.Rule] = []
    ladder_list: list[recovery.Ladder] = []
    ids: list[tuple[str, str, int]] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            diags.append(ruleset.Diagnostic(str(path), 0, 0, f"cannot read: {e}"))
            continue
        f = _load_text(text, str(path))
        rules += f.rules
        ladder_list += f.ladders
        diags += f.diags
        ids += [(rule_id, f.path, line) for rule_id, line in f.ids]
    if not files:
        diags.append(ruleset.Diagnostic("<paths>", 0, 0, "no rule files found"))
    return _finish(rules, diags, tuple(str(p) for p in files), ids, ladder_list)


def load_text(text: str, path: str = "<string>") -> ruleset.LoadResult:
    f = _load_text(text, path)
    ids = [(rule_id, path, line) for rule_id, line in f.ids]
    return _finish(f.rules, f.diags, (path,), ids, f.ladders)


def _finish(
    rules: list[ruleset.Rule],
    diags: list[ruleset.Diagnostic],
    files: tuple[str, ...],
    ids: list[tuple[str, str, int]],
    ladder_list: list[recovery.Ladder] | None = None,
) -> ruleset.LoadResult:
    ladder_list = ladder_list or []
    _check_ladders(ladder_list, {rule_id for rule_id, _, _ in ids}, diags)
    first: dict[str, tuple[str, int]] = {}
    for rule_id, path, line in ids:
        if rule_id in first:
            prev_path, prev_line = first[rule_id]
            message = f"duplicate rule id {rule_id!r} (first at {prev_path}:{prev_line})"
            diags.append(ruleset.Diagnostic(path, line, 5, message))
        else:
            first[rule_id] = (path, line)
    diags.sort(key=lambda d: (d.path, d.line, d.col))
    ok = not any(d.severity == "error" for d in diags)
    result = ruleset.RuleSet(tuple(rules), files, tuple(ladder_list)) if ok else None
    return ruleset.LoadResult(result, tuple(diags))


def _check_ladders(
    ladder_list: list[recovery.Ladder], rule_ids: set[str], diags: list[ruleset.Diagnostic]
) -> None:
    """Every ladder id once; every rule a ladder names exists and belongs to one ladder only."""
    seen: dict[str, recovery.Ladder] = {}
    owner: dict[str, recovery.Ladder] = {}
    for lad in ladder_list:
        if lad.id in seen:
            first = seen[lad.id]
            message = f"duplicate ladder id {lad.id!r} (first at {first.path}:{first.line})"
            diags.append(ruleset.Diagnostic(lad.path, lad.line, 5, message))
        seen.setdefault(lad.id, lad)
        for rule_id in lad.rules:
            if rule_id not in rule_ids:
                message = f"ladder {lad.id!r} names rule {rule_id!r}, which no rule file defines"
                diags.append(ruleset.Diagnostic(lad.path, lad.line, 5, message))
            elif rule_id in owner:
                message = f"rule {rule_id!r} is in ladder {owner[rule_id].id!r} already (one ladder per rule)"
                diags.append(ruleset.Diagnostic(lad.path, lad.line, 5, message))
            else:
                owner[rule_id] = lad


class _File:
    def __init__(self, text: str, path: str) -> None:
        self.text = text
        self.path = path
        self.diags: list[ruleset.Diagnostic] = []
        self.ids: list[tuple[str, int]] = []
        self.rules: list[ruleset.Rule] = []
        self.ladders: list[recovery.Ladder] = []

    def at(self, node: yaml.Node, message: str, severity: str = "error") -> None:
        mark = node.start_mark
        self.diags.append(ruleset.Diagnostic(self.path, mark.line + 1, mark.column + 1, message, severity))  # type: ignore[arg-type]

    def inside(self, node: yaml.ScalarNode, offset: int, message: str) -> None:
        line, col = _locate(node, offset)
        self.diags.append(ruleset.Diagnostic(self.path, line, col, message))


def _load_text(text: str, path: str) -> _File:
    f = _File(text, path)
    try:
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
            data = loader.construct_document(root) if root is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        f.diags.append(ruleset.Diagnostic(path, line, col, f"YAML: {e.problem or e.context}"))
        return f
    except yaml.YAMLError as e:
        f.diags.append(ruleset.Diagnostic(path, 0, 0, f"YAML: {e}"))
        return f
    if root is None:
        f.diags.append(ruleset.Diagnostic(path, 1, 1, "empty file: expected 'rules:'"))
        return f
    budget = [MAX_NODES]
    cycle = _cycle(root, [], budget)
    if cycle is not None:
        problem = "recursive YAML alias: a value that contains itself"
        f.at(
            cycle,
            problem if budget[0] > 0 else f"too large: more than {MAX_NODES} values once aliases expand",
        )
        return f
    _check_duplicate_keys(f, root)
    if not isinstance(root, yaml.MappingNode) or not isinstance(data, dict):
        f.at(root, "the top level must be a mapping with 'rules:'")
        return f
    for key_node, _ in root.value:
        if key_node.value not in ("rules", "ladders"):
            message = f"unknown top-level key {key_node.value!r} (only 'rules' and 'ladders' are allowed)"
            f.at(key_node, message)
    ladders_node = _child(root, "ladders")
    if ladders_node is not None:
        _load_ladders(f, ladders_node, data["ladders"])
    rules_node = _child(root, "rules")
    if rules_node is None and ladders_node is not None:
        return f  # a file of ladders only
    if rules_node is None or not isinstance(rules_node, yaml.SequenceNode):
        f.at(rules_node or root, "'rules' must be a list of rules")
        return f
    for node, raw in zip(rules_node.value, data["rules"], strict=True):
        rule = _load_rule(f, node, raw)
        if rule is not None:
            f.rules.append(rule)
    return f


def _load_ladders(f: _File, node: yaml.Node, raw: Any) -> None:
    if not isinstance(node, yaml.SequenceNode) or not isinstance(raw, list):
        f.at(node, "'ladders' must be a list of ladders")
        return
    for item_node, item in zip(node.value, raw, strict=True):
        if not isinstance(item_node, yaml.MappingNode):
            f.at(item_node, "a ladder must be a mapping (id, rules, steps ...)")
            continue
        try:
            s = recovery.LadderSpec.model_validate(item)
        except pydantic.ValidationError as e:
            _structure_errors(f, item_node, e)
            continue
        f.ladders.append(recovery.build(s, f.path, item_node.start_mark.line + 1))


def _load_rule(f: _File, node: yaml.Node, raw: Any) -> ruleset.Rule | None:
    if not isinstance(node, yaml.MappingNode):
        f.at(node, "a rule must be a mapping (id, when, severity, actions ...)")
        return None
    raw = raw if isinstance(raw, dict) else {}
    rule_id = raw.get("id")
    if isinstance(rule_id, str):
        f.ids.append((rule_id, node.start_mark.line + 1))
    s, structure_ok = _rule_spec(f, node, raw)
    if s is None:
        return None
    before = len([d for d in f.diags if d.severity == "error"])
    when_node = _child(node, "when")
    when = None
    if s.when is not None and s.on_event is not None:
        f.at(_child(node, "on_event") or node, "a rule has either 'when' or 'on_event', not both")
    elif s.when is None and s.on_event is None:
        f.at(node, f"rule {s.id!r} needs 'when' (a condition) or 'on_event'")
    elif s.when is not None:
        when = _expr(f, when_node, s.when, s.scope)
    resolve_when, resolve_for_s = _resolve(f, node, s)
    _check_event_and_labels(f, node, s)
    repeat = _repeat(f, node, s)
    node_wide = _node_wide(f, node, s)
    acts = _actions(f, _child(node, "actions"), s.actions)
    on_resolve = _actions(f, _child(node, "on_resolve"), s.on_resolve)
    if not structure_ok or len([d for d in f.diags if d.severity == "error"]) > before:
        return None
    rule = ruleset.Rule(
        id=s.id,
        severity=s.severity,
        scope=s.scope,
        description=s.description,
        match=ruleset.Match(s.match.model, s.match.node, tuple(sorted(s.match.labels.items()))),
        when=when,
        when_text=s.when or "",
        on_event=ruleset.EventMatch(
            s.on_event.kind,
            frozenset(s.on_event.xid) if s.on_event.xid else None,
            repeat,
            tuple(sorted(s.on_event.details.items())),
        )
        if s.on_event
        else None,
        for_s=durations.value(s.for_) if s.for_ is not None else 0.0,
        labels=dict(s.labels),
        actions=acts,
        resolve_when=resolve_when,
        resolve_text=(s.resolve.when or "") if s.resolve else "",
        resolve_for_s=resolve_for_s,
        has_resolve=s.resolve is not None,
        on_resolve=on_resolve,
        cooldown_s=durations.value(s.cooldown) if s.cooldown is not None else 0.0,
        node_wide=node_wide,
        path=f.path,
        line=node.start_mark.line + 1,
    )
    _lint(f, node, rule)
    return rule


def _rule_spec(f: _File, node: yaml.Node, raw: dict[str, Any]) -> tuple[spec.RuleSpec | None, bool]:
    """The rule's structure, and whether it was valid as written. An invalid one is reported and what is
    left of it validated anyway, so one typo does not hide the next mistake (None: nothing is left)."""
    try:
        return spec.RuleSpec.model_validate(raw), True
    except pydantic.ValidationError as e:
        _structure_errors(f, node, e)
        bad = {err["loc"][0] for err in e.errors() if err["loc"]}
        lenient = {k: v for k, v in raw.items() if k not in bad}
        lenient.setdefault("id", "invalid")
        lenient.setdefault("severity", "info")
        try:
            return spec.RuleSpec.model_validate(lenient), False
        except pydantic.ValidationError:
            return None, False


def _resolve(f: _File, node: yaml.Node, s: spec.RuleSpec) -> tuple[tree.Node | None, float]:
    """The rule's resolve condition and quiet time (an event rule resolves by time only)."""
    resolve_when = None
    resolve_for_s = 0.0
    if s.resolve is not None:
        rnode = _child(node, "resolve") or node
        if s.resolve.when is not None:
            if s.on_event is not None:
                f.at(rnode, "an event rule resolves by time only: resolve: {for: 1h}")
            else:
                resolve_when = _expr(f, _child(rnode, "when"), s.resolve.when, s.scope)
        resolve_for_s = durations.value(s.resolve.for_) if s.resolve.for_ is not None else 0.0
        if s.on_event is not None and resolve_for_s <= 0:
            f.at(rnode, "an event rule's resolve needs 'for' (quiet time after the last event)")
    return resolve_when, resolve_for_s


def _check_event_and_labels(f: _File, node: yaml.Node, s: spec.RuleSpec) -> None:
    """What an event rule may not say, and the label the controller reserves."""
    if s.on_event is not None:
        if s.for_ is not None:
            f.at(_child(node, "for") or node, "'for' does not apply to on_event rules (events fire at once)")
        if s.on_event.xid is not None and s.on_event.kind not in ("xid", "sxid"):
            f.at(_child(node, "on_event") or node, "'xid' only applies to on_event kind xid or sxid")
    if s.scope == fields.Scope.PORT and s.on_event is not None:
        f.at(
            _child(node, "scope") or node,
            "no node event names an RDMA port: an on_event rule has scope gpu or node",
        )
    if incidents.PORT_LABEL in s.labels:
        reserved = f"label {incidents.PORT_LABEL!r} is the controller's"
        f.at(_child(node, "labels") or node, f"{reserved} (a port-scope rule's incident names its port)")


def _repeat(f: _File, node: yaml.Node, s: spec.RuleSpec) -> ruleset.Repeat | None:
    if s.on_event is None or s.on_event.repeat is None:
        return None
    r = s.on_event.repeat
    within_s = durations.value(r.within) if r.within is not None else 0.0
    if within_s <= 0:
        where = _child(_child(_child(node, "on_event") or node, "repeat") or node, "within")
        f.at(where or node, "repeat.within must be longer than 0s (a window such as 10m)")
    return ruleset.Repeat(r.count, within_s, r.pids)


def _node_wide(f: _File, node: yaml.Node, s: spec.RuleSpec) -> ruleset.NodeWide | None:
    if s.node_wide is None:
        return None
    where = _child(node, "node_wide") or node
    if s.scope != fields.Scope.GPU:
        f.at(where, "node_wide groups GPU firings into a node incident: it needs scope gpu")
    nw = s.node_wide
    within_s = durations.value(nw.within) if nw.within is not None else ruleset.NODE_WIDE_WITHIN_S
    if within_s <= 0:
        f.at(_child(where, "within") or where, "node_wide.within must be longer than 0s (such as 2m)")
    return ruleset.NodeWide(nw.group or s.id, nw.min_gpus, nw.fraction, within_s, tuple(nw.joins))


def _structure_errors(f: _File, node: yaml.Node, e: pydantic.ValidationError) -> None:
    seen = set()
    for err in e.errors():
        target = _find(node, err["loc"], key=err["type"] == "extra_forbidden")
        where = ".".join(str(p) for p in err["loc"] if isinstance(p, str | int))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown field {where!r}"
        elif err["type"] == "missing":
            msg = f"missing required field {where!r}"
        else:
            msg = f"{where}: {msg}"
        if (id(target), msg) not in seen:
            seen.add((id(target), msg))
            f.at(target, msg)


def _lint(f: _File, node: yaml.Node, rule: ruleset.Rule) -> None:
    kinds = set(rule.action_kinds)
    acts = any(not actions.spec(k).published_only for k in kinds)  # notify only records: nothing to undo
    if rule.on_event is not None and acts and not rule.has_resolve:
        f.at(
            node, f"rule {rule.id!r} has actions but no way to resolve: add resolve: {{for: ...}}", "warning"
        )
    undo = {actions.spec(k).reversible_by for k in kinds if actions.spec(k).caps_power}
    missing = sorted(str(k) for k in undo - {a.kind for a in rule.on_resolve})
    if missing:
        f.at(
            node,
            f"rule {rule.id!r} caps power but never restores it: on_resolve: [{', '.join(missing)}]",
            "warning",
        )
    if not rule.description:
        f.at(
            node, f"rule {rule.id!r} has no description (say what it catches and cite the source)", "warning"
        )


def _expr(f: _File, node: yaml.Node | None, text: str, scope: tree.Level) -> tree.Node | None:
    assert node is not None
    parsed = parser.parse(text, scope)
    for problem in parsed.problems:
        if isinstance(node, yaml.ScalarNode):
            f.inside(node, problem.pos, problem.message)
        else:
            f.at(node, problem.message)
    return parsed.root if not parsed.problems else None


def _actions(f: _File, node: yaml.Node | None, items: list[Any]) -> tuple[actions.Action, ...]:
    if node is None:
        return ()
    if not isinstance(node, yaml.SequenceNode):
        f.at(node, "actions must be a list, e.g. [cordon, migrate]")
        return ()
    out = []
    for item_node, item in zip(node.value, items, strict=True):
        try:
            if isinstance(item, str):
                out.append(actions.build(item, None))
            elif isinstance(item, dict) and len(item) == 1:
                ((kind, params),) = item.items()
                out.append(actions.build(str(kind), params))
            else:
                raise ValueError(
                    "an action is a name (cordon) or one name with parameters ({power_limit: {watts: 500}})"
                )
        except ValueError as e:
            f.at(item_node, str(e))
    return tuple(out)


def _child(node: yaml.Node, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                return v  # type: ignore[no-any-return]
    return None


def _find(node: yaml.Node, loc: tuple[int | str, ...], *, key: bool = False) -> yaml.Node:
    for i, part in enumerate(loc):
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for k, v in node.value:
                if k.value == part:
                    node = k if key and i == len(loc) - 1 else v
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
    return node


def _cycle(node: yaml.Node, path: list[int], budget: list[int]) -> yaml.Node | None:
    """The first node that contains itself through aliases (or where the size budget ran out)."""
    budget[0] -= 1
    if id(node) in path or budget[0] <= 0:
        return node
    children: list[yaml.Node] = []
    if isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    path.append(id(node))
    try:
        for child in children:
            found = _cycle(child, path, budget)
            if found is not None:
                return found
    finally:
        path.pop()
    return None


def _check_duplicate_keys(f: _File, node: yaml.Node) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                if k.value in seen:
                    f.at(k, f"duplicate key {k.value!r}")
                seen.add(k.value)
            _check_duplicate_keys(f, v)
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            _check_duplicate_keys(f, v)


def _locate(node: yaml.ScalarNode, offset: int) -> tuple[int, int]:
    """1-based line and column of character ``offset`` of a scalar's value in the source text."""
    start, end = node.start_mark, node.end_mark
    if start.buffer is None:
        return start.line + 1, start.column + 1 + offset
    src = start.buffer[start.index : end.index]
    si = 0
    if node.style in ("|", ">"):
        si = src.find("\n") + 1
    elif node.style in ("'", '"'):
        si = 1
    value = node.value
    for ch in value[:offset]:
        if not ch.isspace():
            found = src.find(ch, si)
            si = found + 1 if found >= 0 else si
    if offset < len(value) and not value[offset].isspace():
        found = src.find(value[offset], si)
        si = found if found >= 0 else si
    else:
        while si < len(src) and src[si].isspace():
            si += 1
    newline = src.rfind("\n", 0, si)
    if newline < 0:
        return start.line + 1, start.column + 1 + si
    return start.line + 1 + src.count("\n", 0, si), si - newline
