"""Failure domains: which rack, PDU, switch, NVLink domain or cooling loop each admitted node sits in (#27).

A node's domains are a flat mapping ``{key: value}`` (``{"rack": "r07", "switch": "leaf-07"}``); any key
is allowed. They come from the same place as the admitted fleet (``controller.admission``):

- ``admission: file``: the inventory file's entries may carry labels (``read_inventory``): a list of
  names, of mappings ``{name: gpu01, rack: r07, pdu: p3}``, or a ``nodes`` mapping ``{gpu01: {rack:
  r07}}``;
- ``admission: scheduler``: the scheduler's node labels (``domains_from_labels``): every
  ``topology.kubernetes.io/<key>`` label becomes domain ``<key>``, and ``controller.domain_labels`` maps
  further domain keys to label names (``{rack: example.com/rack}``);
- ``admission: scheduler`` with Slurm: the node's features (``domains_from_features``, from the
  ``features`` label the Slurm actuator gives): a feature ``<key>=<value>`` (``rack=r07``) is domain
  ``<key>``, and ``controller.domain_features`` maps domain keys to feature prefixes (``{pdu: pdu_}``:
  feature ``pdu_p3`` is domain ``pdu`` = ``p3``);
- with either, Slurm's ``topology.conf`` (``controller.topology_file``, topology/tree or
  topology/block; ``parse_topology_conf``): a node's leaf switch is domain ``switch``, the switch above
  it ``switch_l2``, and so on up the tree; a block is domain ``block``.

Parsing is pure and reports every bad line (file:line and why); a bad line is skipped, the rest kept.
Slurm hostlist expressions (``gpu[01-04,07],login1``) are expanded by ``expand_hostlist``.
"""

from __future__ import annotations

import dataclasses
import itertools
import pathlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from healer import errors

FEATURES_LABEL = "features"
"""The scheduler label holding a Slurm node's features, comma-separated (``SlurmActuator.node_labels``)."""
K8S_TOPOLOGY_PREFIX = "topology.kubernetes.io/"
"""Kubernetes' well-known topology labels; each becomes the domain named after the prefix."""
MAX_HOSTLIST = 65536
"""A hostlist expression naming more nodes than this is rejected (one line cannot widen the fleet)."""

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


# -- Slurm hostlists -------------------------------------------------------------------------------
def expand_hostlist(expr: str) -> list[str]:
    """``gpu[01-03,07],login1`` -> ``gpu01 gpu02 gpu03 gpu07 login1``, as Slurm's ``scontrol show
    hostnames`` (zero padding kept, several bracket groups in one name multiply). Raises ``ValueError``."""
    names: list[str] = []
    for part in _split_top(expr.strip()):
        if part:
            names.extend(_expand_one(part))
        if len(names) > MAX_HOSTLIST:
            raise ValueError(f"hostlist {expr[:80]!r} names more than {MAX_HOSTLIST} nodes")
    return names


