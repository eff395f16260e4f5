#!/usr/bin/env python3
"""Generated mutants (cosmic-ray) on the decision modules: every mutant a maintained tool can make
there, not only the curated ones (scripts/mutation_check.py), must be killed by the tests that
guard its module -- or be listed in MUTATION.md as equivalent, with a one-line reason.

    python scripts/generated_mutants.py                 # the seeded sample CI runs (6 mutants)
    python scripts/generated_mutants.py --sample 40 --seed 7
    python scripts/generated_mutants.py --list             # which mutants CI draws for this code, not run
    python scripts/generated_mutants.py --all --group runstate --record benchmarks/mutation/runstate.jsonl

cosmic-ray enumerates the mutants (`cosmic-ray init`: operators, occurrences) and applies each to a
private copy of the tracked tree (`cosmic-ray exec`, never this checkout), where the group's tests
run with PYTHONPATH putting the copy first.  The sample is drawn from every group's mutants at
once; its seed defaults to a digest of the decision modules' source, so a given code state always
draws the same mutants (documentation and test changes do not move it; a code change does), and
the seed is printed.  Exit 0 when every sampled mutant was killed (a test failed, the mutant could
not even be imported, or it hung past the timeout) or is listed as equivalent; 1 otherwise.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from mutation_check import copy_tree  # noqa: E402  (one copy of the tracked tree, the same as the curated check)
from mutant_tests import annotations_only  # noqa: E402

# decision module(s) -> the tests that guard them (run with -x: a kill usually stops early)
GROUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # a module of checks/ sits with the code it judges when that code has its own tests (a rule of
    # `forensics` is guarded by test_forensics.py, not by the verify suites): CI's first draw found
    # CKD602 disabled and "surviving" because its only test was not among the checks group's
    "runstate": (("ckptdoctor/runstate", "ckptdoctor/checks/reconcile.py"), ("tests/test_reconcile.py",)),
    "actions": (("ckptdoctor/commands/fix.py", "ckptdoctor/commands/prune.py"),
                ("tests/test_trusted_actions.py", "tests/test_doctor.py", "tests/test_composer.py", "tests/test_demo.py",
                 "tests/test_publish.py")),
    "contract": (("ckptdoctor/contract.py",), ("tests/test_contract.py",)),
    "resume": (("ckptdoctor/resume.py", "ckptdoctor/checks/resume.py"), ("tests/test_resume.py",
                                                                        "tests/test_contract.py")),
    "unpickle": (("ckptdoctor/io/unpickle.py",), ("tests/test_hostile.py", "tests/test_dcp_reader.py",
                                                  "tests/test_bite.py")),
    "preflight": (("ckptdoctor/preflight", "ckptdoctor/checks/preflight.py"), ("tests/test_preflight.py",
                                                                             "tests/test_readsets.py")),
    "publishing": (("ckptdoctor/publishing", "ckptdoctor/checks/verify_publish.py"),
                   ("tests/test_publish.py", "tests/test_parts.py", "tests/test_reliability.py")),
    "forensics": (("ckptdoctor/checks/forensics.py",), ("tests/test_forensics.py",)),
    "integrity": (("ckptdoctor/checks/verify_checksums.py", "ckptdoctor/checks/verify_deep.py",
                   "ckptdoctor/checks/deep_scan.py"), ("tests/test_checksums.py", "tests/test_deep.py",
                                                        "tests/test_verify_dcp.py", "tests/test_families.py")),
    "checks": (tuple(f"ckptdoctor/checks/{m}.py" for m in (
        "__init__", "tool", "verify_components", "verify_dcp", "verify_layout", "verify_markers",
        "verify_safetensors", "verify_trackers")),
        ("tests/test_verify_dcp.py", "tests/test_families.py", "tests/test_catalog.py", "tests/test_megatron.py",
         "tests/test_bite.py", "tests/test_wild.py", "tests/test_conformance.py", "tests/test_composer.py",
         "tests/test_experts.py")),
}
EQUIVALENTS = os.path.join(ROOT, "MUTATION.md")


def sources(groups) -> list[str]:
    out = []
    for g in groups:
        for p in GROUPS[g][0]:
            full = os.path.join(ROOT, p)
            if os.path.isdir(full):
                out += sorted(os.path.join(d, f) for d, _, fs in os.walk(full) for f in fs if f.endswith(".py"))
            else:
                out.append(full)
    return sorted(out)


def code_seed(groups) -> int:
    h = hashlib.sha256()
    for f in sources(groups):
        h.update(os.path.relpath(f, ROOT).encode() + b"\0" + open(f, "rb").read())
    return int(h.hexdigest()[:12], 16)


def key_of(module: str, diff: str | None) -> str:
    """A mutant's identity that survives unrelated edits: its module and the line before/after."""
    old = [l[1:].strip() for l in (diff or "").splitlines() if l.startswith("-") and not l.startswith("---")]
    new = [l[1:].strip() for l in (diff or "").splitlines() if l.startswith("+") and not l.startswith("+++")]
    return f"{module}: {' / '.join(old)} => {' / '.join(new)}"


