"""Megatron and torchtitan run roots: trackers, markers, legacy rank grids, resume report."""
import json
import os
import shutil

import pytest

from ckptdoctor import api
from conftest import needs_torch
from helpers import as_unprivileged, assert_fires, assert_fires_json

pytestmark = needs_torch


def test_healthy_run_reports_resume_target(fixture_root):
    rep = api.verify(str(fixture_root / "megatron_run"))
    assert rep.facts["layout"] == "megatron"
    assert rep.facts["resume_from"] == "iter_0000200"
    assert rep.facts["newest_complete"] == "iter_0000200"
    assert [r["name"] for r in rep.facts["checkpoints"]] == ["iter_0000100", "iter_0000200"]


def test_dcp_without_metadata_json_is_not_committed(real):
    d = real("megatron_run")
    (d / "iter_0000200" / "metadata.json").unlink()
    rep = api.verify(str(d))
    assert_fires(rep, "CKD101", path_contains="iter_0000200")
    assert_fires(rep, "CKD113")  # tracker names it
    assert rep.facts["newest_complete"] == "iter_0000100"


def test_single_iter_dir_requires_metadata_json(real):
    d = real("megatron_run")
    (d / "iter_0000200" / "metadata.json").unlink()
    rep = api.verify(str(d / "iter_0000200"))
    assert_fires(rep, "CKD101")


def test_tracker_missing_while_complete_checkpoints_exist(real):
    d = real("megatron_run")
    (d / "latest_checkpointed_iteration.txt").unlink()
    rep = api.verify(str(d))
    hit = assert_fires(rep, "CKD111", severity="error")[0]
    assert hit.details["newest_complete"] == "iter_0000200"
    assert hit.hint.startswith("write the tracker atomically"), hit.hint   # a text tracker: no `ln -s` advice
    assert "write '200' into latest_checkpointed_iteration.txt" in hit.hint, hit.hint   # what Megatron writes
    assert rep.facts["resume_from"] is None


def test_tracker_empty_or_garbage(real):
    d = real("megatron_run")
    for content in ("", "abc", "\n"):
        (d / "latest_checkpointed_iteration.txt").write_text(content)
        rep = api.verify(str(d))
        (hit,) = assert_fires(rep, "CKD112", severity="error")
        assert hit.hint.startswith("the framework cannot read it (Megatron even exits 0); rewrite it to name a "
                                   "complete checkpoint"), hit.hint   # a text tracker: not the symlink tracker's advice


def test_tracker_release_is_understood(real):
    d = real("megatron_run")
    (d / "latest_checkpointed_iteration.txt").write_text("release")
    rep = api.verify(str(d))
    hit = assert_fires(rep, "CKD113")[0]
    assert hit.details["target"] == "release"


def test_tracker_points_at_missing_and_incomplete(real):
    d = real("megatron_run")
    (d / "latest_checkpointed_iteration.txt").write_text("300")
    rep = api.verify(str(d))
    assert "does not exist" in assert_fires(rep, "CKD113")[0].message
    (d / "latest_checkpointed_iteration.txt").write_text("200")
    os.truncate(next((d / "iter_0000200").glob("__0_*.distcp")), 5)
    rep = api.verify(str(d))
    hit = assert_fires(rep, "CKD113")[0]
    assert "incomplete" in hit.message and hit.details["newest_complete"] == "iter_0000100"


def test_tracker_behind_newest_complete(real):
    d = real("megatron_run")
    (d / "latest_checkpointed_iteration.txt").write_text("100")
    rep = api.verify(str(d))
    (hit,) = assert_fires(rep, "CKD114", severity="warning")
    assert not rep.failed()
    assert hit.message == "tracker names iter_0000100 but iter_0000200 is newer and complete", hit.message
    assert hit.hint.startswith("the run will redo 100 steps; repoint the tracker if iter_0000200 is the one"), hit.hint


