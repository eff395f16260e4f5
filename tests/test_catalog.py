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


def test_layouts_reference_existing_layouts_and_valid_regexes():
    ls = layouts()
    for l in ls.values():
        for n in l.checkpoint_layouts:
            assert n in ls and ls[n].scope == "checkpoint", (l.name, n)
        if l.checkpoint_dirs:
            assert l.dir_re.groups >= 0
