"""The catalog (rules/*.yaml) and the registry (check functions) must match exactly, and every
rule must have a test that makes it fire."""
import json
from pathlib import Path

import pytest

from ckptdoctor.engine.catalog import catalog
from ckptdoctor.engine.registry import load_all
from ckptdoctor.layouts.spec import layouts

TESTS = Path(__file__).parent


def test_catalog_and_registry_match_both_ways():
    cat = set(catalog())
    reg = set(load_all())
    assert cat - reg == set(), f"catalog entries without a check: {sorted(cat - reg)}"
    assert reg - cat == set(), f"checks without a catalog entry: {sorted(reg - cat)}"


def test_each_rule_names_the_subcommands_that_run_its_check():
    reg = load_all()
    wrong = {r.id: (r.subcommands, reg[r.id].subcommands) for r in catalog().values()
             if tuple(r.subcommands) != reg[r.id].subcommands}
    assert not wrong, f"catalog subcommands differ from where the check runs: {wrong}"


def test_references_are_public_urls_or_files_that_ship():
    root = TESTS.parent
    for r in catalog().values():
        for ref in r.references:
            assert ref.startswith("https://") or (root / ref.split(" ")[0]).is_file(), (r.id, ref)


def test_catalog_entries_are_well_formed():
    names = set()
    for r in catalog().values():
        assert r.name not in names
        names.add(r.name)
        # each area's rules run in that subcommand; publish's artefacts at rest (uncommitted uploads,
        # leftovers of dead publishes) are judged by verify
        area = {"1": {"verify"}, "2": {"publish", "verify"}, "3": {"reconcile"}, "4": {"preflight"}}.get(r.id[3])
        if area:
            assert area & set(r.subcommands), (r.id, r.subcommands)
        assert len(r.why) > 40 and len(r.fix) > 10 and r.summary


def test_family_step_names_and_trackers_round_trip():
    """Each family's step naming builds names it parses back, and a tracker it writes names the
    checkpoint it was written for (what publish writes, verify and preflight read)."""
    from ckptdoctor.layouts import trackers
    ls = layouts()
    runs = [l for l in ls.values() if l.scope == "run"]
    assert {l.family for l in runs} >= {"megatron", "verl", "deepspeed", "torchtitan", "nemo-rl", "hf-trainer", "orbax",
                                       "composer"}
    for l in runs:
        for n in l.checkpoint_layouts:
            assert n in ls and ls[n].scope == "checkpoint", (l.name, n)
        for step in (0, 7, 300, 1234567):
            name = l.steps.build(step)
            assert l.steps.step(name) == step, (l.name, name)
            assert not l.steps.matches(name + "\n") and not l.steps.matches("x" + name), (l.name, name)
            if l.tracker and l.tracker.content:
                text = trackers.render(l, name).encode()
                assert trackers.parse(l, text).target == name, (l.name, text)


def _compiled_rules(tmp_path, monkeypatch, dirname: str, text: str):
    """A rules directory of one YAML file and its compiled artefact, which start-up then uses."""
    from ckptdoctor.engine import yamlcache
    root = tmp_path / dirname
    root.mkdir()
    (root / "a.yaml").write_text(text)
    art = tmp_path / "compiled.json"
    art.write_text(yamlcache.compile_all(root))
    monkeypatch.setattr(yamlcache, "ARTEFACT", art)
    monkeypatch.setattr(yamlcache, "_DOCS", {})
    return yamlcache, root, art


