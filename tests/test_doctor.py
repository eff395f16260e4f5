"""Doctor actions (issue 19): `verify --fix` repoints a tracker that names a broken checkpoint (or
quarantines a broken newest directory), `prune` applies retention on its own.  Nothing is ever
deleted by --fix; prune never removes the tracker's target, the resume target, the newest complete
checkpoint, or one being written."""
import json
import os
import shutil
import time
import subprocess
import sys

import pytest

from ckptdoctor import api
from ckptdoctor.layouts import dcp_writer as W
from helpers import as_unprivileged, cli

TRACKER = "latest_checkpointed_iteration.txt"


def iter_dir(d, step):
    W.write(str(d), [W.Item("w", (4, 4), (2 * r, 0), (2, 4), [float(step + r)] * 8, rank=r) for r in range(2)])
    (d / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    return d


def snapshot(root):
    out = {}
    for dp, dn, fn in os.walk(root):
        for n in fn:
            p = os.path.join(dp, n)
            out[os.path.relpath(p, root)] = open(p, "rb").read()
    return out


@pytest.fixture
def megatron_run(tmp_path):
    root = tmp_path / "run"
    for s in (100, 200, 300):
        iter_dir(root / f"iter_{s:07d}", s)
    os.truncate(root / "iter_0000300" / "__1_0.distcp", 50)  # the newest is broken ...
    (root / TRACKER).write_text("300")                      # ... and the tracker names it
    return root


def test_fix_repoints_the_megatron_tracker_with_a_backup(megatron_run):
    before = {k: v for k, v in snapshot(megatron_run).items() if k != TRACKER}
    rc, out, err = cli("verify", "--fix", "--target", "resume", "-f", "json", str(megatron_run))
    doc = json.loads(out)
    assert rc == 0 and doc["facts"]["resume_from"] == "iter_0000200", (err, doc["findings"])
    assert (megatron_run / TRACKER).read_text() == "200"  # what Megatron's own writer puts there
    backups = [e for e in os.listdir(megatron_run) if e.startswith(TRACKER + ".ckptdoctor-bak-")]
    assert len(backups) == 1 and (megatron_run / backups[0]).read_text() == "300"
    after = snapshot(megatron_run)
    assert all(after[k] == v for k, v in before.items())  # no checkpoint byte changed, nothing deleted
    assert doc["facts"]["fixed"]["tracker"]["new"] == "200" and "repoint" in err


def test_fix_to_a_chosen_complete_step_and_refusals(megatron_run):
    rc, out, err = cli("verify", "--fix", "--fix-to", "100", str(megatron_run))
    assert (megatron_run / TRACKER).read_text() == "100", err
    rc, out, err = cli("verify", "--fix", "--fix-to", "300", str(megatron_run))
    assert rc == 2 and "no complete checkpoint at step 300" in err
    assert (megatron_run / TRACKER).read_text() == "100"


def test_fix_refused_on_a_read_only_run_root(megatron_run, tmp_path):
    os.chmod(tmp_path, 0o755)
    os.chmod(megatron_run, 0o555)
    try:
        p = subprocess.run(as_unprivileged() + [sys.executable, "-m", "ckptdoctor", "verify", "--fix", str(megatron_run)],
                           capture_output=True, text=True, timeout=60)
    finally:
        os.chmod(megatron_run, 0o755)
    assert p.returncode == 2 and "not writable" in p.stderr and (megatron_run / TRACKER).read_text() == "300"


def test_fix_refused_on_an_object_store(megatron_run):
    import fsspec
    fs = fsspec.filesystem("memory")
    fs.put(str(megatron_run), "/fixrun", recursive=True)
    rc, out, err = cli("verify", "--fix", "memory://fixrun")
    # a separate process has its own memory filesystem: use the API in this one
    from ckptdoctor.commands import fix, verify as vflow
    eng = api.make_engine("verify", "memory://fixrun")
    rep, runv = vflow.judge("memory://fixrun", eng)
    p = fix.plan(runv, None, False)
    from ckptdoctor.engine.errors import UsageError
    with pytest.raises(UsageError, match="not a local directory"):
        fix.apply(runv, p)
    assert fs.cat_file("/fixrun/" + TRACKER) == b"300"


_PT = __import__("ckptdoctor.layouts.dcp_writer", fromlist=["x"]).object_archive(b"\x80\x02}q\x00.")


def _trainer_run(root, age=3600):
    """HF Trainer: checkpoint-500 and -1000 complete, checkpoint-1500 died before trainer_state.json,
    its files written `age` seconds ago (0: just now, like a save in progress)."""
    for s in (500, 1000):
        d = root / f"checkpoint-{s}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text(json.dumps({"global_step": s}))
    broken = root / "checkpoint-1500"
    broken.mkdir()
    (broken / "optimizer.pt").write_bytes(b"x")
    if age:
        old = time.time() - age
        for p in (broken / "optimizer.pt", broken):
            os.utime(p, (old, old))
    return root


def _deepspeed_run(root, steps):
    for s in steps:
        d = root / f"global_step{s}"
        d.mkdir(parents=True)
        (d / "mp_rank_00_model_states.pt").write_bytes(_PT)   # whole torch.save zips (CKD117)
        for r in range(2):
            (d / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt").write_bytes(_PT)
    return root


def test_fix_deepspeed_latest(tmp_path):
    root = _deepspeed_run(tmp_path / "ds", (3, 6))
    os.remove(root / "global_step6" / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (root / "latest").write_text("global_step6")
    rc, out, err = cli("verify", "--fix", "--target", "resume", str(root))
    assert rc == 0 and (root / "latest").read_text() == "global_step3", err


def test_quarantine_for_a_newest_directory_family(tmp_path):
    root = _trainer_run(tmp_path / "out", age=0)
    broken = root / "checkpoint-1500"
    assert api.verify(str(root)).facts["resume_from"] == "checkpoint-1500"
    rc, out, err = cli("verify", "--fix", str(root))
    assert rc == 2 and "--quarantine" in err and broken.exists()
    rc, out, err = cli("verify", "--fix", "--quarantine", str(root))   # written just now: a save in progress?
    assert rc == 2 and "save in progress" in err and broken.exists()
    old = time.time() - 3600   # the save died an hour ago
    for p in (broken / "optimizer.pt", broken):
        os.utime(p, (old, old))
    rc, out, err = cli("verify", "--fix", "--quarantine", "-f", "json", str(root))
    doc = json.loads(out)
    assert rc == 0 and doc["facts"]["resume_from"] == "checkpoint-1000", err
    assert ("the framework would resume from checkpoint-1500; quarantining 1 newer checkpoint(s) makes it "
            "resume from checkpoint-1000") in err
    moved = [e for e in os.listdir(root) if e.startswith("ckptdoctor-quarantined-1500-")]
    assert len(moved) == 1 and (root / moved[0] / "optimizer.pt").read_bytes() == b"x"  # moved, not deleted
    import re
    assert not re.match(r"^checkpoint-(\d+)$", moved[0])  # transformers' get_last_checkpoint pattern


def test_fix_with_nothing_to_do_changes_nothing(megatron_run):
    (megatron_run / TRACKER).write_text("200")
    before = snapshot(megatron_run)
    rc, out, err = cli("verify", "--fix", str(megatron_run))
    assert "nothing to do" in err and snapshot(megatron_run) == before
    # the tracker is on the newest complete checkpoint: no rollback is suggested
    assert "verify --fix: nothing to do: the framework already resumes from iter_0000200, which is complete\n" in err
    assert "rollback" not in err and "--fix-to" not in err, err


# ---- prune ----------------------------------------------------------------------------------------------
@pytest.fixture
def four(tmp_path):
    root = tmp_path / "run"
    for s in (100, 200, 300, 400):
        iter_dir(root / f"iter_{s:07d}", s)
    (root / TRACKER).write_text("200")
    return root


def test_prune_dry_run_removes_nothing(four):
    before = snapshot(four)
    rc, out, err = cli("prune", "--keep-last", "1", "--dry-run", "-f", "json", str(four))
    pr = json.loads(out)["facts"]["pruned"]
    assert rc == 0 and sorted(pr["removed"]) == ["iter_0000100", "iter_0000300"] and pr["dry_run"]
    assert pr["kept"]["iter_0000200"] == "the tracker names it" and snapshot(four) == before


def test_prune_protects_the_tracker_target_and_newest_complete(four):
    os.truncate(four / "iter_0000400" / "__0_0.distcp", 10)  # the newest is broken: 300 is newest complete
    rc, out, err = cli("prune", "--keep-last", "1", "-f", "json", str(four))
    pr = json.loads(out)["facts"]["pruned"]
    assert rc in (0, 1) and pr["removed"] == ["iter_0000100"], pr
    assert sorted(e for e in os.listdir(four) if e.startswith("iter_")) == ["iter_0000200", "iter_0000300",
                                                                             "iter_0000400"]
    assert pr["kept"]["iter_0000300"] == "the newest complete checkpoint"
    assert not [e for e in os.listdir(four) if "trash" in e]


def test_prune_keeps_one_being_written(four):
    (four / "iter_0000100.tmp").mkdir()  # a sibling that says iter_0000100 is still being written
    rc, out, err = cli("prune", "--keep-last", "1", "-f", "json", str(four))
    pr = json.loads(out)["facts"]["pruned"]
    assert "iter_0000100" not in pr["removed"] and "being written" in pr["kept"]["iter_0000100"]


def test_prune_on_a_single_checkpoint_is_refused_in_one_line(four):
    """Not even the lock file is written into it (refused before the lock is taken)."""
    before = snapshot(four)
    for dry in ([], ["--dry-run"]):
        rc, out, err = cli("prune", "--keep-last", "1", *dry, str(four / "iter_0000300"))
        assert rc == 2 and "prune works on a run root (a directory of checkpoints)" in err, (dry, err)
        assert "Traceback" not in err and snapshot(four) == before


def test_prune_on_a_directory_of_no_known_layout_is_refused_and_left_as_it_was(tmp_path):
    """An empty directory, or one of unrelated files, is no run root either: refused in one line
    before the lock, so not even `.ckptdoctor-lock` appears in it."""
    empty, other = tmp_path / "empty", tmp_path / "other"
    empty.mkdir()
    other.mkdir()
    (other / "notes.txt").write_text("not a checkpoint\n")
    for d in (empty, other):
        before = snapshot(d)
        rc, out, err = cli("prune", "--keep-last", "1", str(d))
        assert rc == 2 and "prune works on a run root (a directory of checkpoints)" in err, (d, err)
        assert "Traceback" not in err and snapshot(d) == before and not (d / ".ckptdoctor-lock").exists()


def test_prune_counts_an_empty_abandoned_checkpoint_as_zero_bytes_freed(four):
    """The bytes prune says it frees are the removed checkpoints' sizes exactly: a directory a save
    created and died in before writing anything frees nothing, not one byte (nor minus one)."""
    (four / "iter_0000050").mkdir()
    rc, out, err = cli("prune", "--keep-last", "1", "--dry-run", "-f", "json", str(four))
    pr = json.loads(out)["facts"]["pruned"]
    assert rc == 0 and sorted(pr["removed"]) == ["iter_0000050", "iter_0000100", "iter_0000300"], pr
    size = sum(f.stat().st_size for n in ("iter_0000100", "iter_0000300") for f in (four / n).rglob("*") if f.is_file())
    assert pr["bytes"] == size


def test_prune_needs_a_policy(four):
    rc, out, err = cli("prune", str(four))
    assert rc == 2 and "needs a policy" in err


def _age(path, days):
    import time
    t = time.time() - days * 86400
    for p in [path, *path.rglob("*")]:
        os.utime(p, (t, t))


def test_prune_keep_within_keeps_recent_checkpoints_and_says_what_it_frees(four):
    """restic's --keep-within: checkpoints written within the duration stay whatever the count; the
    dry run and the real run both say how many bytes go, and the same ones do go."""
    for name, days in (("iter_0000100", 20), ("iter_0000200", 20), ("iter_0000300", 3), ("iter_0000400", 1)):
        _age(four / name, days)
    (four / TRACKER).write_text("400")
    rc, out, err = cli("prune", "--keep-last", "1", "--keep-within", "7d", "--dry-run", "-f", "json", str(four))
    pr = json.loads(out)["facts"]["pruned"]
    assert rc == 0 and sorted(pr["removed"]) == ["iter_0000100", "iter_0000200"], pr
    assert pr["kept"]["iter_0000300"] == "written within the last 1w" or "within the last" in pr["kept"]["iter_0000300"]
    size = sum(f.stat().st_size for n in ("iter_0000100", "iter_0000200") for f in (four / n).rglob("*") if f.is_file())
    assert pr["bytes"] == size
    rc, out, err = cli("prune", "--keep-last", "1", "--keep-within", "7d", str(four))
    assert rc == 0 and "freed " in out and sorted(e for e in os.listdir(four) if e.startswith("iter_")) == \
        ["iter_0000300", "iter_0000400"]
    for bad in ("7m", "seven days", "", "7d-1h"):
        rc, out, err = cli("prune", "--keep-within", bad, str(four))
        assert rc == 2 and "--keep-within" in err and "Traceback" not in err, (bad, err)


def test_prune_and_manifest_take_several_paths_in_one_process(four, tmp_path):
    """`prune A B` and `manifest A B`: one document (json: a `reports` list valid against the shipped
    schema), each root judged on its own, the worst exit status."""
    jsonschema = pytest.importorskip("jsonschema")
    other = tmp_path / "other"
    shutil.copytree(four, other, symlinks=True)
    rc, out, err = cli("prune", "--keep-last", "1", "--dry-run", "-f", "json", str(four), str(other))
    doc = json.loads(out)
    jsonschema.validate(doc, json.loads(cli("schema", "report")[1]))
    assert rc == 0 and doc["command"] == "prune" and [r["target"] for r in doc["reports"]] == [str(four), str(other)]
    assert all(r["facts"]["pruned"]["dry_run"] and r["facts"]["pruned"]["removed"] for r in doc["reports"]), doc
    rc, out, err = cli("prune", "--keep-last", "1", "--dry-run", str(four), str(other))
    assert rc == 0 and out.rstrip().endswith("prune: 2 paths, all ok") and out.count("would free") == 2
    cks = [str(four / "iter_0000100"), str(other / "iter_0000100")]
    rc, out, err = cli("manifest", "-f", "json", *cks)
    doc = json.loads(out)
    jsonschema.validate(doc, json.loads(cli("schema", "report")[1]))
    assert rc == 0 and [r["facts"]["manifest"] for r in doc["reports"]] == [os.path.join(c, "ckptdoctor.manifest.json")
                                                                            for c in cks]
    rc, out, err = cli("manifest", "--replace", *cks)
    assert rc == 0 and out.count("wrote ") == 2


# ---- generated survivors of the actions group's full run (session 23) -----------------------------
def repair(root, quarantine=False):
    """`verify --fix` in this process (so a test can stand in for a racing writer)."""
    from ckptdoctor.commands import fix
    return fix.run_and_fix(str(root), lambda: api.make_engine("verify", str(root)), layout=None, target="resume",
                           fix_to=None, quarantine=quarantine, say=lambda line: None)


@pytest.fixture
def frozen_clock(monkeypatch):
    """verify --fix's clock stopped at 2026-12-05 12:00:00 UTC: backup names of one second collide."""
    import datetime as real_dt
    import types
    from ckptdoctor.commands import fix

    class Frozen(real_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return real_dt.datetime(2026, 12, 5, 12, 0, 0, tzinfo=tz)
    monkeypatch.setattr(fix, "_dt", types.SimpleNamespace(datetime=Frozen, timezone=real_dt.timezone))


def test_a_real_fix_reports_it_applied_the_plan_with_the_backup_and_the_reason(megatron_run):
    """The JSON a wrapper script reads after `verify --fix`: applied, not a dry run, the backup's
    name, and why (what the framework would have resumed from, what it resumes from now)."""
    rc, out, err = cli("verify", "--fix", "-f", "json", str(megatron_run))
    fixed = json.loads(out)["facts"]["fixed"]
    assert rc == 0 and fixed["applied"] is True and fixed["dry_run"] is False, fixed
    backups = [e for e in os.listdir(megatron_run) if e.startswith(TRACKER + ".ckptdoctor-bak-")]
    assert [fixed["tracker"]["backup"]] == backups and fixed["tracker"]["old"] == "300"
    assert f"repoint {TRACKER}: 300 -> 200 (backup {backups[0]})" in err
    assert ("verify --fix: the framework would resume from iter_0000300; iter_0000200 is the newest "
            "complete checkpoint") in err
    rc, out, err = cli("verify", "--fix", "--dry-run", "-f", "json", str(megatron_run))
    fixed = json.loads(out)["facts"]["fixed"]
    assert fixed["applied"] is False and "nothing to do" in err


def test_a_fix_with_no_tracker_says_the_framework_would_resume_from_nothing_and_backs_up_nothing(megatron_run):
    (megatron_run / TRACKER).unlink()
    rc, out, err = cli("verify", "--fix", "--dry-run", "-f", "json", str(megatron_run))
    fixed = json.loads(out)["facts"]["fixed"]
    assert fixed["tracker"]["old"] is None and fixed["tracker"]["backup"] is None, fixed
    assert "the framework would resume from nothing; iter_0000200 is the newest complete checkpoint" in err
    assert f"would repoint {TRACKER}: (missing) -> 200 (backup none: it did not exist)" in err


def test_fix_to_a_step_between_two_checkpoints_is_refused_not_rounded_to_a_neighbour(megatron_run):
    rc, out, err = cli("verify", "--fix", "--fix-to", "150", str(megatron_run))
    assert rc == 2 and "--fix-to 150: no complete checkpoint at step 150 (complete: iter_0000100, iter_0000200)" in err
    assert (megatron_run / TRACKER).read_text() == "300"


def test_a_quarantine_refused_as_a_save_in_progress_says_how_long_to_wait(tmp_path):
    root = tmp_path / "out"
    (root / "checkpoint-500").mkdir(parents=True)
    (root / "checkpoint-500" / "trainer_state.json").write_text(json.dumps({"global_step": 500}))
    broken = root / "checkpoint-1000"
    broken.mkdir()
    (broken / "optimizer.pt").write_bytes(b"x")
    t = time.time() - 100           # written 100 s ago: the window (parts_stale_seconds) is 300 s
    for p in (broken / "optimizer.pt", broken):
        os.utime(p, (t, t))
    rc, out, err = cli("verify", "--fix", "--quarantine", str(root))
    import re
    m = re.search(r"written (\d+) s ago and may be a save in progress; .* or (\d+) s from now\)", err)
    assert rc == 2 and m and int(m.group(1)) + int(m.group(2)) in (299, 300, 301), err
    assert 190 <= int(m.group(2)) <= 200 and broken.exists()


def test_prune_keep_last_two_keeps_the_two_newest_and_zero_is_refused(four):
    (four / TRACKER).write_text("400")
    rc, out, err = cli("prune", "--keep-last", "2", "-f", "json", str(four))
    pr = json.loads(out)["facts"]["pruned"]
    assert rc == 0 and sorted(pr["removed"]) == ["iter_0000100", "iter_0000200"], (pr, err)
    assert sorted(e for e in os.listdir(four) if e.startswith("iter_")) == ["iter_0000300", "iter_0000400"]
    rc, out, err = cli("prune", "--keep-last", "0", str(four))
    assert rc == 2 and "--keep-last must be at least 1" in err


def test_fix_never_overwrites_a_tracker_written_between_its_temp_file_and_the_rename(megatron_run, monkeypatch, frozen_clock):
    """A publish that moves the tracker (to 400, or back to 100) in the last window before the
    rename wins: the repair is refused in one line, the tracker keeps what the publish wrote and no
    backup is left ("nothing written").  Run again at once (what the message asks: the clock frozen
    at one second, so backup names collide deterministically), each repair keeps its own backup."""
    from ckptdoctor.commands import fix
    from ckptdoctor.engine.errors import UsageError
    real = fix.replace_file
    for concurrent in ("400", "100"):
        (megatron_run / TRACKER).write_text("300")

        def racing(path, data, *, before_rename=None, **kw):
            open(path, "w").write(concurrent)
            return real(path, data, before_rename=before_rename, **kw)
        monkeypatch.setattr(fix, "replace_file", racing)
        with pytest.raises(UsageError, match="changed while being repaired"):
            repair(megatron_run)
        assert (megatron_run / TRACKER).read_text() == concurrent
        assert not [e for e in os.listdir(megatron_run) if ".ckptdoctor-bak" in e]
    monkeypatch.setattr(fix, "replace_file", real)
    for _ in range(2):
        (megatron_run / TRACKER).write_text("300")
        repair(megatron_run)
        assert (megatron_run / TRACKER).read_text() == "200"
    assert sorted(e for e in os.listdir(megatron_run) if ".ckptdoctor-bak" in e) == \
        [TRACKER + ".ckptdoctor-bak-20261205T120000Z", TRACKER + ".ckptdoctor-bak-20261205T120000Z-2"]


def test_fix_with_99_backups_of_this_second_already_beside_the_tracker_is_refused_in_one_line(megatron_run, frozen_clock):
    from ckptdoctor.engine.errors import UsageError
    base = TRACKER + ".ckptdoctor-bak-20261205T120000Z"
    for n in range(1, 100):
        (megatron_run / (base if n == 1 else f"{base}-{n}")).write_text("old")
    with pytest.raises(UsageError, match=rf"^verify --fix: {base} and 98 more backups exist beside {TRACKER}; nothing written$"):
        repair(megatron_run)
    assert (megatron_run / TRACKER).read_text() == "300"


def test_a_rollback_to_global_step6_names_global_step10_as_newer_though_it_sorts_first(tmp_path):
    """DeepSpeed's tags are not zero-padded: the hint compares steps, not names."""
    root = _deepspeed_run(tmp_path / "ds", (6, 10))
    (root / "latest").write_text("global_step6")
    rc, out, err = cli("verify", "--fix", str(root))
    assert "(global_step10 is newer and complete: a rollback to global_step6 is left as it is; --fix-to 10 moves it)" \
        in err and (root / "latest").read_text() == "global_step6", err


def test_fix_to_the_step_already_resumed_from_writes_nothing(four):
    before = snapshot(four)
    rc, out, err = cli("verify", "--fix", "--fix-to", "200", str(four))
    assert rc == 0 and "nothing to do: the framework already resumes from iter_0000200, which is complete" in err
    assert snapshot(four) == before


def test_fix_to_a_step_above_256_moves_the_tracker_there(four):
    """(Step numbers compared by value: CPython shares the int objects only up to 256.)"""
    rc, out, err = cli("verify", "--fix", "--fix-to", "400", "--dry-run", str(four))
    assert "would repoint latest_checkpointed_iteration.txt: 200 -> 400" in err, err
    rc, out, err = cli("verify", "--fix", "--fix-to", "400", str(four))
    assert rc == 0 and (four / TRACKER).read_text() == "400", err


def test_a_quarantine_makes_its_renames_durable_with_a_directory_fsync(tmp_path, monkeypatch):
    from ckptdoctor.commands import fix
    root = _trainer_run(tmp_path / "out")
    synced = []
    real = fix.fsync_dir
    monkeypatch.setattr(fix, "fsync_dir", lambda d: (synced.append(os.path.realpath(d)), real(d))[1])
    repair(root, quarantine=True)
    assert [e for e in os.listdir(root) if e.startswith("ckptdoctor-quarantined-1500-")]
    assert synced == [os.path.realpath(root)]


def test_a_quarantine_candidate_gone_after_the_judgement_is_not_moved_and_nothing_crashes(tmp_path):
    from ckptdoctor.commands import fix, verify as vflow
    root = _trainer_run(tmp_path / "out")
    rep, runv = vflow.judge(str(root), api.make_engine("verify", str(root)), None, "resume")
    shutil.rmtree(root / "checkpoint-1500")            # its owner cleaned it up meanwhile
    p = fix.plan(runv, None, True)
    assert p.to == "checkpoint-1000" and p.quarantine == []


def test_prune_keep_every_zero_is_refused(four):
    rc, out, err = cli("prune", "--keep-last", "1", "--keep-every", "0", str(four))
    assert rc == 2 and "--keep-every must be at least 1" in err and len(os.listdir(four)) == 5


def test_a_quarantine_on_an_object_store_is_refused_in_one_line_even_for_an_old_broken_checkpoint(tmp_path, monkeypatch):
    """An hour-old broken checkpoint on S3 (no save in progress): refused as not local, with nothing
    renamed -- it was an AttributeError when the plan looked for real directories."""
    import fsspec
    from ckptdoctor.commands import fix, verify as vflow
    from ckptdoctor.engine.errors import UsageError
    from ckptdoctor.layouts import model
    root = _trainer_run(tmp_path / "out")
    fs = fsspec.filesystem("memory")
    fs.put(str(root), "/qrun", recursive=True)
    rep, runv = vflow.judge("memory://qrun", api.make_engine("verify", "memory://qrun"), None, "resume")
    assert runv.resume_target == "checkpoint-1500"
    monkeypatch.setattr(model, "age_seconds", lambda mtime: 3600.0)   # memory:// keeps no old mtimes
    with pytest.raises(UsageError, match=r"^verify --fix: memory://qrun is not a local directory; repair it where it is mounted$"):
        fix.plan(runv, None, True)
    assert fs.exists("/qrun/checkpoint-1500/optimizer.pt")


def test_fix_on_a_single_checkpoint_is_refused_in_one_line(megatron_run):
    before = snapshot(megatron_run)
    rc, out, err = cli("verify", "--fix", str(megatron_run / "iter_0000200"))
    assert rc == 2 and "--fix repairs a run root (the tracker or the newest directory), not a single checkpoint" in err
    assert "Traceback" not in err and snapshot(megatron_run) == before


def test_a_newer_checkpoint_gone_during_the_in_flight_check_does_not_hide_one_still_being_written():
    """Each newer checkpoint is asked when it was last written; one deleted meanwhile (its listing
    fails) is passed over, and the next one, written just now, still refuses the quarantine."""
    from ckptdoctor.commands import fix
    from ckptdoctor.engine.errors import UsageError

    class Gone:
        name = "checkpoint-1500"

        @property
        def newest_mtime(self):
            raise FileNotFoundError(2, "No such file or directory")

    class Fresh:
        name = "checkpoint-2000"
        newest_mtime = time.time()
    with pytest.raises(UsageError, match=r"checkpoint-2000 was written \d+ s ago and may be a save in progress"):
        fix._refuse_in_flight([Gone(), Fresh()])
    fix._refuse_in_flight([Gone()])   # gone and nothing else: no save in progress to protect


def test_a_broken_checkpoint_last_written_exactly_the_in_flight_window_ago_is_quarantined(tmp_path, monkeypatch):
    """The window (rules/publish.yaml `parts_stale_seconds`) is how long a save may go without
    writing: at exactly that age it is over, and the quarantine goes ahead."""
    from ckptdoctor.layouts import model
    from ckptdoctor.publishing import naming
    root = _trainer_run(tmp_path / "out", age=0)
    window = float(naming.config()["parts_stale_seconds"])
    monkeypatch.setattr(model, "age_seconds", lambda mtime: window)
    repair(root, quarantine=True)
    assert not (root / "checkpoint-1500").exists()
    assert [e for e in os.listdir(root) if e.startswith("ckptdoctor-quarantined-1500-")]
    monkeypatch.setattr(model, "age_seconds", lambda mtime: window - 0.5)
    root2 = _trainer_run(tmp_path / "out2", age=0)
    from ckptdoctor.engine.errors import UsageError
    with pytest.raises(UsageError, match="may be a save in progress"):
        repair(root2, quarantine=True)
    assert (root2 / "checkpoint-1500").is_dir()
