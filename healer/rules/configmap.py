"""deploy/kubernetes/rules-configmap.yaml, written from the rule files themselves.

The ConfigMap is what the Kubernetes controller loads (mounted at /etc/healer/rules), so it must be the
pack, whole and current: a hand-kept copy shipped an old subset of it. ``render`` checks that the
directory loads as one rule set (as the controller loads it: ladders in one file, rules naming them in
another) and writes every file ``loader.expand`` would read, byte for byte, as a literal block under
``data``; the result is parsed back and compared before it is returned. ``make schemas`` runs
``python -m healer.rules.configmap rules deploy/kubernetes/rules-configmap.yaml`` and
tests/rules/test_pack_configmap.py fails when the manifest and the files disagree.
"""

from __future__ import annotations

import pathlib
import sys

import yaml

from healer.rules import loader

HEADER = """\
# Generated from rules/*.yaml by `make schemas` (python -m healer.rules.configmap); do not edit.
# The controller's rule files, mounted at /etc/healer/rules and hot-reloaded when they change (a file
# that fails to load is rejected and the previous rules stay active). To ship a pack of your own:
#   healer rules check my-rules/ && \\
#   python -m healer.rules.configmap my-rules/ rules-configmap.yaml && kubectl apply -f rules-configmap.yaml
"""
METADATA = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: healer-rules
  namespace: healer
  labels:
    app.kubernetes.io/name: healer-controller
    app.kubernetes.io/part-of: healer
data:
"""


def render(rules_dir: str | pathlib.Path) -> str:
    """The ConfigMap holding every rule file of ``rules_dir``; ValueError if they do not load."""
    result = loader.load_paths([rules_dir])
    if result.ruleset is None:
        raise ValueError("\n".join(str(d) for d in result.errors))
    files = {p.name: p.read_text(encoding="utf-8") for p in loader.expand([rules_dir])}
    out = [HEADER, METADATA]
    for name, text in files.items():
        if not text.endswith("\n") or text.endswith("\n\n") or text[:1] in " \t" or "\t" in text:
            raise ValueError(f"{name}: a literal block keeps it exactly only with one final newline, no tabs")
        body = "".join(f"    {line}\n" if line else "\n" for line in text.splitlines())
        out.append(f"  {name}: |\n{body}")
    rendered = "".join(out)
    if yaml.safe_load(rendered)["data"] != files:  # never ship a manifest that says other than the files
        raise ValueError("the rendered ConfigMap does not hold the rule files exactly")
    return rendered


def main(argv: list[str]) -> int:
    rules_dir, manifest = argv
    pathlib.Path(manifest).write_text(render(rules_dir), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
