"""Each family's verdicts agree with what its real library does, in both directions.

The fixtures under tests/fixtures/real/<library>/ were written by the real library (the generators in
tests/conformance/, run with the `conformance` extra); each `outcomes.json` records, per damage case,
what the library's own load did with the damaged copy.  Here every case is applied again to a copy of
the committed healthy run root (the same tests/conformance/damage.py) and the relaunch gate must agree:

  the real load restored what was saved at the resume target  ->  `verify --target resume` passes
  it restored all but the RNG state (loses-exactness), or only when the script passes explicit restore
  args (loads-with-args)  ->  the gate passes, a warning names the file
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
    extras = re.findall(r'^conformance(?:-[a-z]+)? = \[(.*?)\]', pyproject, re.M | re.S)
    assert len(extras) >= 2, "the conformance extras were not found in pyproject.toml"
    pins = dict(re.findall(r'"([A-Za-z0-9_.-]+)==([0-9][^"]*)"', " ".join(extras)))
    docs = _docs()
    assert docs, "no conformance fixtures found"
    for lib, doc in docs.items():
        assert doc["library"] in pins, f"{lib}: {doc['library']} is not pinned in the conformance extra"
        assert doc["version"] == pins[doc["library"]], \
            f"{lib} fixtures were made with {doc['library']} {doc['version']}, the extra pins " \
            f"{pins[doc['library']]}: run {doc['generator']} again"


class _Seen:
    """A report as the real CLI printed it (`--format json`), for a case verified without root's
    capability to bypass permission bits, as the job's user would (tests/conformance/damage.py)."""
    def __init__(self, prefix: list[str], run: str):
        import subprocess
        from types import SimpleNamespace
        p = subprocess.run([*prefix, sys.executable, "-m", "ckptdoctor", "verify", run, "--target", "resume",
                            "--format", "json"], capture_output=True, text=True, timeout=300)
        assert p.returncode in (0, 1), (p.returncode, p.stderr[-2000:])
        self.rc = p.returncode
        self.findings = [SimpleNamespace(**f) for f in json.loads(p.stdout)["findings"]]

    def failed(self) -> bool:
        return self.rc != 0


@pytest.mark.parametrize("lib,root,case", list(_cases()))
def test_relaunch_gate_agrees_with_the_real_load(tmp_path, lib, root, case):
    run = damage.copy_and_apply(str(REAL / lib / root), str(tmp_path / "run"), case["ops"])
    prefix = damage.unprivileged(case["ops"])
    rep = _Seen(prefix, run) if prefix else api.verify(run, target="resume")
    errors = [f for f in rep.findings if f.severity == "error"]
    if case["outcome"] in ("loads", "loses-exactness", "loads-with-args"):
        assert not rep.failed(), f"false alarm: the real load succeeded, yet {[(f.rule, f.message) for f in errors]}"
        if case["outcome"] != "loads":   # it resumes, but not exactly, or not every way: a warning names the file
            warned = [f for f in rep.findings if f.severity == "warning" and case["names"] in f.path]
            assert warned, f"no warning names {case['names']}: {[(f.rule, f.path) for f in rep.findings]}"
            FIRED.update(f.rule for f in warned)
    else:
        assert rep.failed(), f"false pass: the real load {case['outcome']} ({case['detail']}), the gate passed"
        named = [f for f in errors if case["names"] in f.path or case["names"] in f.message]
        assert named, f"the gate failed but named none of {case['names']!r}: " \
                      f"{[(f.rule, f.path, f.message) for f in errors]}"
        FIRED.update(f.rule for f in named)


# ---- issue 36: preflight per rank, against Megatron-Core's own load from each node's copy ----------
SPLITS = REAL / "megatron-core" / "preflight_splits.json"


def _splits():
    doc = json.loads(SPLITS.read_text())
    for name, sp in sorted(doc["splits"].items()):
        yield pytest.param(doc, sp, id=name)


def test_split_labels_are_stamped_with_the_fixture_they_were_made_from():
    doc = json.loads(SPLITS.read_text())
    assert doc["version"] == doc["fixture_version"] == _docs()["megatron-core"]["version"], \
        f"run {doc['generator']} again: the labels must come from the library that wrote the fixture"
    assert any(sp["failed_ranks"] for sp in doc["splits"].values())
    assert any(not sp["failed_ranks"] for n, sp in doc["splits"].items() if n != "full")


