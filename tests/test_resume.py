"""Resume proofs: per-rank digests recorded at save time by a real 2-rank gloo FSDP2 job (AdamW,
LambdaLR, all RNG streams, DCP) and checked after a restore in new processes, in both
directions; an incomplete digest set is a verify finding; `digests diff` names items and ranks."""
import json
import os
from pathlib import Path

import pytest

from ckptdoctor import api
from conftest import _run_script
from helpers import assert_fires, assert_fires_json, cli

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _job(*args):
    _run_script("resume_job.py", *args, timeout=300)  # the session fixtures' runner: one line of failure output


def _results(out: Path) -> dict[int, str]:
    return {r: (out / f"rank{r}.txt").read_text() for r in range(2)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One healthy save and one whose rank 1 exp_avg changed between record() and dcp.save()."""
    base = tmp_path_factory.mktemp("resume")
    _job("save", base / "good", base / "good-save")
    _job("save", base / "bad", base / "bad-save", "--alter-rank", "1")
    return base


def test_check_in_the_saving_process_is_refused_as_proof(saved):
    assert _results(saved / "good-save") == {0: "refused", 1: "refused"}


def test_restore_in_new_processes_passes(saved, tmp_path):
    _job("load", saved / "good", tmp_path / "out")
    assert _results(tmp_path / "out") == {0: "ok", 1: "ok"}
    rep = api.verify(str(saved / "good"))  # the digests directory is part of a healthy checkpoint
    assert not rep.findings, [(f.rule, f.message) for f in rep.findings]


def test_altered_exp_avg_is_named_on_its_rank_only(saved, tmp_path):
    _job("load", saved / "bad", tmp_path / "out")
    res = _results(tmp_path / "out")
    assert res[0] == "ok"
    got = json.loads(res[1])
    assert got == {"differing": ["state/optim/state/0.weight/exp_avg"], "missing": [], "unexpected": []}


def test_incomplete_digest_set_is_a_verify_finding(saved, tmp_path):
    import shutil
    ck = tmp_path / "ck"
    shutil.copytree(saved / "good", ck)
    os.remove(ck / "ckptdoctor.digests" / "rank_00001.json")
    hit = assert_fires(api.verify(str(ck)), "CKD501", path_contains="ckptdoctor.digests")[0]
    assert hit.details["missing"] == ["rank_00001.json"] and hit.details["world_size"] == 2
    (ck / "ckptdoctor.digests" / "rank_00001.json").write_text("{not json")
    hit = assert_fires(api.verify(str(ck)), "CKD501", path_contains="rank_00001.json")[0]
    assert "not JSON" in hit.message


def test_mismatch_lists_differing_missing_and_unexpected(tmp_path, monkeypatch):
    from ckptdoctor import resume
    state = {"w": torch.arange(6.0).reshape(2, 3), "opt": {"lr": 0.1, "betas": (0.9, 0.99)}, "step": 5,
             "gone": torch.zeros(2)}
    resume.record(state, str(tmp_path), rank=0, rng=False)
    resume.record({"t": torch.zeros(3), "z": -0.0}, str(tmp_path / "b"), rank=0, rng=False)
    monkeypatch.setattr(resume, "process_identity", lambda: {"host": "elsewhere", "pid": 1, "boot_id": "b",
                                                             "start_time": "1"})  # stands for a new process
    now = {"w": torch.arange(6.0).reshape(2, 3), "opt": {"lr": 0.1, "betas": (0.9, 0.999)}, "step": 5.0,
           "new": 1}
    with pytest.raises(resume.ResumeMismatch) as ei:
        resume.check(now, str(tmp_path), rank=0, rng=False)
    e = ei.value
    assert e.differing == ["state/opt/betas/1", "state/step"]
    assert e.missing == ["state/gone"] and e.unexpected == ["state/new"]
    assert "state/opt/betas/1" in str(e) and "rank 0" in str(e)
    # dtype and shape changes are named as such, -0.0 is not 0.0
    with pytest.raises(resume.ResumeMismatch) as ei:
        resume.check({"t": torch.zeros(3, dtype=torch.float64), "z": 0.0}, str(tmp_path / "b"), rank=0, rng=False)
    assert ei.value.detail["state/t"].startswith("dtype torch.float64 now") and "state/z" in ei.value.differing


def test_objects_without_a_state_are_refused_by_name(tmp_path):
    from ckptdoctor import resume
    with pytest.raises(TypeError, match="state/cb: cannot digest a builtins.function"):
        resume.record({"cb": lambda: 1}, str(tmp_path), rank=0, rng=False)


def test_digests_diff_names_ranks_and_items(tmp_path):
    from ckptdoctor import resume
    for name, scale in (("a", 1.0), ("b", 2.0)):
        for r in range(2):
            resume.record({"w": torch.ones(3) * (scale if r == 1 else 1.0), "step": 3}, str(tmp_path / name),
                          rank=r, world_size=2, rng=False)
    rc, out, err = cli("digests", "diff", str(tmp_path / "a"), str(tmp_path / "b"), "-f", "json")
    assert rc == 1, err
    doc = json.loads(out)
    (f,) = assert_fires_json(doc, "CKD502")
    assert f["rule"] == "CKD502" and f["details"]["rank"] == 1 and f["details"]["differing"] == ["state/w"]
    assert doc["facts"]["ranks"] == {"compared": 2, "only_in_one": 0, "differing": 1}
    rc, out, err = cli("digests", "diff", str(tmp_path / "a"), str(tmp_path / "a"))
    assert rc == 0, out + err
    rc, out, err = cli("digests", "diff", str(tmp_path / "a"), str(tmp_path / "nothing"))
    assert rc == 2 and "nothing" in err and "Traceback" not in err
