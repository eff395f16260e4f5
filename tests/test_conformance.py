"""Each family's verdicts agree with what its real library does, in both directions.

The fixtures under tests/fixtures/real/<library>/ were written by the real library (the generators in
tests/conformance/, run with the `conformance` extra); each `outcomes.json` records, per damage case,
what the library's own load did with the damaged copy.  Here every case is applied again to a copy of
the committed healthy run root (the same tests/conformance/damage.py) and the relaunch gate must agree:

  the real load restored what was saved at the resume target  ->  `verify --target resume` passes
  it restored all but the RNG state (loses-exactness)  ->  the gate passes, a warning names the file
  it raised, hung, restarted silently, dropped state or loaded other state  ->  the gate fails and
  names the damaged file
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from ckptdoctor import api
from helpers import FIRED

HERE = Path(__file__).parent
REAL = HERE / "fixtures" / "real"
sys.path.insert(0, str(HERE / "conformance"))
import damage  # noqa: E402


def _docs() -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(REAL.glob("*/outcomes.json"))}


def _cases():
    for lib, doc in _docs().items():
        for stage, st in sorted(doc["stages"].items()):
            for name, case in sorted(st["cases"].items()):
                yield pytest.param(lib, st["root"], case, id=f"{lib}-{st['root']}-{name}")


def test_fixtures_are_stamped_with_the_pinned_library_version():
    """A fixture set is only evidence for the library version it was made with: when the pin in the
    `conformance` extra moves, the generator must be run again (this fails until it is)."""
    pyproject = (HERE.parent / "pyproject.toml").read_text()
    pins = dict(re.findall(r'"([A-Za-z0-9_.-]+)==([0-9][^"]*)"', pyproject.split("conformance = [", 1)[1]
                           .split("]", 1)[0]))
    docs = _docs()
    assert docs, "no conformance fixtures found"
    for lib, doc in docs.items():
        assert doc["library"] in pins, f"{lib}: {doc['library']} is not pinned in the conformance extra"
        assert doc["version"] == pins[doc["library"]], \
            f"{lib} fixtures were made with {doc['library']} {doc['version']}, the extra pins " \
            f"{pins[doc['library']]}: run {doc['generator']} again"


@pytest.mark.parametrize("lib,root,case", list(_cases()))
def test_relaunch_gate_agrees_with_the_real_load(tmp_path, lib, root, case):
    run = damage.copy_and_apply(str(REAL / lib / root), str(tmp_path / "run"), case["ops"])
    rep = api.verify(run, target="resume")
    errors = [f for f in rep.findings if f.severity == "error"]
    if case["outcome"] in ("loads", "loses-exactness"):
        assert not rep.failed(), f"false alarm: the real load succeeded, yet {[(f.rule, f.message) for f in errors]}"
        if case["outcome"] == "loses-exactness":   # it resumes, but not exactly: a warning names the file
            warned = [f for f in rep.findings if f.severity == "warning" and case["names"] in f.path]
            assert warned, f"no warning names {case['names']}: {[(f.rule, f.path) for f in rep.findings]}"
            FIRED.update(f.rule for f in warned)
    else:
        assert rep.failed(), f"false pass: the real load {case['outcome']} ({case['detail']}), the gate passed"
        named = [f for f in errors if case["names"] in f.path or case["names"] in f.message]
        assert named, f"the gate failed but named none of {case['names']!r}: " \
                      f"{[(f.rule, f.path, f.message) for f in errors]}"
        FIRED.update(f.rule for f in named)