def test_the_compiled_yaml_artefact_follows_the_yaml(tmp_path, monkeypatch):
    """Start-up reads the shipped YAML from the JSON compiled at build time, checked against each file's
    size: a file edited (or added) since is parsed instead, a damaged or missing artefact only costs
    time, and nothing is written anywhere."""
    yamlcache, root, art = _compiled_rules(tmp_path, monkeypatch, "rules", "x: 1\nlist: [a, b]\n")
    import ckptdoctor.engine.catalog as catalog
    parsed = []
    monkeypatch.setattr(catalog, "parse_yaml", lambda data, real=catalog.parse_yaml: (parsed.append(1), real(data))[1])
    assert yamlcache.docs(root) == {"a.yaml": {"x": 1, "list": ["a", "b"]}} and not parsed   # from the artefact
    (root / "a.yaml").write_text("x: 22\n")
    monkeypatch.setattr(yamlcache, "_DOCS", {})
    assert yamlcache.docs(root) == {"a.yaml": {"x": 22}} and parsed                         # edited: parsed
    art.write_text("{damaged")
    monkeypatch.setattr(yamlcache, "_DOCS", {})
    assert yamlcache.docs(root) == {"a.yaml": {"x": 22}}
    (root / "b.yaml").write_text("2024-01-01: date key\n")  # not JSON-exact: refused at build time
    with pytest.raises(ValueError):
        yamlcache.compile_all(root)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compiled.json", "rules"]


def test_an_installed_wheel_reads_its_compiled_rules_without_a_metadata_call_per_rule_file(tmp_path, monkeypatch):
    """A wheel ships its rules as ckptdoctor/_rules, built with the artefact: start-up trusts the
    artefact without statting every YAML file (each stat is a round trip on a shared filesystem);
    a damaged artefact still falls back to parsing the YAML."""
    yamlcache, root, art = _compiled_rules(tmp_path, monkeypatch, "_rules", "x: 1\n")
    walked = []
    monkeypatch.setattr(yamlcache, "_signature", lambda r, real=yamlcache._signature: (walked.append(r), real(r))[1])
    assert yamlcache.docs(root) == {"a.yaml": {"x": 1}} and not walked
    art.write_text("{damaged")
    monkeypatch.setattr(yamlcache, "_DOCS", {})
    assert yamlcache.docs(root) == {"a.yaml": {"x": 1}} and walked == [root]
    monkeypatch.setattr(yamlcache, "_DOCS", {})
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "a.yaml").write_text("x: 1\n")
    art.write_text(yamlcache.compile_all(tmp_path / "rules"))
    walked.clear()
    assert yamlcache.docs(tmp_path / "rules") == {"a.yaml": {"x": 1}} and walked == [tmp_path / "rules"]  # a checkout: checked


def test_the_shipped_artefacts_are_what_start_up_uses():
    """The package's own artefacts match the shipped YAML and CLI (tests/test_docs.py checks they are
    current); a plain command uses them: neither typer nor the YAML parser is imported."""
    from ckptdoctor import fastcli
    from ckptdoctor.engine import catalog, yamlcache
    got = json.loads(open(yamlcache.ARTEFACT).read())
    assert got["sizes"] == dict(yamlcache._signature(catalog.data_dir()))
    assert json.loads(open(fastcli.ARTEFACT).read())["source"] == fastcli.source_hash()


def test_glob_matcher_is_fnmatchcase():
    """spec.match_any's shortcut (no regex for plain, `*x` and `x*` patterns) decides exactly as
    fnmatch.fnmatchcase, the definition family files are written against."""
    import fnmatch
    from hypothesis import given, settings, strategies as st
    from ckptdoctor.layouts import spec
    alphabet = st.sampled_from(list("ab._-*?[]!\n") + ["__", ".metadata", "iter_"])
    text = st.lists(alphabet, max_size=6).map("".join)

    @settings(max_examples=3000, deadline=None)
    @given(text, text)
    def same(pattern, name):
        name = name.replace("*", "").replace("?", "")  # names hold no glob magic; patterns may
        assert spec._matcher(pattern)(name) == fnmatch.fnmatchcase(name, pattern), (pattern, name)
    same()
    for pattern, name, want in (("*.distcp", "__0_0.distcp", True), ("*.distcp", ".distcp", True),
                                ("iter_*", "iter_", True), ("a*a", "a", False), (".metadata", ".metadata\n", False)):
        assert spec.match_any(name, (pattern,)) is want, (pattern, name)