def annotation_only(source: str, line: int, diff: str | None) -> bool:
    """The mutant changes nothing but a function's annotations, in a module with `from __future__
    import annotations` (they stay strings, never evaluated): equivalent by construction."""
    old = [l[1:] for l in (diff or "").splitlines() if l.startswith("-") and not l.startswith("---")]
    new = [l[1:] for l in (diff or "").splitlines() if l.startswith("+") and not l.startswith("+++")]
    lines = source.splitlines()
    if len(old) != 1 or len(new) != 1 or not 0 < line <= len(lines) or lines[line - 1] != old[0]:
        return False
    return annotations_only(source, "\n".join([*lines[:line - 1], new[0], *lines[line:]]))


def _identity(item) -> tuple:
    """What a mutant is, independent of the run that enumerated it."""
    m = item.mutations[0]
    return (str(m.module_path), m.operator_name, m.occurrence, tuple(m.start_pos), tuple(m.end_pos))


def equivalents(path: str = EQUIVALENTS) -> dict[str, str]:
    """MUTATION.md's table of equivalent mutants: | `module: old => new` | reason |"""
    out = {}
    try:
        text = open(path).read()
    except FileNotFoundError:
        return out
    for m in re.finditer(r"^\| `(.+?)` \| (.+?) \|$", text, re.M):
        out[m.group(1).replace("\\|", "|")] = m.group(2)   # a | inside a table cell is written \|
    return out


def _env(work: str, **extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=work, PYTHONDONTWRITEBYTECODE="1", PYTHONWARNINGS="ignore", **extra)
    env.pop("CKPTDOCTOR_CONFIG", None)
    return env


def coverage_map(work: str, group: str) -> str:
    """Run the group's tests once on the unmutated copy under coverage.py, one context per test,
    and write which tests executed each line of the group's modules (scripts/mutant_tests.py reads
    it).  A test's own subprocesses (the real CLI) are measured too: they start coverage from
    COVERAGE_PROCESS_START, and their static context is the PYTEST_CURRENT_TEST they inherit.
    The run is also the baseline: a test failing here would make every "kill" meaningless."""
    import coverage
    mods, tests = GROUPS[group]
    out = os.path.join(work, f".ckd-cov-{group}")
    os.makedirs(out, exist_ok=True)
    rc = os.path.join(out, "coveragerc")
    with open(rc, "w") as fh:
        fh.write(f"[run]\nsource = {os.path.join(work, 'ckptdoctor')}\nparallel = true\n"
                 f"data_file = {os.path.join(out, 'data')}\ncontext = ${{PYTEST_CURRENT_TEST-}}\npatch = _exit\n")
    with open(os.path.join(out, "ckd_cov_plugin.py"), "w") as fh:
        fh.write("import coverage, pytest, time\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
                 "def pytest_runtest_protocol(item, nextitem):\n"
                 "    cov = coverage.Coverage.current()\n    cov and cov.switch_context(item.nodeid)\n"
                 "    t0 = time.monotonic()\n    yield\n    cov and cov.switch_context('')\n"
                 f"    with open({os.path.join(out, 'durations.tsv')!r}, 'a') as fh:\n"
                 "        fh.write(f'{time.monotonic() - t0:.3f}\\t{item.nodeid}\\n')\n")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "ckd_cov_plugin",
                        *tests], cwd=work, env=_env(f"{work}{os.pathsep}{out}", COVERAGE_PROCESS_START=rc),
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{group}: the guarding tests fail on the unmutated code:\n{p.stdout[-3000:]}")
    cov = coverage.Coverage(config_file=rc)
    cov.combine(strict=True)
    data = cov.get_data()
    modules: dict[str, dict[str, list[str]]] = {}
    wanted = {os.path.relpath(f, ROOT) for f in sources([group])}
    for f in data.measured_files():
        rel = os.path.relpath(f, work)
        if rel in wanted:
            modules[rel] = {str(ln): sorted({re.sub(r" \((setup|call|teardown)\)$", "", c) for c in ctxs})
                            for ln, ctxs in data.contexts_by_lineno(f).items()}
    for rel in wanted - set(modules):
        modules[rel] = {}           # never imported by the group's tests: every mutant there survives
    pristine = os.path.join(out, "pristine")
    for rel in modules:
        os.makedirs(os.path.dirname(os.path.join(pristine, rel)), exist_ok=True)
        shutil.copy2(os.path.join(work, rel), os.path.join(pristine, rel))
    # each test's time in this run: a mutant's tests run fastest first, so a kill (-x) comes early
    durations = {}
    with open(os.path.join(out, "durations.tsv")) as fh:
        for row in fh:
            secs, _, nodeid = row.rstrip("\n").partition("\t")
            durations[nodeid] = float(secs)
    path = os.path.join(out, "map.json")
    with open(path, "w") as fh:
        json.dump({"tests": list(tests), "pristine": pristine, "log": os.path.join(out, "selection.log"),
                   "modules": modules, "durations": durations}, fh)
    print(f"  ({group}: coverage of the guarding tests mapped in {time.monotonic() - t0:.0f} s)", flush=True)
    return path


