"""One model of each checkpoint family, read by every subcommand: regression tests for the defects
its absence caused (issue 13), and one parametrized check that verify and preflight name the same
resume target on every family's run root."""
import json
import os
import shutil

import pytest

from ckptdoctor import api
from ckptdoctor.layouts import dcp_writer as W
from helpers import assert_fires, assert_no_errors, cli


def dcp_dir(d, world=1, value=1.0, extra=None):
    """A DCP checkpoint (ckptdoctor's torch-free writer, which writes torch's exact format; the
    torch-based tests load the same writer's output with the real dcp.load)."""
    W.write(str(d), [W.Item("w", (2 * world, 4), (2 * r, 0), (2, 4), [value + r] * 8, rank=r) for r in range(world)])
    for rel, data in (extra or {}).items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return d


# ---- one run root per family, with the target the framework itself would pick --------------------
def megatron(root):
    for s in (100, 200):
        d = dcp_dir(root / f"iter_{s:07d}")
        (d / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    (root / "latest_checkpointed_iteration.txt").write_text("200")
    return "iter_0000200"


def torchtitan(root):
    for s in (10, 20):
        dcp_dir(root / f"step-{s}")
    d = dcp_dir(root / "step-30")
    os.remove(d / ".metadata")  # died before the coordinator's commit: torchtitan skips it
    return "step-20"


def deepspeed(root):
    for s in (3, 6):
        d = root / f"global_step{s}"
        d.mkdir(parents=True)
        (d / "mp_rank_00_model_states.pt").write_bytes(b"x" * 64)
        (d / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x" * 64)
    (root / "latest").write_text("global_step3")
    return "global_step3"


def verl(root):
    for s in (20, 40):
        for comp in ("actor", "critic"):
            (root / f"global_step_{s}" / comp).mkdir(parents=True)
            for kind in ("model", "optim", "extra_state"):
                (root / f"global_step_{s}" / comp / f"{kind}_world_size_1_rank_0.pt").write_bytes(b"x" * 64)
        (root / f"global_step_{s}" / "data.pt").write_bytes(b"x" * 64)
    (root / "latest_checkpointed_iteration.txt").write_text("40")
    return "global_step_40"


def nemo_rl(root):
    for s in (6, 7):
        d = root / f"step_{s}"
        d.mkdir(parents=True)
        for f in ("training_info.json", "config.yaml", "train_dataloader.pt"):
            (d / f).write_text("{}")
    (root / "tmp_step_8").mkdir()
    return "step_7"


def hf_trainer(root):
    for s in (500, 1000):
        d = root / f"checkpoint-{s}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text(json.dumps({"global_step": s}))
    return "checkpoint-1000"


def orbax(root, leftover=False):
    for s in (100, 200):
        d = root / str(s)
        d.mkdir(parents=True)
        (d / "_CHECKPOINT_METADATA").write_text("{}")
        (d / "commit_success.txt").write_text("ok")
    if leftover:
        (root / "300.orbax-checkpoint-tmp-1234").mkdir()
    return "200"


RUNS = {"megatron": megatron, "torchtitan": torchtitan, "deepspeed": deepspeed, "verl": verl,
        "nemo-rl": nemo_rl, "hf-trainer": hf_trainer, "orbax": orbax,
        "orbax-with-leftover": lambda r: orbax(r, leftover=True)}


@pytest.mark.parametrize("family", RUNS)
def test_verify_and_preflight_name_the_same_resume_target(tmp_path, family):
    root = tmp_path / "run"
    want = RUNS[family](root)
    rep = api.verify(str(root))
    assert rep.facts["resume_from"] == want, (family, rep.facts)
    rc, out, err = cli("preflight", str(root), "--nodelist", "n1", "--ranks-per-node", "1", "-f", "json")
    pf = json.loads(out)
    assert pf["facts"]["resume_from"] == want, (family, pf["facts"], err)
    errors = [(f["rule"], f["message"]) for f in pf["findings"] if f["severity"] == "error"]
    assert rc == 0 and not errors, (family, errors)


def test_torchtitan_uncommitted_newest_step_is_not_a_preflight_error(tmp_path):
    """Defect 1: preflight used to say step-30 (CKD403 + CKD406 errors); torchtitan loads step-20."""
    root = tmp_path / "titan"
    torchtitan(root)
    rc, out, _ = cli("preflight", str(root), "--nodelist", "n1", "--ranks-per-node", "1", "-f", "json")
    pf = json.loads(out)
    assert rc == 0 and pf["facts"]["resume_from"] == "step-20"
    assert {f["rule"] for f in pf["findings"] if f["severity"] == "error"} == set()


# ---- defect 2: retention on an object store protects the destination's tracker target ---------------
@pytest.mark.parametrize("remote", [False, True])
def test_keep_last_never_prunes_the_tracker_target_even_with_tracker_none(tmp_path, remote):
    dest = f"memory://ckd-retention-{os.getpid()}-{tmp_path.name}" if remote else str(tmp_path / "dest")
    src = tmp_path / "src"
    for s in (100, 200):
        dcp_dir(src / f"iter_{s:07d}", value=float(s), extra={"metadata.json": b'{"sharded_backend": "torch_dist"}'})
    api.publish(str(src / "iter_0000100"), dest)                       # tracker -> 100
    res = api.publish(str(src / "iter_0000200"), dest, tracker="none", keep_last=1)
    assert res.pruned == [] and res.kept["iter_0000100"] == "the tracker names it"
    rep = api.verify(dest)
    assert rep.facts["resume_from"] == "iter_0000100"
    assert {c["name"] for c in rep.facts["checkpoints"]} == {"iter_0000100", "iter_0000200"}
    assert_no_errors(rep)


# ---- defect 3: no depth limit hides a deep file from the manifest check ------------------------------
def test_deep_file_is_published_and_verified(tmp_path):
    deep = "/".join("abcdefghi") + "/extra.bin"
    src = dcp_dir(tmp_path / "src" / "iter_0000100", extra={deep: b"payload"})
    api.publish(str(src), str(tmp_path / "dest"))
    rep = api.verify(str(tmp_path / "dest" / "iter_0000100"), checksums=True)
    assert not rep.findings, [(f.rule, f.message) for f in rep.findings]
    (tmp_path / "dest" / "iter_0000100" / deep).write_bytes(b"pAyload")
    rep = api.verify(str(tmp_path / "dest" / "iter_0000100"), checksums=True)
    assert_fires(rep, "CKD151", path_contains="extra.bin")


def test_a_tree_past_the_walk_cap_is_a_finding_never_a_silent_pass(tmp_path, monkeypatch):
    from ckptdoctor.io import fs
    monkeypatch.setattr(fs, "MAX_TREE_DEPTH", 4)
    d = dcp_dir(tmp_path / "ck", extra={"a/b/c/d/e/f.bin": b"x"})
    rep = api.verify(str(d), checksums=True)
    hits = assert_fires(rep, "CKD901")
    assert "deeper than 4" in hits[0].message and rep.failed()


# ---- defect 4: content decides the family; names only break ties -------------------------------------
def test_plain_dcp_in_an_iter_named_directory_is_dcp(tmp_path):
    d = dcp_dir(tmp_path / "iter_0000100")
    rep = api.verify(str(d))
    assert rep.facts["layout"] == "dcp" and not rep.findings, [(f.rule, f.message) for f in rep.findings]
    (d / "common.pt").write_bytes(W.object_archive(b"\x80\x02}q\x00."))  # a Megatron file: Megatron, unfinalized
    rep = api.verify(str(d))
    assert rep.facts["layout"] == "megatron-torch-dist"
    assert_fires(rep, "CKD101", path_contains="iter_0000100")


def test_megatron_run_claims_its_dcp_directory_without_metadata_json(tmp_path):
    """Inside a Megatron run root (tracker present) a DCP iteration without metadata.json (and
    without common.pt, which newer Megatron no longer writes) is a save that died before finalize:
    Megatron's loader refuses it, so it is not complete."""
    root = tmp_path / "run"
    megatron(root)
    os.remove(root / "iter_0000200" / "metadata.json")
    rep = api.verify(str(root))
    rows = {r["name"]: r for r in rep.facts["checkpoints"]}
    assert rows["iter_0000200"]["layout"] == "megatron-torch-dist" and not rows["iter_0000200"]["complete"]
    assert_fires(rep, "CKD101", path_contains="iter_0000200")
    assert_fires(rep, "CKD113")  # the tracker names it
    assert rep.facts["newest_complete"] == "iter_0000100"


def test_dcp_published_as_step_n_is_not_nemo_rl(tmp_path):
    src = dcp_dir(tmp_path / "src" / "step_2")
    api.publish(str(src), str(tmp_path / "dest"))
    rep = api.verify(str(tmp_path / "dest"))
    assert rep.facts["layout"] == "nemo-rl-run"
    assert rep.facts["checkpoints"][0]["layout"] == "dcp"
    assert not rep.findings, [(f.rule, f.message) for f in rep.findings]


# ---- defect 5: a forced layout that does not fit is a finding ----------------------------------------
@pytest.mark.parametrize("layout", ["megatron", "hf-trainer", "orbax"])
def test_forced_layout_that_does_not_fit_fails(tmp_path, layout):
    d = dcp_dir(tmp_path / "ck")
    rc, out, err = cli("verify", str(d), "--layout", layout, "-f", "json")
    doc = json.loads(out)
    hits = [f for f in doc["findings"] if f["rule"] == "CKD902"]
    assert rc == 1 and hits and f"--layout {layout}" in hits[0]["message"], (doc, err)


def test_forced_layout_that_fits_is_judged_by_it(tmp_path):
    d = dcp_dir(tmp_path / "ck")
    rep = api.verify(str(d), layout="megatron-torch-dist")
    assert rep.facts["layout"] == "megatron-torch-dist"
    assert_fires(rep, "CKD101")  # metadata.json missing: what Megatron's loader would refuse


# ---- defect 6: every config key is known and typed ---------------------------------------------------
@pytest.mark.parametrize("toml, words", [
    ("[verify]\nmtime-tolernce = 5\n", "[verify] unknown key 'mtime-tolernce'"),
    ('[verify]\nmtime-tolerance = "abc"\n', "[verify] mtime-tolerance: expected a number"),
    ("[verify]\nnum-experts = 0\n", "[verify] num-experts: must be at least 1"),
    ("[publish]\nkeep-last = true\n", "[publish] keep-last: expected an integer"),
    ('[preflight]\nranks = "4"\n', "[preflight] unknown key 'ranks'"),
    ('fail-on = "sometimes"\n', "fail-on 'sometimes'"),
    ('[severity]\nCKD107 = "loud"\n', "[severity] CKD107"),
])
def test_config_keys_are_known_and_typed(tmp_path, toml, words):
    d = dcp_dir(tmp_path / "ck")
    cfg = tmp_path / "ckptdoctor.toml"
    cfg.write_text(toml)
    rc, out, err = cli("verify", str(d), "--config", str(cfg))
    assert rc == 2 and words in err and str(cfg) in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_config_option_applies_and_json_names_the_file(tmp_path):
    d = dcp_dir(tmp_path / "ck")
    shard = d / "__0_0.distcp"
    t = os.stat(d / ".metadata").st_mtime
    os.utime(shard, (t + 10, t + 10))  # 10 s newer than the marker
    assert "CKD107" in api.verify(str(d)).rules()
    cfg = tmp_path / "ckptdoctor.toml"
    cfg.write_text("[verify]\nmtime-tolerance = 30\n")
    rc, out, _ = cli("verify", str(d), "--config", str(cfg), "-f", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["config"] == str(cfg) and "CKD107" not in {f["rule"] for f in doc["findings"]}
    rc, out, _ = cli("verify", str(d), "--config", str(cfg), "--mtime-tolerance", "2", "-f", "json")
    assert "CKD107" in {f["rule"] for f in json.loads(out)["findings"]}  # the command line wins


# ---- the README's "adding a family" example works as written -----------------------------------------
def test_readme_family_example_is_one_yaml_file(tmp_path, monkeypatch):
    import re
    from ckptdoctor.layouts import spec
    from pathlib import Path
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    yaml_text = re.search(r"```yaml\n# rules/layouts/acme.yaml\n(.*?)```", readme, re.S).group(1)
    rules = tmp_path / "rules"
    shutil.copytree(Path(spec.data_dir()), rules)
    (rules / "layouts" / "acme.yaml").write_text(yaml_text)
    monkeypatch.setattr(spec, "data_dir", lambda: rules)
    spec.families.cache_clear()
    spec.layouts.cache_clear()
    try:
        run = tmp_path / "acme"
        for s in (100, 200):
            d = run / f"ckpt_{s:06d}"
            d.mkdir(parents=True)
            for r in (0, 1):
                (d / f"shard_{r}.bin").write_bytes(b"x" * 8)
            (d / "acme_state.json").write_text("{}")
        (run / "LATEST").write_text("200")
        rep = api.verify(str(run))
        assert rep.facts["layout"] == "acme-run" and rep.facts["resume_from"] == "ckpt_000200"
        assert_no_errors(rep)
        (run / "ckpt_000200" / "acme_state.json").unlink()
        rep = api.verify(str(run))
        assert_fires(rep, "CKD101", path_contains="ckpt_000200")
        assert_fires(rep, "CKD113")  # the tracker names an incomplete checkpoint
        # publish writes Acme's tracker last, and never backwards
        src = tmp_path / "src" / "ckpt_000300"
        src.mkdir(parents=True)
        for r in (0, 1):
            (src / f"shard_{r}.bin").write_bytes(b"y" * 8)
        (src / "acme_state.json").write_text("{}")
        res = api.publish(str(src), str(run), tracker="acme")
        assert res.tracker["written"] and (run / "LATEST").read_text() == "300"
        # preflight knows which shard each rank reads: node-local copies, n1 lost rank 0's shard
        from ckptdoctor.commands import preflight as pflow
        for n in ("n1", "n2"):
            shutil.copytree(run, tmp_path / "nodes" / n / "acme")
        os.remove(tmp_path / "nodes" / "n1" / "acme" / "ckpt_000300" / "shard_0.bin")
        loc = str(tmp_path / "nodes" / "{node}" / "acme")
        eng = api.make_engine("preflight", loc)
        pflow.run(loc, eng, pflow.allocation("n[1-2]", "1", None))
        assert eng.report.facts["resume_from"] == "ckpt_000300"
        hits = assert_fires(eng.report, "CKD401", severity="error")
        assert [(h.details["node"], h.details["files"]) for h in hits] == [("n1", ["shard_0.bin"])]
    finally:
        spec.families.cache_clear()
        spec.layouts.cache_clear()


def test_facts_are_typed_per_command(tmp_path):
    from ckptdoctor.engine.facts import PreflightFacts, VerifyFacts
    root = tmp_path / "run"
    megatron(root)
    rep = api.verify(str(root))
    assert isinstance(rep.facts, VerifyFacts) and rep.facts.resume_from == rep.facts["resume_from"] == "iter_0000200"
    with pytest.raises(KeyError):
        rep.facts["resume_form"] = "iter_0000100"  # a typo cannot invent a fact
    doc = rep.to_json()["facts"]
    assert set(doc) == {"kind", "layout", "checkpoints", "newest_complete", "resume_from", "target", "checked"}  # no unset keys
    pf = PreflightFacts()
    assert "nodes" not in pf and pf.get("nodes", 7) == 7 and pf.to_json() == {}


def test_a_checkpoints_files_by_pattern_follow_its_listing(tmp_path):
    """What the rules see of a checkpoint by pattern (remembered per listing, issue 42) is exactly
    what its listing holds: sorted by name, literal names and globs alike, and a view given a new
    listing (a re-list after a fix) answers from the new one."""
    from ckptdoctor.io.fs import open_location
    from ckptdoctor.layouts.model import CheckpointView
    d = dcp_dir(tmp_path / "ck", world=3, extra={"metadata.json": b"{}"})
    ck = CheckpointView(open_location(str(d)), "", None)
    names = lambda pats: [e.name for e in ck.matching(pats)]  # noqa: E731
    assert names(("*.distcp",)) == ["__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]
    assert names(("metadata.json", ".metadata", "absent")) == [".metadata", "metadata.json"]
    assert names((".metadata", "__1_*")) == [".metadata", "__1_0.distcp"]
    ck.matching(("*.distcp",)).clear()  # a caller's list is its own
    assert len(ck.matching(("*.distcp",))) == 3
    (d / "__3_0.distcp").write_bytes(b"x")
    (d / ".metadata").unlink()
    assert len(ck.matching(("*.distcp",))) == 3 and ".metadata" in ck.files  # the same listing, the same answer
    ck.__dict__.pop("entries")
    assert names(("*.distcp",))[-1] == "__3_0.distcp" and names((".metadata",)) == []
    assert "__3_0.distcp" in ck.files and ".metadata" not in ck.files
