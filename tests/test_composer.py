"""Composer runs (checkpoints that are files, a symlink tracker): what verify, --fix and prune promise.

The run root is the one mosaicml 0.32.1 wrote (tests/fixtures/real/composer/run, made by
tests/conformance/gen_composer.py); test_conformance.py checks every damage case against Composer's
own autoresume.  These tests pin what the user is promised beyond the verdict."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from ckptdoctor import api
from helpers import assert_fires, assert_no_errors, cli
from test_doctor import repair

RUN = Path(__file__).parent / "fixtures" / "real" / "composer" / "run"
LINK, B2, B4 = "latest-rank0.pt", "ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt"


def _copy(tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(RUN, dst, symlinks=True)
    return dst


def test_a_composer_run_lists_each_checkpoint_file_with_its_batch_and_resumes_from_the_link(tmp_path):
    run = _copy(tmp_path)
    rep = api.verify(str(run))
    assert_no_errors(rep)
    assert rep.facts["layout"] == "composer-run"
    assert [(r["name"], r["step"]) for r in rep.facts["checkpoints"]] == [(B2, 2), (B4, 4)]
    gate = api.verify(str(run), target="resume")   # the gate judges what resumes, not the older file
    assert gate.facts["resume_from"] == B4 and gate.facts["gate"]["passed"] and gate.facts["not_judged"] == [B2]


def test_a_latest_link_pointing_outside_the_run_root_is_unreadable_with_the_links_own_repair(tmp_path):
    """latest-rank0.pt pointing outside the run root: CKD112 (an error) whose hint is the symbolic
    link's repair (`--fix` once it is moved aside), not a text tracker's rewrite."""
    run = _copy(tmp_path)
    os.remove(run / LINK)
    os.symlink(str(tmp_path / "elsewhere" / B4), run / LINK)
    (hit,) = assert_fires(api.verify(str(run)), "CKD112", severity="error")
    assert hit.hint.startswith("the framework cannot resume from it; replace it with a relative link"), hit.hint


def test_fix_relinks_a_missing_latest_link_atomically_and_keeps_the_old_one(tmp_path):
    run = _copy(tmp_path)
    os.remove(run / B4)                     # the link now dangles: Composer raises on resume
    rc, out, err = cli("verify", str(run), "--fix", "--dry-run")
    assert rc == 1 and os.readlink(run / LINK) == B4, (out, err)   # the plan is said, nothing written
    assert f"repoint {LINK}: {B4} -> {B2}" in err
    rc, out, err = cli("verify", str(run), "--fix")
    assert rc == 0, (out, err)
    assert os.path.islink(run / LINK) and os.readlink(run / LINK) == B2   # a relative link, as Composer writes
    [bak] = [n for n in os.listdir(run) if n.startswith(LINK + ".ckptdoctor-bak")]
    assert os.readlink(run / bak) == B4
    assert not [n for n in os.listdir(run) if "ckptdoctor-tmp" in n]
    assert_no_errors(api.verify(str(run), target="resume"))


def test_fix_leaves_a_link_copied_as_a_file_alone_when_it_loads(tmp_path):
    run = _copy(tmp_path)
    os.remove(run / LINK)
    shutil.copy2(run / B4, run / LINK)      # cp -L: Composer loads the copy (measured)
    rep = api.verify(str(run), target="resume")
    assert not rep.failed() and rep.facts["resume_from"] == LINK
    rc, out, err = cli("verify", str(run), "--fix")
    assert rc == 0 and not os.path.islink(run / LINK) and "already resumes from" in err, (out, err)


def test_a_rollback_link_names_the_newer_file_composer_refuses_to_start_beside(tmp_path):
    run = _copy(tmp_path)
    os.remove(run / LINK)
    os.symlink(B2, run / LINK)
    rep = api.verify(str(run), target="resume")
    assert rep.failed()
    [hit] = assert_fires(rep, "CKD135", path_contains=B4, severity="error")
    assert "batch 4" in hit.message and "FileExistsError" in hit.message and "save_overwrite=True" in hit.hint
    assert_fires(rep, "CKD114", severity="warning")
    shutil.move(run / B4, run / ("." + B4))   # what the hint says: a dot name Composer's check skips
    assert not api.verify(str(run), target="resume").failed()


def test_a_link_copied_as_a_file_is_matched_to_the_step_it_copies_and_a_newer_file_beside_it_fails_the_gate(tmp_path):
    run = _copy(tmp_path)
    os.remove(run / LINK)
    shutil.copy2(run / B2, run / LINK)      # rsync -L of a rolled-back run: Composer resumes at batch 2 (measured)
    rep = api.verify(str(run), target="resume")
    [hit] = assert_fires(rep, "CKD135", path_contains=B4, severity="error")
    assert f"{LINK} (a copy of {B2})" in hit.message and hit.details["target"] == LINK
    # a copy that matches no step file (a directory CRC differs: another archive): no step is guessed
    data = bytearray((run / LINK).read_bytes())
    data[data.rfind(b"PK\x01\x02") + 16] ^= 0xFF
    (run / LINK).write_bytes(bytes(data))
    assert "CKD135" not in {f.rule for f in api.verify(str(run), target="resume").findings}


def test_the_copy_test_reads_the_zip_directory_not_the_data(tmp_path):
    import zipfile
    from ckptdoctor.layouts import ptzip
    big = tmp_path / "ep0-ba8-rank0.pt"
    with zipfile.ZipFile(big, "w") as zf:   # stored, as torch.save writes: 8 MiB of data, then the directory
        zf.writestr("ep0-ba8-rank0/data.pkl", b"\x80\x02}q\x00.")
        zf.writestr("ep0-ba8-rank0/data/0", os.urandom(8 << 20))
    reads = []

    class Counting:
        def __init__(self, fh):
            self.fh = fh

        def seek(self, *a):
            return self.fh.seek(*a)

        def read(self, n=-1):
            b = self.fh.read(n)
            reads.append(len(b))
            return b
    with open(big, "rb") as fh:
        fp = ptzip.fingerprint(Counting(fh))
    assert fp[0] == big.stat().st_size and [n for n, _, _ in fp[1]] == ["ep0-ba8-rank0/data.pkl", "ep0-ba8-rank0/data/0"]
    assert sum(reads) < 0xFFFF + 1024, reads   # the end records and two headers, never the 8 MiB


def test_the_rollback_hint_names_fix_to_not_plain_fix(tmp_path):
    run = _copy(tmp_path)
    os.remove(run / LINK)
    os.symlink(B2, run / LINK)
    rc, out, err = cli("verify", str(run), env={"NO_COLOR": "1", "COLUMNS": "300"})
    assert "--fix-to 4" in out + err and "makes it resume from" not in out + err, (out, err)


def test_prune_never_touches_composer_checkpoint_files(tmp_path):
    run = _copy(tmp_path)
    rc, out, err = cli("prune", str(run), "--keep-last", "1", "-f", "json")
    doc = json.loads(out)
    assert sorted(n for n in os.listdir(run) if not n.startswith(".")) == sorted([B2, B4, LINK]), (rc, doc)
    assert "checkpoint file" in json.dumps(doc), doc


def test_preflight_names_the_node_whose_copy_lacks_the_checkpoint_file_every_rank_loads(tmp_path):
    """Composer's autoresume has every rank load rank 0's file: on node-local copies, a node without
    it fails; the checkpoint file (not a made-up per-rank shard) is named, with the node's ranks."""
    for n in ("n1", "n2"):
        shutil.copytree(RUN, tmp_path / n / "run", symlinks=True)
    rc, out, err = cli("preflight", f"{tmp_path}/{{node}}/run", "--nodelist", "n1,n2", "--ranks-per-node", "2",
                       "-f", "json")
    assert rc == 0 and not json.loads(out)["findings"], (out, err)
    os.remove(tmp_path / "n2" / "run" / B4)
    rc, out, err = cli("preflight", f"{tmp_path}/{{node}}/run", "--nodelist", "n1,n2", "--ranks-per-node", "2",
                       "-f", "json")
    doc = json.loads(out)
    assert rc == 1, (out, err)
    [hit] = [f for f in doc["findings"] if f["rule"] == "CKD403"]
    assert hit["severity"] == "error" and hit["path"].endswith(f"n2/run/{B4}") and "(ranks 2,3)" in hit["message"], hit
    assert not [f for f in doc["findings"] if f["rule"] == "CKD401"], doc["findings"]   # no per-rank shards here
    assert "ep0-ba2-rank0.pt" in json.dumps([f for f in doc["findings"] if f["rule"] == "CKD406"])