@pytest.mark.parametrize("doc,split", list(_splits()))
def test_preflight_names_exactly_the_ranks_whose_megatron_load_fails(tmp_path, doc, split):
    """Megatron-Core 0.16 torch_dist, TP=2 on 2 nodes, each rank loading its node's copy: TP shards are
    read by their writer, the replicated tensor (rank 0's file) and metadata.json/common.pt by every
    rank, the per-rank `rng_state/shard_0.{tp}_1.2` ShardedObjects by their own rank only.  Without a
    recorded plan and with one (`--read-plan`, the keys each rank's sharded state dict holds, written
    by the generator), preflight's errors name exactly the ranks whose real load failed, and nothing
    is left undecided."""
    from helpers import cli
    for n, ops in split["ops"].items():
        damage.copy_and_apply(str(REAL / "megatron-core" / "torch_dist"), str(tmp_path / n), ops)
    for plan in ([], ["--read-plan", str(REAL / "megatron-core" / "read_plan.json")]):  # evidence, then recorded
        rc, out, err = cli("preflight", f"{tmp_path}/{{node}}", "--nodelist", ",".join(doc["nodes"]),
                           "--ranks-per-node", str(doc["ranks_per_node"]), "-f", "json", *plan)
        assert "Traceback" not in err, err
        rep = json.loads(out)
        errors = {r for f in rep["findings"] if f["severity"] == "error" and f["rule"] in ("CKD401", "CKD402", "CKD403")
                  for r in f["details"].get("ranks", [])}
        assert errors == set(split["failed_ranks"]), (plan, split["detail"], rep["findings"])
        assert not [f for f in rep["findings"] if f["rule"] == "CKD411"], rep["findings"]
        assert (rc == 0) == (not errors)


# ---- which torch loads a DCP checkpoint (gen_torch_versions.py: real dcp.save / dcp.load of each version)
TV = REAL / "torch-versions"


def _loads() -> list:
    doc = json.loads((TV / "loads.json").read_text())
    out = []
    for key, outcome in sorted(doc["loads"].items()):
        m = re.match(r"^(\S+) -> (\S+) (plain|sharded)$", key)
        out.append(pytest.param(m.group(1), m.group(2), m.group(3), outcome, id=key.replace(" ", "_")))
    return out


def test_the_cross_version_matrix_covers_old_and_new_torch():
    doc = json.loads((TV / "loads.json").read_text())
    assert {"2.3.1", "2.13.0", "2.15.0"} <= set(doc["versions"]) and len(doc["versions"]) >= 4
    assert len(doc["loads"]) == 2 * len(doc["versions"]) ** 2
    assert any(v != "loads" and not v.startswith("loads") for v in doc["loads"].values()), "no failing pair measured"


@pytest.mark.parametrize("writer,reader,kind,outcome", _loads())
def test_verify_with_the_loader_torch_agrees_with_the_real_load(writer, reader, kind, outcome):
    """No false pass (a torch that failed to load it is an error naming .metadata) and no false alarm
    (a torch that loaded it passes), for every writer and reader version measured."""
    rep = api.verify(str(TV / writer / kind), loader_torch=reader)
    hits = [f for f in rep.findings if f.rule == "CKD134"]
    if outcome.startswith("loads"):
        assert not hits and not rep.failed(), [(f.rule, f.message) for f in rep.findings]
    else:
        # each way measured (a global the reader lacks, a state wider than its __setstate__ unpacks, a
        # nested non-tensor dict stored whole that the reader looks up flattened) is a CheckpointException
        assert outcome.startswith("CheckpointException"), outcome
        FIRED.add("CKD134")
        assert hits and hits[0].severity == "error" and hits[0].path.endswith(".metadata"), rep.findings
        assert f"torch {reader}" in hits[0].message and rep.failed()


@pytest.mark.parametrize("writer", sorted(p.name for p in TV.iterdir() if p.is_dir()) if TV.is_dir() else [])
def test_verify_reports_which_torch_can_load_each_checkpoint(writer):
    rep = api.verify(str(TV / writer / "plain"))
    [row] = rep.facts["checkpoints"]
    v = tuple(map(int, writer.split(".")))
    want = ({"loadable_by": ">=2.15", "because": ["torch.distributed.checkpoint.metadata.TensorProperties.state[6]"]}
            if v >= (2, 15) else
            {"loadable_by": ">=2.4", "because": ["torch.distributed.checkpoint.metadata.StorageMeta"]}
            if v >= (2, 4) else {"loadable_by": "any", "because": [],
                                 # 2.3.1 stored the non-tensor dict "extra" whole: 2.4.x cannot load it
                                 "except": [{"from": "2.4", "until": "2.5", "keys": ["extra"]}]})
    assert row["torch"] == want, row


def test_the_installed_torch_is_the_default_loader(tmp_path, monkeypatch):
    from ckptdoctor.layouts import torchver
    monkeypatch.setattr(torchver, "installed", lambda: "2.3.1")
    rep = api.verify(str(TV / "2.13.0" / "plain"))
    [hit] = [f for f in rep.findings if f.rule == "CKD134"]
    assert "installed here" in hit.message and hit.details["source"] == "installed here"
    assert "its .metadata pickles StorageMeta, which torch reads only since 2.4" in hit.message, hit.message
    monkeypatch.setattr(torchver, "installed", lambda: None)
    assert not api.verify(str(TV / "2.13.0" / "plain")).failed()