def test_rule_docs_cite_only_what_ships_or_public_urls():
    """A user has the rule docs, the README and the public web, not the team's notes: no rule cites a
    seed document or a numbered pitfall, and every reference is a URL or a file in this repository."""
    import re
    from pathlib import Path
    from ckptdoctor.engine.catalog import catalog
    root = Path(__file__).resolve().parent.parent
    for r in catalog().values():
        text = " ".join(str(getattr(r, k, "") or "") for k in ("summary", "why", "fix", "example"))
        assert not re.search(r"\bseed \d|\bpitfall \d", text, re.I), (r.id, text)
        for ref in r.references or []:
            assert ref.startswith("https://") or (root / ref.split(" (")[0]).exists(), (r.id, ref)


def test_the_tracker_dangling_hint_names_the_command_that_fixes_it(tmp_path):
    from ckptdoctor import api
    from ckptdoctor.demo import build_run
    build_run(str(tmp_path / "run"))
    rep = api.verify(str(tmp_path / "run"))
    (hit,) = [f for f in rep.findings if f.rule == "CKD113"]
    assert hit.hint.startswith("`ckptdoctor verify --fix ") and "iter_0000100" in hit.hint and "--dry-run" in hit.hint


def _script(name: str):
    """scripts/<name>.py, loaded as a module (scripts/ is no package)."""
    import importlib.util
    import sys
    spec = importlib.util.spec_from_file_location(f"ckd_{name}", TESTS.parent / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[f"ckd_{name}"] = mod
    spec.loader.exec_module(mod)
    return mod


def _mutation_check():
    return _script("mutation_check")


def test_every_curated_mutant_still_finds_its_line_once():
    """A mutant whose text no longer appears exactly once fails the mutation check after the whole
    suite has run (half an hour into CI): say so here, in a second."""
    mc, root = _mutation_check(), TESTS.parent
    stale = [(m.id, (root / m.file).read_text().count(m.old)) for m in mc.MUTANTS
             if (root / m.file).read_text().count(m.old) != 1]
    assert mc.MUTANTS and not stale, f"mutants whose anchor text is not found exactly once: {stale}"


def test_the_curated_baseline_names_each_guarding_test_once():
    """The mutation check runs the guarding tests unmutated once, as one union: a test named by
    several mutants, or inside a file another mutant names whole, is not run twice."""
    mc = _mutation_check()
    got = mc.union_of([("tests/a.py",), ("tests/a.py::t1", "tests/b.py::t2"), ("tests/b.py::t2", "tests/c.py::t[x]")])
    assert got == {"tests/a.py", "tests/b.py::t2", "tests/c.py::t[x]"}
    every = mc.union_of(m.tests for m in mc.MUTANTS)
    files = {t for t in every if "::" not in t}
    assert every and not any(t.split("::")[0] in files for t in every if "::" in t)


def test_a_rule_whose_fix_is_to_resume_elsewhere_names_the_command_that_does_it():
    """From a rule's documentation to the fixing command without the README: every error or warning
    whose fix is to resume from another checkpoint names `ckptdoctor verify --fix` (which repoints the
    tracker, with --dry-run to preview)."""
    import re
    says = re.compile(r"resume from (?:an older|an earlier|a complete|the newest complete|another tag|an older "
                      r"iteration|an older one)", re.I)
    missing = [r.id for r in catalog().values() if r.severity in ("error", "warning") and says.search(r.fix)
               and "ckptdoctor verify --fix" not in r.fix]
    assert not missing, missing


def test_a_rule_whose_fix_is_the_tracker_names_the_command_that_repoints_it():
    """Issue 41: a verify rule whose fix is to rewrite or repoint the tracker names `ckptdoctor verify --fix`
    (preflight's per-node trackers excepted: each node's copy is fixed on that node)."""
    import re
    says = re.compile(r"(rewrite|repoint)\w* the tracker", re.I)
    missing = [r.id for r in catalog().values() if "verify" in r.subcommands and says.search(r.fix)
               and "ckptdoctor verify --fix" not in r.fix]
    assert not missing, missing


def test_a_finding_without_its_own_hint_carries_its_rules_fix():
    """Issue 41: every finding says what fixes it; where a check gives no hint of its own, the hint
    is the rule's documented fix (shown in text, JSON and SARIF alike)."""
    from ckptdoctor import api
    from ckptdoctor.engine.finding import Hit
    eng = api.make_engine("verify", "x")
    f = eng.emit("CKD150", Hit("x/ckpt", "no manifest"))
    assert f.hint == catalog()["CKD150"].fix and "ckptdoctor manifest" in f.hint
    g = eng.emit("CKD112", Hit("x/latest", "tracker is empty", hint="write 300 into it"))
    assert g.hint.startswith("write 300 into it")  # the check's own words first (then its rule's command)


@pytest.mark.parametrize("rule_id", sorted(r.id for r in catalog().values() if "`ckptdoctor " in (r.fix or "")))
def test_a_findings_own_hint_still_names_the_command_its_rule_documents(rule_id):
    """Issue 41: a check's own hint (naming the file or the step) that names no command carries the
    command of its rule's fix, so the way from any finding to the fixing command is on the finding."""
    from ckptdoctor import api
    from ckptdoctor.engine.finding import Hit
    eng = api.make_engine("verify", "/x")
    f = eng.emit(rule_id, Hit(path="/x/f", message="m", hint="resume from an older checkpoint"))
    fix = catalog()[rule_id].fix
    cmd = fix[fix.index("`ckptdoctor "):].split("`")[1]
    assert f.hint.startswith("resume from an older checkpoint (") and f"`{cmd}`" in f.hint, f.hint
    own = eng.emit(rule_id, Hit(path="/x/g", message="m", hint="run `ckptdoctor publish` again"))
    assert own.hint == "run `ckptdoctor publish` again"


def test_every_equivalent_mutant_listed_in_mutation_md_still_names_a_line_of_its_module():
    """A survivor listed as equivalent excuses exactly one generated mutant: the entry names its
    module and the line as it stands (an entry whose line is gone would excuse nothing, or the
    wrong thing after an edit), with a reason."""
    import importlib.util
    import sys
    root = TESTS.parent
    spec = importlib.util.spec_from_file_location("ckd_generated_mutants", root / "scripts" / "generated_mutants.py")
    gm = importlib.util.module_from_spec(spec)
    sys.modules["ckd_generated_mutants"] = gm
    spec.loader.exec_module(gm)
    listed = gm.equivalents()
    assert listed, "MUTATION.md lists no equivalent mutant (or its table no longer parses)"
    for key, why in listed.items():
        module, _, change = key.partition(": ")
        old = change.split(" => ")[0]
        assert why.strip() and (root / module).is_file(), key
        lines = [ln.strip() for ln in (root / module).read_text().splitlines()]
        assert all(part in lines for part in old.split(" / ")), f"{module}: no line {old!r}"


def test_a_generated_mutant_that_only_changes_a_function_annotation_is_equivalent_and_nothing_else_is():
    """Under `from __future__ import annotations` a function's annotations are strings never
    evaluated: such a survivor is excused by construction (ASTs compared), and a mutant that changes
    a name or a value on the same kind of line is not."""
    import importlib.util
    import sys
    root = TESTS.parent
    spec = importlib.util.spec_from_file_location("ckd_generated_mutants2", root / "scripts" / "generated_mutants.py")
    gm = importlib.util.module_from_spec(spec)
    sys.modules["ckd_generated_mutants2"] = gm
    spec.loader.exec_module(gm)
    src = "from __future__ import annotations\nLIMIT = 64 << 10\ndef f(x: int | None) -> int | None:\n    return x\n"
    assert gm.annotation_only(src, 3, "-def f(x: int | None) -> int | None:\n+def f(x: int << None) -> int | None:\n")
    assert gm.annotation_only(src, 3, "-def f(x: int | None) -> int | None:\n+def f(x: int | None) -> int ** None:\n")
    assert not gm.annotation_only(src, 3, "-def f(x: int | None) -> int | None:\n+def g(x: int | None) -> int | None:\n")
    assert not gm.annotation_only(src, 2, "-LIMIT = 64 << 10\n+LIMIT = 65 << 10\n")
    evaluated = src.replace("from __future__ import annotations\n", "")   # annotations evaluated at def time
    assert not gm.annotation_only(evaluated, 2, "-def f(x: int | None) -> int | None:\n+def f(x: int << None) -> int | None:\n")


def test_a_run_roots_hints_name_that_run_root_not_the_placeholder(tmp_path):
    """Issue 41: a finding of a run root whose hint carries its rule's command (`ckptdoctor verify
    --fix RUN_ROOT`) names the run root itself, so the command can be pasted as it is."""
    import shutil
    from ckptdoctor import api
    from helpers import assert_fires
    src = TESTS / "fixtures" / "real" / "composer" / "run"
    run = tmp_path / "my run"
    shutil.copytree(src, run, symlinks=True)
    (run / "ep0-ba4-rank0.pt").write_bytes((run / "ep0-ba4-rank0.pt").read_bytes()[:5000])
    rep = api.verify(str(run), target="all")
    hits = assert_fires(rep, "CKD117", path_contains="ep0-ba4-rank0.pt")
    assert all("RUN_ROOT" not in (f.hint or "") for f in rep.findings), [f.hint for f in rep.findings]
    assert any(f"verify --fix '{run}'" in (f.hint or "") for f in hits), [f.hint for f in hits]


def _mutant_tests():
    import importlib.util
    import sys
    spec = importlib.util.spec_from_file_location("ckd_mutant_tests", TESTS.parent / "scripts" / "mutant_tests.py")
    mt = importlib.util.module_from_spec(spec)
    sys.modules["ckd_mutant_tests"] = mt
    spec.loader.exec_module(mt)
    return mt


def test_a_coverage_directed_mutant_run_only_narrows_to_the_tests_that_ran_a_function_body_line(tmp_path):
    """The full generated-mutant run picks, per mutant, the tests that executed its line on the
    unmutated code.  It narrows only where that is sound: a line that runs at import (module level,
    a default, a decorator) or that some test reached without a test id of its own runs the whole
    group; a multi-line statement counts every line the tracer may report; a line no test reached
    runs nothing (a survivor); a change to annotations alone runs nothing (equivalent)."""
    mt = _mutant_tests()
    src = ("from __future__ import annotations\n"      # 1
           "LIMIT = 64\n"                               # 2
           "def f(x: int, cap=LIMIT) -> int:\n"         # 3
           "    y = min(x,\n"                           # 4
           "            cap)\n"                         # 5
           "    if (y >\n"                              # 6
           "            3):\n"                          # 7
           "        return 1\n"                         # 8
           "    return g(y)\n"                          # 9
           "def g(y):\n"                                # 10
           "    return y + 1\n"                         # 11
           "def h():\n"                                 # 12
           "    return 0\n")                            # 13
    rel = "pkg/mod.py"
    (tmp_path / "pristine" / "pkg").mkdir(parents=True)
    (tmp_path / "pristine" / rel).write_text(src)
    (tmp_path / "work" / "pkg").mkdir(parents=True)
    m = {"tests": ["t.py"], "pristine": str(tmp_path / "pristine"), "log": str(tmp_path / "log"),
         "modules": {rel: {"4": ["t.py::a"], "6": ["t.py::b"], "8": ["t.py::c"], "11": ["", "t.py::d"]}}}

    def chosen(old, new):
        (tmp_path / "work" / rel).write_text(src.replace(old, new, 1))
        return mt.select(m, str(tmp_path / "work"))[1]

    assert chosen("LIMIT = 64", "LIMIT = 65") == [mt.ALL]                    # module level
    assert chosen("cap=LIMIT) -> int", "cap=None) -> int") == [mt.ALL]       # a default
    assert chosen("            cap)", "            cap + 1)") == ["t.py::a"]  # 2nd line of a statement
    assert chosen("            3):", "            4):") == ["t.py::b"]         # 2nd line of an if's test
    assert chosen("        return 1", "        return 2") == ["t.py::c"]
    assert chosen("    return y + 1", "    return y - 1") == [mt.ALL]       # reached without a test id
    assert chosen("    return 0", "    return 1") == []                       # no test reaches h
    assert chosen("x: int, cap", "x: float, cap") == []                       # annotations only
    plain = src.replace("from __future__ import annotations\n", "# evaluated annotations\n")
    assert not mt.annotations_only(plain, plain.replace("x: int, cap", "x: float, cap"))
    (tmp_path / "work" / rel).write_text(src)
    assert mt.select(m, str(tmp_path / "work"))[1] == [mt.ALL]                  # nothing changed: no narrowing


def test_a_coverage_directed_mutant_run_never_counts_a_missing_test_id_as_a_kill(tmp_path, monkeypatch):
    """pytest's "usage error" (a selected test id not found) and "no tests collected" exit non-zero,
    which cosmic-ray would count as a kill: the selector runs the whole group instead."""
    import json
    import sys
    mt = _mutant_tests()
    m = {"tests": ["all.py"], "pristine": str(tmp_path), "log": str(tmp_path / "log"), "modules": {}}
    (tmp_path / "map.json").write_text(json.dumps(m))
    monkeypatch.setattr(mt, "select", lambda m, work: ("1 covering test", ["t.py::gone"]))
    ran = []
    monkeypatch.setattr(mt, "_pytest", lambda tests: ran.append(tests) or (4 if tests == ["t.py::gone"] else 0))
    monkeypatch.setattr(sys, "argv", ["mutant_tests.py", str(tmp_path / "map.json")])
    assert mt.main() == 0 and ran == [["t.py::gone"], ["all.py"]]


def test_the_population_estimate_weights_each_group_by_its_size_and_ignores_equivalents(tmp_path):
    """MUTATION.md's population score is killed / non-equivalent with each group's sample weighted by
    the group's population: a group of 100 at 1 of 2 and one of 300 at 2 of 2 non-equivalent (its
    equivalent and annotation-only mutants excluded) make 80 %, not the 75 % of the pooled counts."""
    est = _script("mutation_estimate")
    rows = [("a", 100, "killed"), ("a", 100, "survived"),
            ("b", 300, "killed"), ("b", 300, "killed"), ("b", 300, "equivalent"), ("b", 300, "annotation")]
    p = tmp_path / "s.jsonl"
    p.write_text("".join(json.dumps({"group": g, "population": n, "as_the_suite_stood": v}) + "\n" for g, n, v in rows))
    by_group, population = est.load([str(p)])
    assert est.estimate(by_group, population) == pytest.approx(0.8)
    lo, hi = est.interval(by_group, population, rounds=500)
    assert 0 <= lo <= hi <= 1
    assert est.estimate({"a": ["equivalent"]}, {"a": 10}) is None


def test_the_population_estimate_in_mutation_md_is_what_the_recorded_samples_give():
    est = _script("mutation_estimate")
    by_group, population = est.load([str(TESTS.parent / "benchmarks" / "mutation" / "session32.jsonl")])
    assert sum(map(len, by_group.values())) == 230
    point = est.estimate(by_group, population)
    lo, hi = est.interval(by_group, population)
    text = (TESTS.parent / "MUTATION.md").read_text()
    assert f"{point:.1%}".replace("%", " %") in text and f"{lo:.1%}-{hi:.1%}".replace("%", "") + " %" in text, \
        (point, lo, hi)