# ---- generated survivors of the actions group's full run (session 23) -----------------------------
def test_fix_creates_a_missing_latest_link_with_no_backup(tmp_path):
    run = _copy(tmp_path)
    os.remove(run / LINK)
    rc, out, err = cli("verify", str(run), "--fix")
    assert rc == 0 and os.readlink(run / LINK) == B4, (out, err)
    assert not [n for n in os.listdir(run) if ".ckptdoctor-bak" in n]


def test_a_step_file_that_is_a_link_is_never_opened_to_match_a_copied_tracker(tmp_path):
    """Matching a tracker copied as a file to the step it copies opens regular files only: a step
    file that is a symbolic link (here to a copy of the same bytes outside the run root) is not
    read, so the copy is still matched to the one regular file it equals."""
    run = _copy(tmp_path)
    os.remove(run / LINK)
    shutil.copy2(run / B2, run / LINK)
    shutil.copy2(run / B2, tmp_path / "elsewhere.pt")
    os.symlink(tmp_path / "elsewhere.pt", run / "ep0-ba3-rank0.pt")
    rep = api.verify(str(run), target="resume")
    [hit] = assert_fires(rep, "CKD135", path_contains=B4, severity="error")
    assert f"{LINK} (a copy of {B2})" in hit.message, hit.message