@pytest.mark.parametrize("n, more", [(4, False), (5, True)])
def test_the_whole_stored_dicts_are_named_up_to_four(tmp_path, monkeypatch, n, more):
    """CKD134's 2.4.x gap names the dicts stored whole: four are all named, a fifth makes "...".
    (The torch-free writer records StorageMeta, as torch >= 2.4 does; the test makes its marker a
    name nothing records, so the checkpoint reads as a pre-2.4 save.)"""
    import pickle
    from ckptdoctor.layouts import dcp_writer as W
    from ckptdoctor.layouts import torchver

    def saved(obj):   # the writer frames it as torch.save's zip record does
        return pickle.dumps(obj, protocol=2)
    keys = "abcde"[:n]
    W.write(str(tmp_path / "c"), [W.Item("w", (2,), (0,), (2,), [1.0, 2.0], rank=0)] +
            [W.Item(k, None, payload=saved({"x": 1}), rank=0) for k in keys])
    monkeypatch.setattr(torchver, "STORAGE_META", "not.recorded")
    [hit] = [f for f in api.verify(str(tmp_path / "c"), loader_torch="2.4.1").findings if f.rule == "CKD134"]
    named = ", ".join(repr(k) for k in keys[:4]) + (" ..." if more else "")
    assert f"it stores the non-tensor dict(s) {named} whole (written before torch 2.4)" in hit.message, hit.message


def test_a_stored_dict_is_recognised_from_its_first_bytes_and_a_damaged_item_decides_nothing(tmp_path):
    """The 2.4.x gap is read from the bytes item's own zip entry (64 bytes at most, never unpickled):
    a damaged item is not taken for a dict (no finding from it, no crash), and the checkpoint's other
    findings are unchanged."""
    import shutil
    from ckptdoctor.layouts import dcp as D
    ck = shutil.copytree(TV / "2.3.1" / "plain", tmp_path / "c")
    md = D.parse((ck / ".metadata").read_bytes())
    [s] = [s for s in md.storage if s.fqn == "extra"]
    rep = api.verify(str(ck), loader_torch="2.4.1")
    assert [f.rule for f in rep.findings if f.severity == "error"] == ["CKD134"], rep.findings
    [hit] = [f for f in rep.findings if f.rule == "CKD134"]
    assert "it stores the non-tensor dict(s) 'extra' whole (written before torch 2.4)" in hit.message, hit.message
    FIRED.add("CKD134")
    data = bytearray((ck / s.relative_path).read_bytes())
    data[s.file_offset:s.file_offset + 4] = b"XXXX"     # no zip local header where the item starts
    (ck / s.relative_path).write_bytes(bytes(data))
    rep = api.verify(str(ck), loader_torch="2.4.1")
    assert not [f for f in rep.findings if f.rule == "CKD134"], rep.findings
    assert "except" not in rep.facts["checkpoints"][0]["torch"]


def test_the_readme_states_for_each_family_the_library_version_and_case_count_it_was_proven_with():
    """The README's "Proven against the real libraries" table is what a user trusts: each stamped
    generator's row names its library and torch (or jax) versions, its world and the number of
    cases it recorded (the Composer row said 10 after the generator recorded 13)."""
    readme = (HERE.parent / "README.md").read_text()
    table = readme.split("### Proven against the real libraries", 1)[1].split("\n\n|", 1)[1].split("\n\n", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in ("|" + table).splitlines()[2:]]
    checked = 0
    for path in sorted(REAL.glob("*/outcomes.json")):
        out = json.loads(path.read_text())
        lib = f"{out['library']} {out['version']}"
        row = next((r for r in rows if lib in r[1]), None)
        assert row is not None, f"no README row proven with {lib} ({path.parent.name})"
        for dep in ("torch", "jax"):
            if out.get(dep):
                assert f"{dep} {out[dep]}" in row[1], (row[1], dep, out[dep])
        cases = sum(len(stage["cases"]) for stage in out["stages"].values())
        assert row[3] == str(cases), (lib, row[3], cases)
        world = "1 process" if out["world_size"] == 1 else f"{out['world_size']} gloo ranks"
        assert row[2] == world, (lib, row[2], world)
        checked += 1
    assert checked >= 5


def test_a_too_old_loader_is_told_which_pickled_classes_it_lacks_by_name():
    """CKD134 names what the .metadata pickles that the loader lacks: a checkpoint torch 2.15 wrote
    needs a TensorProperties with 6 state fields (2.15+); torch 2.13 loading it is told so."""
    rep = api.verify(str(TV / "2.15.0" / "plain"), loader_torch="2.13.0")
    [hit] = [f for f in rep.findings if f.rule == "CKD134"]
    assert hit.severity == "error" and "its .metadata pickles TensorProperties with 6 state fields, which torch " \
        "reads only since 2.15" in hit.message, hit.message
