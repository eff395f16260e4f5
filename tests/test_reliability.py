"""Reliability under hostile or unlucky conditions (issue 16): the tracker never goes backwards or
dangles, publish is whole-or-nothing when the source misbehaves, small hostile files cannot hang
or balloon a command, and checks fail closed.  Every test here failed on the code before it."""
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from ckptdoctor import api
from ckptdoctor.layouts import dcp_writer as W
from helpers import as_unprivileged, assert_fires, cli

TRACKER = "latest_checkpointed_iteration.txt"


def iter_dir(d, step=100, world=2, mb=0.0):
    """A Megatron torch_dist iteration (ckptdoctor's torch-free DCP writer + metadata.json)."""
    per = max(2, int(mb * (1 << 20) / 4 / world / 64)) if mb else 2
    W.write(str(d), [W.Item("w", (world * per, 64), (r * per, 0), (per, 64), [float(step + r)] * (per * 64), rank=r)
                     for r in range(world)])
    (d / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    return d


def run_cli(*args, timeout=60, **kw):
    """The CLI with a hard timeout: a hang is a test failure, not a stuck suite."""
    return cli(*args, timeout=timeout, **kw)


# ---- 1. concurrent publishes never move the tracker backwards -----------------------------------
def test_concurrent_publishes_keep_the_tracker_at_the_newest(tmp_path):
    src = tmp_path / "src"
    for s in (100, 300):
        iter_dir(src / f"iter_{s:07d}", s, mb=8)
    finals = []
    for trial in range(6):
        dest = tmp_path / f"dest{trial}"
        procs = [subprocess.Popen([sys.executable, "-m", "ckptdoctor", "publish", "-q", "--keep-last", "1",
                                   str(src / n), str(dest)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for n in (["iter_0000100", "iter_0000300"] if trial % 2 else ["iter_0000300", "iter_0000100"])]
        for p in procs:
            assert p.wait(timeout=120) == 0, p.stderr.read()
        finals.append((dest / TRACKER).read_text())
        assert (dest / "iter_0000300").is_dir()  # the tracker's target is never pruned
        rep = api.verify(str(dest))
        assert rep.facts["resume_from"] == "iter_0000300", rep.facts
    assert finals == ["300"] * 6


# ---- 2. an unlistable source subdirectory aborts the publish ----------------------------------------
def test_unlistable_source_subdirectory_aborts(tmp_path):
    src = iter_dir(tmp_path / "src" / "iter_0000100")
    (src / "extra").mkdir()
    (src / "extra" / "optim.bin").write_bytes(b"x" * 100)
    os.chmod(src / "extra", 0)
    os.chmod(tmp_path, 0o755)
    try:
        p = subprocess.run(as_unprivileged() + [sys.executable, "-m", "ckptdoctor", "publish", "-q", str(src),
                                                str(tmp_path / "dest")], capture_output=True, text=True, timeout=60)
    finally:
        os.chmod(src / "extra", 0o755)
    assert p.returncode == 2 and "extra" in p.stderr and "Permission denied" in p.stderr, p.stderr
    assert not (tmp_path / "dest" / "iter_0000100").exists() and not (tmp_path / "dest" / TRACKER).exists()


# ---- 3. a source that changes across files is not published ----------------------------------------
@pytest.mark.parametrize("change", ["add", "rewrite"])
def test_source_changing_across_files_aborts(tmp_path, change, monkeypatch):
    src = iter_dir(tmp_path / "src" / "iter_0000100", mb=16)
    dest = tmp_path / "dest"
    from ckptdoctor.publishing import copier
    real_copy = copier.copy_file
    done = []

    def copy_then_change(s, d, rel, *a, **k):  # another writer touches a file already copied
        out = real_copy(s, d, rel, *a, **k)
        if not done:
            done.append(rel)
            if change == "add":
                (src / "__9_0.distcp").write_bytes(b"late")
            else:
                other = src / "metadata.json"
                other.write_text(json.dumps({"sharded_backend": "torch_dist", "v": 2}))
        return out
    monkeypatch.setattr(copier, "copy_file", copy_then_change)
    from ckptdoctor.engine.errors import InputError
    with pytest.raises(InputError, match="source changed while publishing"):
        api.publish(str(src), str(dest), workers=1)
    assert not (dest / "iter_0000100").exists() and not (dest / TRACKER).exists()


# ---- 4/5. names: ASCII, one line, never a tracker's or marker's name ---------------------------------
@pytest.mark.parametrize("name, words", [
    ("iter_0000200\n", "one ASCII directory name"),
    ("iter_٠٠٠٠٢٠٠", "one ASCII directory name"),
    (".hidden", "one ASCII directory name"),
    ("a/b", "one ASCII directory name"),
    (TRACKER, "tracker or marker file"),
    ("latest", "tracker or marker file"),
    ("ckptdoctor.manifest.json", "tracker or marker file"),
])
def test_bad_names_are_refused_before_anything_is_written(tmp_path, name, words):
    src = iter_dir(tmp_path / "src" / "iter_0000100")
    dest = tmp_path / "dest"
    rc, out, err = run_cli("publish", "-q", "--replace", "--name", name, str(src), str(dest))
    assert rc == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert not dest.exists() or os.listdir(dest) == []


def test_a_tracker_that_is_not_a_regular_file_is_an_error(tmp_path):
    root = tmp_path / "run"
    iter_dir(root / "iter_0000100")
    (root / TRACKER).mkdir()
    rep = api.verify(str(root))
    hit = assert_fires(rep, "CKD112", severity="error")[0]
    assert "not a regular file" in hit.message and rep.failed()


# ---- 6. "same bytes" means the destination's bytes --------------------------------------------------
def test_republish_repairs_a_corrupted_destination(tmp_path):
    src = iter_dir(tmp_path / "src" / "iter_0000100")
    dest = tmp_path / "dest"
    api.publish(str(src), str(dest))
    shard = dest / "iter_0000100" / "__1_0.distcp"
    b = bytearray(shard.read_bytes())
    b[-50] ^= 1
    shard.write_bytes(bytes(b))
    rc, out, err = run_cli("publish", "-q", str(src), str(dest))
    assert rc == 2 and "exists with content different" in err, err  # no longer "already holds these bytes"
    rc, out, err = run_cli("publish", "-q", "--trust-manifest", str(src), str(dest), "-f", "json")
    assert rc == 0 and json.loads(out)["facts"]["published"]["status"] == "unchanged"  # told to trust it
    rc, out, err = run_cli("publish", "-q", "--replace", str(src), str(dest), "-f", "json")
    assert rc == 0 and json.loads(out)["facts"]["published"]["status"] == "replaced", err
    assert not api.verify(str(dest / "iter_0000100"), checksums=True).findings


# ---- 7/8. FIFOs and devices are findings, never a hang or a 4 GiB read --------------------------------
def _fifo(path):
    if path.exists():
        path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("which", [".metadata", "__1_0.distcp", "metadata.json"])
def test_fifo_inside_a_checkpoint_is_a_finding(tmp_path, which):
    d = iter_dir(tmp_path / "iter_0000100")
    _fifo(d / which)
    for args in (["verify", str(d)], ["verify", "--checksums", str(d)]):
        rc, out, err = run_cli(*args, "-f", "json", timeout=30)
        assert rc == 1 and "Traceback" not in err, (args, err)
    rc, out, err = run_cli("preflight", str(d), "--nodelist", "n1", "--ranks-per-node", "2", "-f", "json",
                           timeout=30)
    assert rc in (0, 1) and "Traceback" not in err, err


def test_fifo_tracker_and_manifest_listed_fifo(tmp_path):
    root = tmp_path / "run"
    d = iter_dir(root / "iter_0000100")
    from ckptdoctor.commands.manifest import write_manifest
    write_manifest(str(d), quiet=True)
    _fifo(d / "__0_0.distcp")
    _fifo(root / TRACKER)
    rc, out, err = run_cli("verify", "--checksums", "-f", "json", str(root), timeout=30)
    doc = json.loads(out)
    rules = {f["rule"] for f in doc["findings"]}
    assert rc == 1 and {"CKD112", "CKD901"} <= rules, doc["findings"]
    src = iter_dir(tmp_path / "src" / "iter_0000200", 200)
    rc, out, err = run_cli("publish", "-q", str(src), str(root), timeout=30)  # the destination tracker is a FIFO
    assert rc == 2 and "published and complete" in err and "not a regular file" in err, err
    assert (root / "iter_0000200").is_dir()


def test_metadata_linked_to_dev_zero_is_refused_without_reading(tmp_path):
    d = iter_dir(tmp_path / "iter_0000100")
    (d / ".metadata").unlink()
    os.symlink("/dev/zero", d / ".metadata")
    t = time.monotonic()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-m", "ckptdoctor", "verify", "-f", "json",
                        str(d)], capture_output=True, text=True, timeout=30)
    assert time.monotonic() - t < 20
    rss_kib = int(p.stderr.strip().splitlines()[-1])
    doc = json.loads(p.stdout)
    hits = [f for f in doc["findings"] if f["rule"] == "CKD110"]
    assert p.returncode == 1 and hits and "device" in hits[0]["message"], doc["findings"]
    assert rss_kib < 200 * 1024, rss_kib


# ---- 14. a manifest must cover every data file ----------------------------------------------------------
@pytest.mark.parametrize("manifest", ["ckptdoctor.manifest.json", "integrity.json"])
def test_empty_manifest_does_not_cover_a_corrupted_shard(tmp_path, manifest):
    d = iter_dir(tmp_path / "iter_0000100")
    (d / manifest).write_text(json.dumps({"schema": "ckptdoctor.manifest/v1", "algorithm": "xxh3-128",
                                          "chunk_bytes": 1 << 26, "files": {}}) if manifest != "integrity.json"
                              else json.dumps({"algorithm": "sha256", "files": {}}))
    shard = d / "__1_0.distcp"
    b = bytearray(shard.read_bytes())
    b[-50] ^= 1
    shard.write_bytes(bytes(b))
    rep = api.verify(str(d), checksums=True)
    hits = assert_fires(rep, "CKD153", severity="error")
    assert any("__1_0.distcp" in h.path for h in hits) and rep.failed()


def test_unlisted_readme_is_only_a_warning(tmp_path):
    d = iter_dir(tmp_path / "iter_0000100")
    from ckptdoctor.commands.manifest import write_manifest
    write_manifest(str(d), quiet=True)
    (d / "README.txt").write_text("notes")
    rep = api.verify(str(d), checksums=True)
    hit = assert_fires(rep, "CKD153", severity="warning")[0]
    assert "README.txt" in hit.path and not rep.failed()


# ---- 18. messages that say what happened -----------------------------------------------------------------
def test_stale_temp_whose_pid_was_reused_is_cleaned(tmp_path):
    src = iter_dir(tmp_path / "src" / "iter_0000100")
    dest = tmp_path / "dest"
    dest.mkdir()
    from ckptdoctor.publishing import naming
    # a dead publish's temp whose pid now belongs to a live, different process (our parent shell)
    ppid = os.getppid()
    stale = dest / f".iter_0000100.ckptdoctor-tmp-{naming.HOST}-{ppid}.1-abcdef"
    stale.mkdir()
    (stale / "junk").write_bytes(b"x")
    res = api.publish(str(src), str(dest))
    assert stale.name in res.cleaned and not stale.exists()


def test_tracker_write_failure_says_the_checkpoint_landed(tmp_path):
    src = iter_dir(tmp_path / "src" / "iter_0000200", 200)
    dest = tmp_path / "dest"
    iter_dir(dest / "iter_0000100")
    os.mkfifo(dest / TRACKER)  # the tracker step fails after the commit (it cannot be read)
    rc, out, err = run_cli("publish", "-q", str(src), str(dest), timeout=30)
    assert rc == 2 and "iter_0000200 is published and complete" in err and "re-run publish" in err, err
    assert (dest / "iter_0000200" / ".metadata").exists()
