#!/usr/bin/env python3
"""cosmic-ray's test command for a full run with coverage-directed selection (mutmut 3's idea):
run only the tests that executed the mutated line on the unmutated code.

    python scripts/mutant_tests.py MAP.json

Run by `generated_mutants.py --all --by-coverage` from the copy of the tree a mutant was applied
to.  It finds the mutant by comparing the group's modules with their unmutated copies (the map
names both), then:

- a mutant that changes nothing but function annotations (strings under `from __future__ import
  annotations`) passes at once: equivalent by construction, reported as such;
- a line that runs at import time (module or class level, a signature, a decorator, a default) or
  that some test reached only without a test id of its own runs *every* test of the group: an
  import is shared by all the tests after the first, so coverage cannot say which depend on it;
- a line inside a function body runs the tests that executed it, with -x; none means no test
  executes the line, and the mutant survives without a run.

Tests run fastest first (their times in the coverage run), so a kill usually costs one short test.

Exit status is pytest's (0: the mutant survived).  pytest's "usage error" (a test id not found)
and "no tests collected" are not kills: the whole group runs instead.
"""
from __future__ import annotations

import ast
import difflib
import json
import os
import subprocess
import sys

ALL = "*"   # run every test of the group


def _without_function_annotations(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.returns = None
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []),
                        *([a.kwarg] if a.kwarg else [])]:
                arg.annotation = None
    return ast.dump(tree)


def annotations_only(old: str, new: str) -> bool:
    """`new` differs from `old` in nothing but function annotations, and the module has `from
    __future__ import annotations` (they stay strings, never evaluated): equivalent by
    construction.  Judged on the ASTs, annotations removed from both."""
    if "from __future__ import annotations" not in old:
        return False
    try:
        return _without_function_annotations(ast.parse(old)) == _without_function_annotations(ast.parse(new))
    except SyntaxError:
        return False


def changed_lines(old: str, new: str) -> list[int]:
    """1-based lines of `old` that the mutant replaced (an insertion counts the line it precedes)."""
    a, b = old.splitlines(), new.splitlines()
    out: list[int] = []
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            out += list(range(i1 + 1, max(i2, i1 + 1) + 1))
    return out


def runs_at_import(tree: ast.Module, line: int) -> bool:
    """True unless the line sits in the body of some function (then only a call runs it)."""
    return not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                   and n.body[0].lineno <= line <= (n.end_lineno or 0) for n in ast.walk(tree))


def traced_lines(tree: ast.Module, line: int) -> range:
    """The lines a tracer may report for the statement holding `line`: a multi-line simple
    statement reports any of its lines, a compound one its header's."""
    best = None
    for n in ast.walk(tree):
        if isinstance(n, (ast.stmt, ast.excepthandler)) and n.lineno <= line <= (n.end_lineno or n.lineno):
            if best is None or (n.end_lineno - n.lineno) < (best.end_lineno - best.lineno):
                best = n
    if best is None:
        return range(line, line + 1)
    body = getattr(best, "body", None)
    end = body[0].lineno - 1 if isinstance(body, list) and body and body[0].lineno > best.lineno else best.end_lineno
    return range(best.lineno, max(end, line) + 1)


def select(m: dict, work: str) -> tuple[str, list[str]]:
    """(why, tests): the tests to run for the mutant applied in `work`."""
    for rel, lines in m["modules"].items():
        with open(os.path.join(work, rel)) as fh:
            new = fh.read()
        with open(os.path.join(m["pristine"], rel)) as fh:
            old = fh.read()
        if new == old:
            continue
        if annotations_only(old, new):
            return f"{rel}: annotations only", []
        tree = ast.parse(old)
        tests: set[str] = set()
        for ln in changed_lines(old, new):
            if runs_at_import(tree, ln):
                return f"{rel}:{ln} runs at import", [ALL]
            for t in traced_lines(tree, ln):
                tests.update(lines.get(str(t), ()))
        if "" in tests:
            return f"{rel}: reached without a test id", [ALL]
        return f"{rel}: {len(tests)} covering tests", sorted(tests)
    return "no module changed", [ALL]


def main() -> int:
    with open(sys.argv[1]) as fh:
        m = json.load(fh)
    why, tests = select(m, os.getcwd())
    with open(m["log"], "a") as fh:
        fh.write(why + "\n")
    if not tests:
        return 0
    timed = m.get("durations") or {}
    if tests == [ALL]:
        tests = list(timed) or m["tests"]
    tests = sorted(tests, key=lambda t: timed.get(t, float("inf")))   # fastest first: -x stops at a kill
    rc = _pytest(tests)
    if rc in (4, 5) and tests != m["tests"]:
        with open(m["log"], "a") as fh:
            fh.write(f"  pytest exit {rc} on the selection: the whole group instead\n")
        rc = _pytest(m["tests"])
    return rc


def _pytest(tests: list[str]) -> int:
    return subprocess.call([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    sys.exit(main())
