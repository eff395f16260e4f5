"""Repairs and gates a job script can trust (issue 37): --fix acts only on a broken resume target and
decides under the lock it writes under; selection never changes the verdict; the gate is strict;
trackers are read as the framework reads them; prune and quarantine touch only real checkpoint
directories.  Races are forced with real processes: the test holds the run root's lock, waits until
the other process is waiting for it (the `lock-wait` fault point), changes the run root, then lets go."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptdoctor.publishing.dest import LocalDest
from helpers import assert_fires_json, cli

HERE = Path(__file__).parent
MEGATRON = HERE / "fixtures" / "real" / "megatron-core" / "torch_dist"   # written by megatron-core 0.16.1
TRACKER = "latest_checkpointed_iteration.txt"
sys.path.insert(0, str(HERE / "conformance"))
import damage  # noqa: E402


@pytest.fixture
def run(tmp_path):
    """A real Megatron torch_dist run root: iter_0000001 and iter_0000002 complete, tracker at 2."""
    root = tmp_path / "run"
    shutil.copytree(MEGATRON, root)
    return root


def tracker(root) -> str:
    return (root / TRACKER).read_text()


def gate(root, *args, cwd=None):
    rc, out, err = cli("verify", "--target", "resume", "-f", "json", str(root), *args, cwd=cwd)
    assert "Traceback" not in err, err
    return rc, json.loads(out), err


# ---- fix only what is broken ---------------------------------------------------------------------
def test_fix_leaves_a_deliberate_rollback_alone(run):
    (run / TRACKER).write_text("1")   # rolled back after a loss spike; iteration 2 is complete too
    rc, out, err = cli("verify", "--fix", "--target", "resume", "-f", "json", str(run))
    assert rc == 0 and tracker(run) == "1", err
    assert "nothing to do" in err and "rollback" in err
    assert json.loads(out)["facts"]["fixed"]["applied"] is False


def test_fix_repairs_a_broken_target_and_dry_run_writes_nothing(run):
    damage.apply(str(run), [["truncate", "iter_0000002/__0_0.distcp"]])
    before = sorted(os.listdir(run))
    rc, out, err = cli("verify", "--fix", "--dry-run", "-f", "json", str(run))
    assert rc == 1 and tracker(run) == "2" and sorted(os.listdir(run)) == before, err
    assert "would repoint" in err
    rc, out, err = cli("verify", "--fix", "-f", "json", str(run))
    doc = json.loads(out)
    assert rc == 0 and tracker(run) == "1", err   # repaired: the relaunch will load a complete checkpoint
    assert doc["facts"]["fixed"]["applied"] is True and doc["facts"]["gate"]["passed"] is True
    # the broken checkpoint is still reported (as info: the framework no longer loads it)
    assert any(f["rule"] == "CKD104" and "iter_0000002" in f["path"] for f in doc["findings"])


def test_nothing_complete_still_gives_a_full_report(run):
    for it in ("iter_0000001", "iter_0000002"):
        damage.apply(str(run), [["truncate", f"{it}/__0_0.distcp"]])
    rc, out, err = cli("verify", "--fix", "-f", "json", str(run))
    doc = json.loads(out)
    assert rc == 1 and tracker(run) == "2" and "no complete checkpoint" in err
    assert {f["rule"] for f in doc["findings"]} >= {"CKD104", "CKD113"}


def test_unverifiable_is_not_incomplete(run):
    """No manifest on the tracker's iteration: --checksums fails (CKD150) but the checkpoint is not
    incomplete, so --fix does not roll the tracker back (the iteration loads fine)."""
    rc, _, err = cli("manifest", str(run / "iter_0000001"))
    assert rc == 0, err
    rc, out, err = cli("verify", "--checksums", "-f", "json", str(run))
    doc = json.loads(out)
    assert rc == 1 and assert_fires_json(doc, "CKD150", path_contains="iter_0000002")
    row = {r["name"]: r for r in doc["facts"]["checkpoints"]}["iter_0000002"]
    assert row["complete"] is True and row["unverified"] == ["CKD150 manifest-missing"]
    rc, out, err = cli("verify", "--fix", "--checksums", str(run))
    assert tracker(run) == "2" and "nothing to do" in err, err


# ---- selection filters reporting, never judgement ------------------------------------------------
@pytest.mark.parametrize("how", [["--select", "CKD113"], ["--ignore", "CKD104,CKD107,CKD113"],
                                 ["--severity", "CKD1=info"], "config-upward"])
def test_selection_never_changes_the_gate(run, tmp_path, how):
    damage.apply(str(run), [["truncate", "iter_0000002/__0_0.distcp"]])
    cwd = None
    if how == "config-upward":   # a ckptdoctor.toml found upward from where the job script runs
        cwd = tmp_path / "jobs" / "deep"
        cwd.mkdir(parents=True)
        (tmp_path / "jobs" / "ckptdoctor.toml").write_text('ignore = ["CKD104", "CKD107", "CKD113"]\n')
        how = []
    rc, doc, err = gate(run, *how, cwd=cwd)
    assert rc == 1, (how, doc["findings"])
    assert doc["facts"]["gate"]["passed"] is False and "iter_0000002 is incomplete" in doc["facts"]["gate"]["why"]
    row = {r["name"]: r for r in doc["facts"]["checkpoints"]}["iter_0000002"]
    assert row["complete"] is False
    if "--severity" not in how:
        assert doc["facts"]["hidden"], "the report must say what selection hid"


# ---- the gate is strict --------------------------------------------------------------------------
def test_gate_fails_on_a_directory_that_is_no_checkpoint(tmp_path):
    d = tmp_path / "notes"
    d.mkdir()
    (d / "README.txt").write_text("hello")
    (d / "weights.pt").write_bytes(__import__("ckptdoctor.layouts.dcp_writer", fromlist=["x"])
                                   .object_archive(b"\x80\x02}q\x00."))
    rc, doc, err = gate(d)
    assert rc == 1 and doc["facts"]["gate"]["passed"] is False and "CKD155" in doc["facts"]["gate"]["why"]


def test_empty_run_root_fails_the_gate_unless_allow_fresh(tmp_path):
    root = tmp_path / "new-run"
    root.mkdir()
    rc, doc, err = gate(root)
    assert rc == 1 and doc["facts"]["gate"]["passed"] is False
    rc, doc, err = gate(root, "--allow-fresh")
    assert rc == 0 and doc["facts"]["gate"]["passed"] is True
    assert [f["severity"] for f in doc["findings"] if f["rule"] == "CKD902"] == ["info"]


def test_gate_checks_the_run_contract(run, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("lr: 0.001\n")
    rc, _, err = cli("contract", "init", str(run), "--recipe", str(recipe), "--total-steps", "10")
    assert rc == 0, err
    assert gate(run)[0] == 0
    recipe.write_text("lr: 0.002\n")
    rc, doc, err = gate(run)
    assert rc == 1 and "CKD513" in {f["rule"] for f in doc["findings"] if f["severity"] == "error"}


# ---- trackers read exactly as the framework reads them -------------------------------------------
@pytest.mark.parametrize("text", ["+2", "0_2", "\u0662", " 2\n"])
def test_megatron_tracker_read_as_int_strip(run, text):
    """Megatron-LM reads int(text.strip()): each of these is iteration 2, so it is the resume target
    and prune never removes it."""
    (run / TRACKER).write_text(text)
    rc, doc, err = gate(run)
    assert rc == 0 and doc["facts"]["resume_from"] == "iter_0000002", doc["findings"]
    rc, out, err = cli("prune", "--keep-last", "1", "--keep-every", "1000", str(run))
    assert rc == 0 and (run / "iter_0000002").is_dir(), err


def test_a_huge_tracker_is_a_finding_not_a_crash(run):
    """5,000 digits: Megatron's int() raises on it too; here it is CKD112 (never exit 3), and --fix
    repairs it like any tracker the framework cannot read."""
    (run / TRACKER).write_text("9" * 5000)
    for args in (["verify", "-f", "json", str(run)], ["prune", "--dry-run", "--keep-last", "1", "-f", "json", str(run)]):
        rc, out, err = cli(*args)
        assert rc in (0, 1) and "Traceback" not in err, (args, rc, err)
        hit = [f for f in json.loads(out)["findings"] if f["rule"] == "CKD112"]
        assert hit and hit[0]["severity"] == "error", args
    rc, out, err = cli("verify", "--fix", "-f", "json", str(run))
    assert rc == 0 and tracker(run) == "2", err


# ---- prune: only real checkpoint directories, its own exit status --------------------------------
def test_prune_leaves_symlinks_files_and_fifos_alone_and_exits_by_its_own_outcome(run, tmp_path):
    outside = tmp_path / "elsewhere"
    shutil.copytree(run / "iter_0000001", outside)
    (run / "iter_0000000").symlink_to(outside)
    os.mkfifo(run / "iter_0000003")
    (run / "iter_0000004").write_text("not a checkpoint")
    damage.apply(str(run), [["truncate", "iter_0000001/__0_0.distcp"]])  # a finding in a kept checkpoint
    rc, out, err = cli("prune", "--keep-last", "1", "--keep-every", "1", "-f", "json", str(run), timeout=60)
    doc = json.loads(out)
    kept = doc["facts"]["pruned"]["kept"]
    assert rc == 0, err   # the policy was applied; findings elsewhere do not fail a nightly cron
    for odd in ("iter_0000000", "iter_0000003", "iter_0000004"):
        assert "left alone" in kept[odd] and os.path.lexists(run / odd)
    assert outside.is_dir() and len(os.listdir(outside)) > 3
    rc, out, err = cli("prune", "--keep-last", "1", "--keep-every", "1", "--fail-on", "error", str(run))
    assert rc == 1


# ---- every read-decide-write under one lock (real processes, forced order) -----------------------
def _wait_for(log: Path, phase: str, proc, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and any(line.split()[0] == phase for line in log.read_text().splitlines()):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError(f"{phase} never reached")


def _spawn(args, log):
    env = dict(os.environ, CKPTDOCTOR_TEST_PHASE_LOG=str(log))
    env.pop("CKPTDOCTOR_CONFIG", None)
    return subprocess.Popen([sys.executable, "-m", "ckptdoctor", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("as_url", [False, True], ids=["path", "file-url"])
def test_fix_decides_under_the_lock_and_never_undoes_a_publish(run, tmp_path, as_url):
    """iter_0000002 broken, tracker at 2: --fix wants 2 -> 1.  While it waits for the lock, a publish
    lands a complete iter_0000003 and moves the tracker to 3.  Judged under the lock, --fix sees a
    complete target and leaves it; a fix planned before the lock would write 3 -> 1.  The same lock
    whether the run root is given as a path or as a file:// URL."""
    shutil.copytree(run / "iter_0000002", tmp_path / "good3")
    damage.apply(str(run), [["truncate", "iter_0000002/__0_0.distcp"]])
    log = tmp_path / "phases"
    with LocalDest(str(run)).lock():
        proc = _spawn(["verify", "--fix", f"file://{run}" if as_url else str(run)], log)
        _wait_for(log, "lock-wait", proc)
        shutil.copytree(tmp_path / "good3", run / "iter_0000003")   # the publish, under the lock
        (run / TRACKER).write_text("3")
    out, err = proc.communicate(timeout=120)
    assert tracker(run) == "3", err
    assert proc.returncode == 0, err


