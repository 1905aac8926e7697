#!/usr/bin/env python3
"""Prints every PromQL expression of klserve's Grafana dashboard and alert rules.

Usage:
  promql_expressions.py [--check] [--raw] [FILE ...]

FILEs are Grafana dashboards (*.json: every panel target's `expr`, rows and
nested panels included) and Prometheus rule files (*.yml, *.yaml: every rule's
`expr`). Without FILEs, the repository's deploy/grafana/dashboards/klserve.json
and deploy/prometheus/alerts.yml.

Output: one JSON object per line (JSON Lines),
  {"source": "klserve.json:Error ratio/A", "expr": "sum(rate(...[1m])) / ..."}
with Grafana's variables replaced so that Prometheus's HTTP API
(/api/v1/query, /api/v1/query_range) accepts the expression as it is:
  $__rate_interval -> 1m, $__interval -> 30s, $__interval_ms -> 30000,
  $__range -> 1h, $__range_s -> 3600, $__range_ms -> 3600000,
and the dashboard's own template variables ($run, ${run}, ${run:regex},
[[run]]) by their "All" value (allValue, else ".*"); the dashboard uses them
only inside regex matchers (=~"$run"). --raw prints the bare expressions
instead, one per line, newlines folded into spaces.

--check also exits 1 when a file holds no expression or an expression still
holds a Grafana variable. Needs only the standard library; PyYAML is used when
present, otherwise a small reader of the rule files' `expr:` keys.
"""

import argparse
import json
import os
import re
import sys

BUILTIN_VARIABLES = {
    "__rate_interval": "1m",
    "__interval": "30s",
    "__interval_ms": "30000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}

# A Grafana variable reference: $name, ${name}, ${name:format}, [[name]].
VARIABLE = re.compile(
    r"\$\{(?P<braced>\w+)(?::[^}]*)?\}|\[\[(?P<bracketed>\w+)\]\]|\$(?P<plain>\w+)"
)
# What --check refuses in an expression once substituted ("$1" in a
# label_replace is PromQL's own and allowed).
LEFTOVER = re.compile(r"\$\{|\[\[|\$[A-Za-z_]")


def substitute(expr, variables):
    """`expr` with each known Grafana variable replaced; others left as is."""

    def replace(match):
        name = match.group("braced") or match.group("bracketed") or match.group("plain")
        return variables.get(name, match.group(0))

    return VARIABLE.sub(replace, expr)


def dashboard_variables(dashboard):
    variables = dict(BUILTIN_VARIABLES)
    for var in dashboard.get("templating", {}).get("list", []):
        name = var.get("name")
        if name and var.get("type") != "datasource":
            variables[name] = var.get("allValue") or ".*"
    return variables


def walk_panels(panels):
    for panel in panels or []:
        yield panel
        yield from walk_panels(panel.get("panels"))


def dashboard_expressions(path):
    with open(path, encoding="utf-8") as f:
        dashboard = json.load(f)
    variables = dashboard_variables(dashboard)
    name = os.path.basename(path)
    for panel in walk_panels(dashboard.get("panels")):
        for target in panel.get("targets") or []:
            expr = target.get("expr")
            if not expr or not expr.strip():
                continue
            source = "%s:%s/%s" % (name, panel.get("title", "?"), target.get("refId", "?"))
            yield source, substitute(expr, variables)


def rule_entries_pyyaml(text):
    import yaml  # pylint: disable=import-outside-toplevel

    doc = yaml.safe_load(text) or {}
    for group in doc.get("groups") or []:
        for rule in group.get("rules") or []:
            name = rule.get("alert") or rule.get("record") or "?"
            yield group.get("name", "?"), name, str(rule.get("expr", ""))


def rule_entries_plain(text):
    """The `expr` of each rule, for rule files in the usual layout (block
    scalars |, |-, >, >-; plain or quoted one-line scalars)."""
    group, name = "?", "?"
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        i += 1
        m = re.match(r"-\s+name:\s*(.+)$", stripped)
        if m:
            group = m.group(1).strip().strip("'\"")
            continue
        m = re.match(r"-?\s*(alert|record):\s*(.+)$", stripped)
        if m:
            name = m.group(2).strip().strip("'\"")
            continue
        m = re.match(r"-?\s*expr:\s*(.*)$", stripped)
        if not m:
            continue
        value = m.group(1).strip()
        if value and value[0] in "|>":
            indent = len(line) - len(line.lstrip())
            block = []
            while i < len(lines):
                nxt = lines[i]
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                block.append(nxt.rstrip())
                i += 1
            # Drop the block's own indentation, keep the relative one.
            margin = min((len(b) - len(b.lstrip()) for b in block if b), default=0)
            block = [b[margin:] for b in block]
            joiner = "\n" if value[0] == "|" else " "
            expr = joiner.join(block).strip()
        elif value[:1] in ("'", '"'):
            quote = value[0]
            expr = value[1:value.rindex(quote)] if value.count(quote) >= 2 else value[1:]
            if quote == "'":
                expr = expr.replace("''", "'")
            else:
                expr = json.loads('"%s"' % expr)
        else:
            expr = value
        yield group, name, expr


def rule_expressions(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        entries = list(rule_entries_pyyaml(text))
    except ImportError:
        entries = list(rule_entries_plain(text))
    base = os.path.basename(path)
    for group, name, expr in entries:
        if expr.strip():
            yield "%s:%s/%s" % (base, group, name), substitute(expr.strip(), BUILTIN_VARIABLES)


def expressions(path):
    if path.endswith(".json"):
        return list(dashboard_expressions(path))
    return list(rule_expressions(path))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--raw", action="store_true")
    args = parser.parse_args(argv)

    files = args.files
    if not files:
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
        files = [
            os.path.join(root, "deploy", "grafana", "dashboards", "klserve.json"),
            os.path.join(root, "deploy", "prometheus", "alerts.yml"),
        ]

    problems = []
    for path in files:
        found = expressions(path)
        if not found:
            problems.append("%s: no PromQL expression found" % path)
        for source, expr in found:
            if LEFTOVER.search(expr):
                problems.append("%s: unreplaced Grafana variable in %r" % (source, expr))
            if args.raw:
                print(" ".join(expr.split()))
            else:
                print(json.dumps({"source": source, "expr": expr}))
    if args.check and problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
