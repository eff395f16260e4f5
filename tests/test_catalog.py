"""The catalog (rules/*.yaml) and the registry (check functions) must match exactly, and every
rule must have a test that makes it fire."""
import re
from pathlib import Path

from ckptdoctor.engine.catalog import catalog
from ckptdoctor.engine.registry import load_all
from ckptdoctor.layouts.spec import layouts

TESTS = Path(__file__).parent


def test_catalog_and_registry_match_both_ways():
    cat = set(catalog())
    reg = set(load_all())
    assert cat - reg == set(), f"catalog entries without a check: {sorted(cat - reg)}"
    assert reg - cat == set(), f"checks without a catalog entry: {sorted(reg - cat)}"


def test_every_rule_has_a_test_that_makes_it_fire():
    fired = set()
    for p in TESTS.glob("test_*.py"):
        fired |= set(re.findall(r'assert_fires(?:_json)?\((?:[^()]|\([^()]*\))*?"(CKD\d{3})"', p.read_text()))
    fired |= set(re.findall(r'"(CKD9\d\d)"', (TESTS / "test_cli_contract.py").read_text()))
    missing = sorted(set(catalog()) - fired)
    assert not missing, f"rules no test makes fire: {missing}"


def test_catalog_entries_are_well_formed():
    names = set()
    for r in catalog().values():
        assert r.name not in names
        names.add(r.name)
        area = {"1": "verify", "2": "publish", "3": "reconcile", "4": "preflight"}.get(r.id[3])
        if area:
            assert area in r.subcommands, (r.id, r.subcommands)
        assert len(r.why) > 40 and len(r.fix) > 10 and r.summary


def test_family_step_names_and_trackers_round_trip():
    """Each family's step naming builds names it parses back, and a tracker it writes names the
    checkpoint it was written for (what publish writes, verify and preflight read)."""
    from ckptdoctor.layouts import trackers
    ls = layouts()
    runs = [l for l in ls.values() if l.scope == "run"]
    assert {l.family for l in runs} >= {"megatron", "verl", "deepspeed", "torchtitan", "nemo-rl", "hf-trainer", "orbax"}
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