def test_common_pt_truncated(real):
    d = real("megatron_run")
    f = d / "iter_0000200" / "common.pt"
    os.truncate(f, f.stat().st_size // 2)
    rep = api.verify(str(d))
    assert_fires(rep, "CKD117", path_contains="common.pt")


def test_a_missing_legacy_rank_directory_is_named_by_its_own_tp_and_pp(real):
    d = real("megatron_legacy")
    shutil.rmtree(d / "iter_0000020" / "mp_rank_00_001")   # tp 0, pp 1
    (hit,) = assert_fires(api.verify(str(d)), "CKD116", path_contains="iter_0000020/mp_rank_00_001", severity="error")
    assert hit.details["missing"] == "mp_rank_00_001" and hit.details["tp_pp_ep"] == [0, 1, None], hit.details


def test_legacy_rank_grid(real):
    d = real("megatron_legacy")
    shutil.rmtree(d / "iter_0000020" / "mp_rank_01_001")
    rep = api.verify(str(d))
    assert_fires(rep, "CKD116", path_contains="mp_rank_01_001")
    (d / "iter_0000010" / "mp_rank_00_001" / "model_optim_rng.pt").write_bytes(b"")
    rep = api.verify(str(d))
    assert any("empty" in f.message for f in assert_fires(rep, "CKD116"))


def test_a_legacy_pp_grid_with_a_stray_directory_without_pp_still_names_the_missing_rank(real):
    """A stray mp_rank_01/ (a save without pipeline parallelism) among mp_rank_XX_YYY directories
    does not turn the grid into one without pipeline stages: mp_rank_01_001 is still named."""
    d = real("megatron_legacy")
    shutil.move(str(d / "iter_0000020" / "mp_rank_01_001"), str(d / "iter_0000020" / "mp_rank_01"))
    rep = api.verify(str(d))
    assert_fires(rep, "CKD116", path_contains="iter_0000020/mp_rank_01_001", severity="error")


def test_tracker_names_an_incomplete_newest_checkpoint_is_not_called_behind(real):
    """The tracker on a broken newest checkpoint with an older complete one: CKD113 (incomplete,
    the fallback named), not CKD114 -- the tracker is not behind anything."""
    d = real("megatron_run")
    os.truncate(next((d / "iter_0000200").glob("__0_*.distcp")), 5)
    rep = api.verify(str(d))
    assert_fires(rep, "CKD113", severity="error")
    assert "CKD114" not in rep.rules()


def test_legacy_rank_file_truncated(real):
    d = real("megatron_legacy")
    f = d / "iter_0000020" / "mp_rank_00_000" / "model_optim_rng.pt"
    os.truncate(f, 100)
    rep = api.verify(str(d))
    assert_fires(rep, "CKD117", path_contains="mp_rank_00_000")


def test_torchtitan_resumes_from_highest_step_with_marker_even_if_broken(real):
    d = real("titan_run")
    os.truncate(next((d / "step-30").glob("__0_*.distcp")), 7)
    rep = api.verify(str(d))
    assert_fires(rep, "CKD104", path_contains="step-30")
    assert rep.facts["resume_from"] == "step-30"       # torchtitan's own rule
    assert rep.facts["newest_complete"] == "step-20"   # ckptdoctor's verdict


def test_unreadable_checkpoint_dir(real):
    import json
    import subprocess
    import sys
    d = real("megatron_run")
    os.chmod(d / "iter_0000100", 0)
    try:
        p = subprocess.run(as_unprivileged() + [sys.executable, "-m", "ckptdoctor", "verify",
                                                 "--format", "json", str(d)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 1, p.stderr
        assert "Traceback" not in p.stderr
        hits = assert_fires_json(json.loads(p.stdout), "CKD901", path_contains="iter_0000100")
        assert "ermission" in hits[0]["message"]
    finally:
        os.chmod(d / "iter_0000100", 0o755)


def test_a_metadata_json_nested_too_deep_to_parse_is_an_unreadable_marker_not_a_crash(real):
    """metadata.json is read to learn whether common.pt is required; JSON nested a hundred thousand
    levels deep (deeper than Python's parser recurses) is named as an unreadable marker, the other
    checks still run, and the checkpoint is not complete."""
    d = real("megatron_run")
    (d / "iter_0000200" / "metadata.json").write_text("[" * 100_000 + "]" * 100_000)
    (d / "iter_0000200" / "common.pt").unlink()
    rep = api.verify(str(d))
    assert rep.facts["newest_complete"] == "iter_0000100"
    assert not any(f.rule == "CKD900" for f in rep.findings), [(f.rule, f.message) for f in rep.findings]
    assert any("metadata.json" in f.path and f.severity == "error" for f in rep.findings), \
        [(f.rule, f.path, f.severity) for f in rep.findings]
    try:
        json.loads("[" * 100_000 + "]" * 100_000)
    except RecursionError as exc:
        said = str(exc)
    [hit] = assert_fires(rep, "CKD136", path_contains="iter_0000200/metadata.json", severity="error")
    assert f"is not valid JSON ({said[:80]})" in hit.message, hit.message   # the parser quoted to 80 characters


@pytest.mark.parametrize("content,says", [
    ('{"sharded_backend": "torch_dist", "sharded_backend_version": 1, "comm', "is not valid JSON"),
    ("[]", "holds a JSON list, not an object"),
    ('{"sharded_backend": "torch_dist", "format": 2}', "has a field Megatron-Core's dist_checkpointing.load does not know ('format')"),
    ('{"common_backend": "torch"}', "lacks sharded_backend"),
    (" " * ((1 << 20) + 1), "is larger than 1 MiB (not read)"),
    (" " * (2 << 20), "is larger than 1 MiB (not read)"),   # was CKD900: the read itself refused it
])
def test_a_metadata_json_megatron_cannot_parse_makes_the_checkpoint_incomplete(real, content, says):
    """Every rank's load parses metadata.json as CheckpointingConfig(**doc): what it raises on is an
    error naming the file, and the gate falls back to the older checkpoint."""
    d = real("megatron_run")
    (d / "iter_0000200" / "metadata.json").write_text(content)
    rep = api.verify(str(d), target="resume")
    [hit] = assert_fires(rep, "CKD136", path_contains="iter_0000200/metadata.json", severity="error")
    assert says in hit.message and hit.message.endswith("raises on every rank"), hit.message
    assert rep.facts["newest_complete"] == "iter_0000100" and rep.failed()


def test_a_metadata_json_without_the_fields_megatron_defaults_is_no_finding(real):
    """CheckpointingConfig defaults every field but sharded_backend (measured: the real load of
    {"sharded_backend": "torch_dist"} beside common.pt succeeds)."""
    d = real("megatron_run")
    (d / "iter_0000200" / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    rep = api.verify(str(d), target="resume")
    assert "CKD136" not in rep.rules() and rep.facts["newest_complete"] == "iter_0000200"


def test_a_legacy_checkpoint_without_any_rank_directory_says_what_it_should_hold(real):
    """A Megatron legacy iteration directory whose rank directories were all renamed (here to
    mp_rank_old, which no rank loads): CKD116 says there is nothing to load and what the layout
    expects."""
    d = real("megatron_legacy")
    for sub in (d / "iter_0000020").iterdir():
        if sub.name.startswith("mp_rank_"):
            shutil.rmtree(sub)
    (d / "iter_0000020" / "mp_rank_old").mkdir()
    rep = api.verify(str(d))
    (hit,) = assert_fires(rep, "CKD116", path_contains="iter_0000020", severity="error")
    assert hit.message == "no mp_rank_* directories: nothing to load", hit.message
    assert hit.details == {"expected": "mp_rank_XX[_YYY][_ZZZ]/model_optim_rng.pt"}, hit.details


def test_a_missing_legacy_rank_directory_is_named_by_its_tensor_and_pipeline_ranks(real):
    """mp_rank_TT_PPP: the missing directory of tensor rank 1, pipeline rank 0 is named exactly."""
    d = real("megatron_legacy")
    shutil.rmtree(d / "iter_0000020" / "mp_rank_01_000")
    (hit,) = assert_fires(api.verify(str(d)), "CKD116", path_contains="iter_0000020", severity="error")
    assert "mp_rank_01_000" in hit.path and "mp_rank_01_000" in hit.message, (hit.path, hit.message)