def test_fix_refuses_a_link_copied_as_a_file_that_does_not_load_and_leaves_it(tmp_path):
    run = _copy(tmp_path)
    os.remove(run / B4)                     # the link dangles ...
    os.remove(run / LINK)
    (run / LINK).write_bytes((run / B2).read_bytes()[:100])   # ... and a torn copy stands in its place
    before = (run / LINK).read_bytes()
    rc, out, err = cli("verify", str(run), "--fix")
    assert rc == 2 and f"{LINK} is not a symbolic link (a copy that followed links?)" in err, (out, err)
    assert not os.path.islink(run / LINK) and (run / LINK).read_bytes() == before


def test_fix_never_repoints_a_link_a_new_save_moved_after_the_judgement(tmp_path, monkeypatch):
    """The judgement saw the link dangling at ba4 and planned ba2; before the repair, a save landed
    ba6 and moved the link to it: the repair refuses and the new save's link stays."""
    from ckptdoctor.commands import fix
    from ckptdoctor.engine.errors import UsageError
    run = _copy(tmp_path)
    os.remove(run / B4)
    real = fix.apply

    def racing(runv, p):
        shutil.copy2(run / B2, run / "ep0-ba6-rank0.pt")
        os.remove(run / LINK)
        os.symlink("ep0-ba6-rank0.pt", run / LINK)
        return real(runv, p)
    monkeypatch.setattr(fix, "apply", racing)
    with pytest.raises(UsageError, match="changed while being repaired"):
        repair(run)
    assert os.readlink(run / LINK) == "ep0-ba6-rank0.pt"
    assert not [n for n in os.listdir(run) if ".ckptdoctor-bak" in n or "ckptdoctor-tmp" in n]


@pytest.mark.parametrize("concurrent", ["link", "file"])
def test_fix_never_repoints_a_link_changed_between_its_temp_link_and_the_rename(tmp_path, monkeypatch, concurrent):
    """The last look is taken right before the rename: a link moved (or replaced by a file) in that
    window is kept, the repair refused in one line."""
    from ckptdoctor.commands import fix
    from ckptdoctor.engine.errors import UsageError
    run = _copy(tmp_path)
    os.remove(run / B4)
    real = fix.replace_symlink

    def racing(path, target, *, before_rename=None):
        os.remove(path)
        if concurrent == "link":
            os.symlink("ep0-ba6-rank0.pt", path)
        else:
            open(path, "wb").write(b"not a link")
        return real(path, target, before_rename=before_rename)
    monkeypatch.setattr(fix, "replace_symlink", racing)
    with pytest.raises(UsageError, match="changed while being repaired"):
        repair(run)
    if concurrent == "link":
        assert os.readlink(run / LINK) == "ep0-ba6-rank0.pt"
    else:
        assert (run / LINK).read_bytes() == b"not a link"
    assert not [n for n in os.listdir(run) if ".ckptdoctor-bak" in n or "ckptdoctor-tmp" in n]   # nothing written