def _split_top(expr: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {expr[:80]!r}")
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in hostlist {expr[:80]!r}")
    parts.append(expr[start:])
    return [p.strip() for p in parts]


def _expand_one(name: str) -> list[str]:
    pieces: list[list[str]] = []
    for literal, ranges in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", name):
        if literal:
            pieces.append([literal])
        if ranges:
            pieces.append(_ranges(ranges, name))
    total = 1
    for p in pieces:
        total *= len(p)
        if total > MAX_HOSTLIST:
            raise ValueError(f"hostlist {name[:80]!r} names more than {MAX_HOSTLIST} nodes")
    return ["".join(combo) for combo in itertools.product(*pieces)]


def _ranges(spec: str, name: str) -> list[str]:
    out: list[str] = []
    for item in spec.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise ValueError(f"bad range {item!r} in hostlist {name[:80]!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo) or int(hi) - int(lo) >= MAX_HOSTLIST:
            raise ValueError(f"bad range {item!r} in hostlist {name[:80]!r}")
        width = len(lo) if lo.startswith("0") else 0
        out.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    return out


# -- Slurm topology.conf ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Parsed:
    """Domains by node, and every line that could not be used (``path:line: why``)."""

    domains: dict[str, dict[str, str]]
    problems: list[str]


def parse_topology_conf(text: str, path: str = "topology.conf") -> Parsed:
    """Slurm's ``topology.conf`` (or ``scontrol show topology``'s output, whose upper switches list
    every node below them as well): ``SwitchName=s Nodes=...`` (leaf switches), ``SwitchName=s
    Switches=...`` (their parents), ``BlockName=b Nodes=...`` (blocks).
    Other keys (``LinkSpeed``, ``Level``, ``BlockSizes``) are ignored; a line not understood is reported."""
    problems: list[str] = []
    leaf_of: dict[str, str] = {}
    parent_of: dict[str, str] = {}
    block_of: dict[str, str] = {}
    above: dict[str, str] = {}  # nodes an upper switch lists (only used for a node no leaf lists)
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields: dict[str, str] = {}
        for token in line.split():
            key, eq, value = token.partition("=")
            if not eq:
                problems.append(f"{path}:{lineno}: {token!r} is not Key=Value")
                break
            fields[key.lower()] = value
        else:
            try:
                if "switchname" in fields:
                    name = fields["switchname"]
                    children = expand_hostlist(fields.get("switches", ""))
                    for child in children:
                        parent_of[child] = name
                    # ``scontrol show topology`` lists under an upper switch every node below it too:
                    # a node's leaf is the switch without child switches that lists it.
                    target = above if children else leaf_of
                    for node in expand_hostlist(fields.get("nodes", "")):
                        target[node] = name
                elif "blockname" in fields:
                    for node in expand_hostlist(fields.get("nodes", "")):
                        block_of[node] = fields["blockname"]
                elif "blocksizes" not in fields:
                    problems.append(f"{path}:{lineno}: neither SwitchName, BlockName nor BlockSizes")
            except ValueError as e:
                problems.append(f"{path}:{lineno}: {e}")
    for node, name in above.items():
        leaf_of.setdefault(node, name)
    domains: dict[str, dict[str, str]] = {}
    for node, leaf in leaf_of.items():
        chain = {"switch": leaf}
        seen, switch, level = {leaf}, leaf, 1
        while switch in parent_of:
            switch, level = parent_of[switch], level + 1
            if switch in seen:
                problems.append(f"{path}: switch {switch!r} is its own ancestor")
                break
            seen.add(switch)
            chain[f"switch_l{level}"] = switch
        domains[node] = chain
    for node, block in block_of.items():
        domains.setdefault(node, {})["block"] = block
    return Parsed(domains, problems)


def read_topology_file(path: str) -> Parsed:
    try:
        text = pathlib.Path(path).read_text()
    except OSError as e:
        raise errors.PermanentError(f"cannot read controller.topology_file {path}: {e}") from e
    return parse_topology_conf(text, path)


# -- inventory file --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Inventory:
    names: set[str]
    domains: dict[str, dict[str, str]]


def read_inventory(path: str) -> Inventory:
    """Node names and their labels from a YAML file (see the module docstring for the forms)."""
    try:
        raw = yaml.safe_load(pathlib.Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise errors.PermanentError(f"cannot read controller.inventory_file {path}: {e}") from e
    try:
        return parse_inventory(raw)
    except ValueError as e:
        raise errors.PermanentError(f"controller.inventory_file {path}: {e}") from e


def parse_inventory(raw: Any) -> Inventory:
    entries = raw.get("nodes") if isinstance(raw, dict) else raw
    domains: dict[str, dict[str, str]] = {}
    if isinstance(entries, dict):
        for name, labels in entries.items():
            if not isinstance(name, str) or not isinstance(labels, dict | None):
                raise ValueError(f"entry {name!r}: expected a mapping of labels")
            domains[name] = _labels(name, labels or {})
    elif isinstance(entries, list):
        for entry in entries:
            if isinstance(entry, str):
                domains.setdefault(entry, {})
            elif isinstance(entry, dict) and isinstance(entry.get("name"), str):
                name = entry["name"]
                domains[name] = _labels(name, {k: v for k, v in entry.items() if k != "name"})
            else:
                raise ValueError(f"entry {entry!r}: expected a node name or a mapping with 'name'")
    else:
        raise ValueError("expected a list of node names or a mapping with 'nodes'")
    return Inventory(set(domains), domains)


def _labels(name: str, labels: Mapping[Any, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in labels.items():
        if not isinstance(key, str) or isinstance(value, dict | list) or value is None:
            raise ValueError(f"entry {name!r}: label {key!r} must be a name with a plain value")
        out[key] = str(value)
    return out


# -- scheduler labels ------------------------------------------------------------------------------
def domains_from_labels(labels: Mapping[str, str], keys: Mapping[str, str]) -> dict[str, str]:
    """A node's domains from its scheduler labels: ``topology.kubernetes.io/<key>`` as ``<key>``, and
    each ``keys`` entry (domain key -> label name) whose label the node carries."""
    out = {
        k.removeprefix(K8S_TOPOLOGY_PREFIX): v for k, v in labels.items() if k.startswith(K8S_TOPOLOGY_PREFIX)
    }
    for key, label in keys.items():
        if label in labels:
            out[key] = labels[label]
    return out


def domains_from_features(features: str, prefixes: Mapping[str, str]) -> dict[str, str]:
    """A node's domains from its Slurm features (``h100,rack=r07,pdu_p3``): each ``<key>=<value>``
    feature as domain ``<key>``, and each ``prefixes`` entry (domain key -> feature prefix) whose prefix
    starts a feature as that key with the rest of the feature. The first feature naming a key wins."""
    out: dict[str, str] = {}
    for feature in (f.strip() for f in features.split(",")):
        key, eq, value = feature.partition("=")
        if eq and key and value:
            out.setdefault(key, value)
        for domain, prefix in prefixes.items():
            if prefix and feature.startswith(prefix) and len(feature) > len(prefix):
                out.setdefault(domain, feature[len(prefix) :])
    return out


def domains_from_scheduler(
    labels: Mapping[str, str], keys: Mapping[str, str], prefixes: Mapping[str, str]
) -> dict[str, str]:
    """A node's domains from everything its scheduler says: its features (Slurm), then its labels
    (Kubernetes labels, ``controller.domain_labels``), which win."""
    return {
        **domains_from_features(labels.get(FEATURES_LABEL, ""), prefixes),
        **domains_from_labels(labels, keys),
    }


# -- the believed topology -------------------------------------------------------------------------
class Topology:
    """Domains by node, for the admitted fleet. ``members`` answers "which nodes share this domain"."""

    def __init__(self, domains: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.domains: dict[str, dict[str, str]] = {n: dict(d) for n, d in (domains or {}).items()}
        self._members: dict[tuple[str, str], frozenset[str]] | None = None
        """Members by (key, value), built on the first ``members`` call (one pass, not one per call)."""

    def of(self, node: str) -> dict[str, str]:
        return self.domains.get(node, {})

    def update(self, node: str, domains: Mapping[str, str]) -> None:
        self.domains.setdefault(node, {}).update(domains)
        self._members = None

    def keys(self) -> list[str]:
        return sorted({k for d in self.domains.values() for k in d})

    def groups(self, key: str) -> dict[str, list[str]]:
        """Members of every domain of ``key``, by domain value (nodes without that key left out)."""
        out: dict[str, list[str]] = {}
        for node in sorted(self.domains):
            value = self.domains[node].get(key)
            if value is not None:
                out.setdefault(value, []).append(node)
        return out

    def members(self, key: str, value: str) -> frozenset[str]:
        if self._members is None:
            index: dict[tuple[str, str], set[str]] = {}
            for node, d in self.domains.items():
                for k, v in d.items():
                    index.setdefault((k, v), set()).add(node)
            self._members = {kv: frozenset(nodes) for kv, nodes in index.items()}
        return self._members.get((key, value), frozenset())

    def restrict(self, nodes: Iterable[str]) -> Topology:
        keep = set(nodes)
        return Topology({n: d for n, d in self.domains.items() if n in keep})

    def dump(self) -> dict[str, Any]:
        """``healer fleet show``'s document: every key, its domains and their members."""
        return {
            "nodes": len(self.domains),
            "domains": {key: self.groups(key) for key in self.keys()},
            "without_domains": sorted(n for n, d in self.domains.items() if not d),
        }