def test_prune_decides_under_the_lock_and_protects_a_new_tracker_target(run, tmp_path):
    """prune --keep-last 1 would remove iter_0000001.  While it waits for the lock, `verify --fix-to 1`
    moves the tracker to 1: judged under the lock, prune protects iter_0000001."""
    log = tmp_path / "phases"
    with LocalDest(str(run)).lock():
        proc = _spawn(["prune", "--keep-last", "1", str(run)], log)
        _wait_for(log, "lock-wait", proc)
        (run / TRACKER).write_text("1")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert (run / "iter_0000001").is_dir() and (run / "iter_0000002").is_dir()


# ---- quarantine ----------------------------------------------------------------------------------
def test_quarantine_on_a_tracker_family_is_a_usage_error(run):
    damage.apply(str(run), [["truncate", "iter_0000002/__0_0.distcp"]])
    rc, out, err = cli("verify", "--fix", "--quarantine", str(run))
    assert rc == 2 and "tracker" in err and tracker(run) == "2"


def test_sigterm_after_the_tracker_moved_does_not_say_it_is_untouched(run, tmp_path):
    """publish terminated while it waits right after moving the tracker (forced with the pause
    hook, not timed): the message says the tracker moved, never 'tracker untouched'."""
    import signal
    dest = tmp_path / "dest"
    shutil.copytree(run, dest)
    src = tmp_path / "src" / "iter_0000003"
    shutil.copytree(run / "iter_0000002", src)
    log = tmp_path / "phases"
    env = dict(os.environ, CKPTDOCTOR_TEST_PHASE_LOG=str(log), CKPTDOCTOR_TEST_PAUSE_AT="tracker:30")
    env.pop("CKPTDOCTOR_CONFIG", None)
    p = subprocess.Popen([sys.executable, "-m", "ckptdoctor", "publish", str(src), str(dest)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(log, "tracker", p)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 143 and tracker(dest) == "3", err
    assert "tracker untouched" not in err and "tracker moved" in err, err


def test_fix_in_a_loop_over_the_demo_run_roots_never_moves_a_tracker_on_a_complete_checkpoint(tmp_path):
    from ckptdoctor import demo as D
    root = tmp_path / "demo"
    D.build_run(str(root))
    for _ in range(3):
        rc, out, err = cli("verify", "--fix", "--target", "resume", str(root))
        assert rc == 0, err
    assert tracker(root) == "100"   # 300 truncated, 200 interrupted: repointed once, then left alone
    (root / TRACKER).write_text("100")
    rc, out, err = cli("verify", "--fix", "--target", "resume", str(root))
    assert "nothing to do" in err and tracker(root) == "100"


def test_prune_never_removes_what_a_newest_directory_family_resumes_from(tmp_path):
    """Trainer resumes from the highest checkpoint-N even when it is partial: `prune --keep-every`
    keeps it (and the newest complete one), removes only what no rule protects."""
    root = tmp_path / "out"
    for s in (500, 1000, 1500):
        d = root / f"checkpoint-{s}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text(json.dumps({"global_step": s}))
    (root / "checkpoint-2500").mkdir()
    (root / "checkpoint-2500" / "model.safetensors").write_bytes(b"")   # died before trainer_state.json
    rc, out, err = cli("prune", "--keep-every", "1000", "-f", "json", str(root))
    pr = json.loads(out)["facts"]["pruned"]
    assert rc == 0 and pr["removed"] == ["checkpoint-500"], err
    assert "resumes from it" in pr["kept"]["checkpoint-2500"] and (root / "checkpoint-2500").is_dir()
    assert "newest complete" in pr["kept"]["checkpoint-1500"]


def test_publish_retention_leaves_a_fifo_with_a_step_name_alone(run, tmp_path):
    """publish --keep-last after its commit: a FIFO named like an old iteration is neither opened
    (that would hang while holding the lock) nor renamed; it is reported as left alone."""
    dest = tmp_path / "dest"
    shutil.copytree(run, dest)
    os.mkfifo(dest / "iter_0000000")
    src = tmp_path / "src" / "iter_0000003"
    shutil.copytree(run / "iter_0000002", src)
    rc, out, err = cli("publish", "--keep-last", "1", "-f", "json", str(src), str(dest), timeout=120)
    assert rc == 0, err
    assert os.path.exists(dest / "iter_0000000") and tracker(dest) == "3"
    assert not (dest / "iter_0000001").exists()