def _config(work: str, group: str, timeout: float, by_coverage: bool = False) -> str:
    mods, tests = GROUPS[group]
    cmd = " ".join([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests])
    if by_coverage:
        cmd = " ".join([sys.executable, os.path.join(work, "scripts", "mutant_tests.py"),
                        os.path.join(work, f".ckd-cov-{group}", "map.json")])
    path = os.path.join(work, f".cr-{group}.toml")
    with open(path, "w") as fh:
        fh.write("[cosmic-ray]\n"
                 f"module-path = {json.dumps(list(mods))}\n"
                 f"timeout = {timeout}\n"
                 "excluded-modules = []\n"
                 f"test-command = {json.dumps(cmd)}\n"
                 "[cosmic-ray.distributor]\nname = \"local\"\n")
    return path


def _cr(work: str, *args: str) -> None:
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "cosmic-ray"), *args], cwd=work,
                   env=_env(work), check=True, capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sample", type=int, default=6, help="mutants drawn from all groups (default 6)")
    ap.add_argument("--all", action="store_true", help="every mutant of the chosen groups (hours: not for CI)")
    ap.add_argument("--seed", type=int, help="default: a digest of the decision modules' source")
    ap.add_argument("--group", action="append", choices=sorted(GROUPS), help="only these groups (repeatable)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per mutant (a hang counts as killed)")
    ap.add_argument("--list", action="store_true", help="print the drawn mutants (module:line operator) and stop")
    ap.add_argument("--record", help="append one JSON line per mutant to this file")
    ap.add_argument("--by-coverage", action="store_true",
                    help="run, for each mutant, only the tests that executed its line (scripts/mutant_tests.py)")
    ap.add_argument("--work", help="keep the copy and cosmic-ray's databases here; run again to resume")
    ap.add_argument("--budget", type=float, help="start no further group after this many seconds (CI's time "
                                                   "limit); the drawn mutants not run are listed")
    a = ap.parse_args()
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    groups = a.group or sorted(GROUPS)
    # a sample is always drawn from every group's mutants with the seed of all their source, so
    # `--group G` runs exactly the part of CI's draw that falls in G; --all takes the groups named
    drawn_from = groups if a.all else sorted(GROUPS)
    seed = a.seed if a.seed is not None else code_seed(sorted(GROUPS))
    known = equivalents()
    with contextlib.nullcontext(a.work) if a.work else tempfile.TemporaryDirectory(prefix="ckd-generated-") as work:
        snapshot = os.path.join(work, ".ckd-unmutated")
        if not os.path.exists(os.path.join(work, "pyproject.toml")):
            copy_tree(work)
        if os.path.isdir(snapshot):
            # resuming (--work): a run stopped mid-mutant leaves that mutant applied in the copy
            shutil.copytree(snapshot, work, dirs_exist_ok=True)
        else:
            for f in sources(sorted(GROUPS)):
                rel = os.path.relpath(f, ROOT)
                if not os.path.isfile(os.path.join(work, rel)):
                    continue
                os.makedirs(os.path.dirname(os.path.join(snapshot, rel)), exist_ok=True)
                shutil.copy2(os.path.join(work, rel), os.path.join(snapshot, rel))
        population = []
        for g in drawn_from:
            cfg = _config(work, g, a.timeout, a.by_coverage)
            if not os.path.exists(os.path.join(work, f".cr-{g}.sqlite")):     # else: resume (--work)
                _cr(work, "init", cfg, os.path.join(work, f".cr-{g}.sqlite"))
            with use_db(os.path.join(work, f".cr-{g}.sqlite"), WorkDB.Mode.open) as db:
                population += [(g, item.job_id, _identity(item)) for item in db.work_items]
        # drawn in an order of what each mutant is (job ids are fresh UUIDs per init and the work
        # database returns rows unordered): measured, two runs of one seed drew different mutants
        population.sort(key=lambda p: (p[0], p[2]))
        what = {(g, job): ident for g, job, ident in population}
        population = [(g, job) for g, job, _ in population]
        chosen = set(population) if a.all else set(random.Random(seed).sample(population, min(a.sample,
                                                                                              len(population))))
        print(f"generated mutants: {len(chosen)} of {len(population)} drawn (seed {seed}); running those in "
              f"{', '.join(groups)}: {sum(g in groups for g, _ in chosen)}", flush=True)
        if a.list:
            sizes = {g: sum(p[0] == g for p in population) for g in drawn_from}
            print("population: " + ", ".join(f"{g} {n}" for g, n in sizes.items()), flush=True)
            for g, job in sorted(chosen, key=lambda c: (c[0], what[c])):
                mod, op, occ, start, _ = what[(g, job)]
                print(f"{g:<11} {os.path.relpath(os.path.join(work, mod), work)}:{start[0]}  {op} #{occ}")
            return 0
        rows = []
        started = time.monotonic()
        for g in groups:
            db_path = os.path.join(work, f".cr-{g}.sqlite")
            with use_db(db_path, WorkDB.Mode.open) as db:
                done = {item.job_id for item, _ in db.completed_work_items}
                skip = [item.job_id for item in db.work_items if (g, item.job_id) not in chosen
                        and item.job_id not in done]
                db.set_multiple_results(skip, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
                todo = sum(1 for _ in db.pending_work_items)
            if not todo and not a.work:
                continue
            t0 = time.monotonic()
            if a.budget is not None and t0 - started > a.budget:
                print(f"not run    {g}: {todo} drawn mutants (the {a.budget:.0f} s budget was spent)", flush=True)
                continue
            if a.by_coverage and todo and not os.path.exists(os.path.join(work, f".ckd-cov-{g}", "map.json")):
                coverage_map(work, g)
            if todo:
                _cr(work, "exec", os.path.join(work, f".cr-{g}.toml"), db_path)
            with use_db(db_path, WorkDB.Mode.open) as db:
                for item, res in db.completed_work_items:
                    if res.worker_outcome == WorkerOutcome.SKIPPED:
                        continue
                    mut = item.mutations[0]
                    module = os.path.relpath(os.path.join(work, str(mut.module_path)), work)
                    key = key_of(module, res.diff)
                    if res.worker_outcome == WorkerOutcome.ABNORMAL or res.test_outcome in (
                            TestOutcome.KILLED, TestOutcome.INCOMPETENT):
                        status = "killed"
                    elif res.test_outcome == TestOutcome.SURVIVED:
                        src = open(os.path.join(work, module)).read()
                        status = "equivalent" if key in known or annotation_only(src, mut.start_pos[0], res.diff) \
                            else "SURVIVED"
                    else:
                        status = f"ERROR ({res.worker_outcome.value})"
                    rows.append({"group": g, "status": status, "operator": mut.operator_name,
                                 "line": mut.start_pos[0], "key": key})
                    print(f"{status:<10} {module}:{mut.start_pos[0]}  {mut.operator_name}\n"
                          f"           {key.split(': ', 1)[1]}", flush=True)
            print(f"  ({g}: {todo} mutants, {time.monotonic() - t0:.0f} s)", flush=True)
        if a.record:
            with open(a.record, "a") as fh:
                for r in rows:
                    fh.write(json.dumps({"seed": seed, **r}) + "\n")
        bad = [r for r in rows if r["status"] not in ("killed", "equivalent")]
        killed = sum(r["status"] == "killed" for r in rows)
        print(f"generated mutants: {killed} killed, {sum(r['status'] == 'equivalent' for r in rows)} equivalent "
              f"(MUTATION.md), {len(bad)} not killed, of {len(rows)}")
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
