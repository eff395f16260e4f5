"""Reliability under hostile or unlucky conditions (issue 16): the tracker never goes backwards or
dangles, publish is whole-or-nothing when the source misbehaves, small hostile files cannot hang
or balloon a command, and checks fail closed.  Every test here failed on the code before it."""
import json
import os
import subprocess
import sys
import time

import pytest

from ckptdoctor import api
from ckptdoctor.layouts import dcp_writer as W
from helpers import as_unprivileged, assert_fires, cli, terminal_sigint

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


def test_a_slow_older_publish_cannot_overwrite_a_newer_tracker(tmp_path):
    """Deterministic ordering of the race: the publish of iter 100 decides its tracker write, then
    stalls just before the rename; meanwhile iter 300 is published.  Without one lock around
    read-decide-write, 100's late rename would move the tracker backwards."""
    src = tmp_path / "src"
    for s in (100, 300):
        iter_dir(src / f"iter_{s:07d}", s)
    dest = tmp_path / "dest"
    slow = subprocess.Popen([sys.executable, "-m", "ckptdoctor", "publish", "-q", str(src / "iter_0000100"),
                             str(dest)], env=dict(os.environ, CKPTDOCTOR_TEST_PAUSE_AT="tracker-temp:3"),
                            stderr=subprocess.PIPE)
    for _ in range(200):  # wait until the slow one holds its decided tracker temp
        if dest.exists() and any(".ckptdoctor-tmp" in e and TRACKER in e for e in os.listdir(dest)):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the slow publish never reached its tracker write")
    rc, out, err = run_cli("publish", "-q", str(src / "iter_0000300"), str(dest))
    assert rc == 0, err
    assert slow.wait(timeout=60) == 0, slow.stderr.read()
    assert (dest / TRACKER).read_text() == "300"


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


# ---- 9/13. bombs: YAML aliases, shared-reference pickles, deflate ----------------------------------------
def _measured(*args, timeout=60):
    """(rc, stdout, stderr, peak RSS MiB) of the real CLI under /usr/bin/time."""
    p = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-m", "ckptdoctor", *args],
                       capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in p.stderr.strip().splitlines() if not ln.startswith("Command exited with")]
    return p.returncode, p.stdout, "\n".join(lines[:-1]), int(lines[-1]) / 1024


BILLION_LAUGHS = "a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi")) + \
    "schema: ckptdoctor.run_state/v1\ntrainer: {step: *i}\n"


def test_yaml_alias_bomb_state_file_is_refused_fast(tmp_path):
    p = tmp_path / "state.yaml"
    p.write_text(BILLION_LAUGHS)
    assert len(BILLION_LAUGHS) < 1200
    rc, out, err, rss = _measured("reconcile", str(p), timeout=30)
    assert rc == 2 and "YAML aliases" in err and len(err.splitlines()) == 1, err
    assert rss < 300, rss


def test_recursive_yaml_alias_is_refused(tmp_path):
    p = tmp_path / "state.yaml"
    p.write_text("schema: ckptdoctor.run_state/v1\nloop: &l [*l]\n")
    rc, out, err, rss = _measured("reconcile", str(p), timeout=30)
    assert rc == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err


def _pt_with(pickle_bytes: bytes, compress=False) -> bytes:
    import io
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pickle_bytes)
        zf.writestr("archive/version", "3\n")
    return buf.getvalue()


def _nemo_step(tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fixtures"))
    pytest.importorskip("torch")
    import nemo_rl_ckpt
    return nemo_rl_ckpt.write_step(tmp_path / "rl", step=7, cursor=6, batches=7)


def test_shared_reference_pickle_in_a_pt_is_a_finding(tmp_path):
    step = _nemo_step(tmp_path)
    # list nested 30 deep, each level holding the level below twice: 1.4 KB, 2^30 values as a tree
    import pickle
    x: list = []
    for _ in range(30):
        x = [x, x]
    data = pickle.dumps({"_num_yielded": x}, protocol=2)
    assert len(data) < 2000
    open(os.path.join(step, "train_dataloader.pt"), "wb").write(_pt_with(data))
    rc, out, err, rss = _measured("reconcile", "-f", "json", step, timeout=30)
    assert rc == 1 and "Traceback" not in err, err
    notes = [f for f in json.loads(out)["findings"] if "train_dataloader.pt" in f["path"]]
    assert notes and any("values" in f["message"] for f in notes), json.loads(out)["findings"]
    assert rss < 400, rss


def test_deflate_bomb_pt_is_refused_before_inflating(tmp_path):
    from ckptdoctor.io import ptfile
    import io
    bomb = _pt_with(b"\x80\x02" + b"\x00" * (200 << 20) + b".", compress=True)
    assert len(bomb) < 400_000
    with pytest.raises(ptfile.PtError, match="inflates"):
        ptfile.read_pt(io.BytesIO(bomb))


# ---- 10. chunk coverage: exact, whatever the number of chunks -------------------------------------------
def test_coverage_verdict_matches_brute_force():
    import itertools
    import math
    import random
    from ckptdoctor.layouts.coverage import problems
    rng = random.Random(3)

    def brute(size, chunks):
        cnt = {}
        for off, sz in chunks:
            for cell in itertools.product(*[range(o, o + s) for o, s in zip(off, sz)]):
                cnt[cell] = cnt.get(cell, 0) + 1
        return len(cnt) == math.prod(size) and all(v == 1 for v in cnt.values())
    for _ in range(3000):
        nd = rng.randint(1, 3)
        size = tuple(rng.randint(1, 4) for _ in range(nd))
        chunks = []
        for _ in range(rng.randint(1, 6)):
            off = tuple(rng.randint(0, g - 1) for g in size)
            chunks.append((off, tuple(rng.randint(1, g - o) for g, o in zip(size, off))))
        if rng.random() < 0.5:  # an exact grid, sometimes
            cuts = [sorted({0, g, rng.randint(0, g)}) for g in size]
            chunks = [(tuple(c[i] for c, i in zip(cuts, idx)), tuple(c[i + 1] - c[i] for c, i in zip(cuts, idx)))
                      for idx in itertools.product(*[range(len(c) - 1) for c in cuts])]
            chunks = [ch for ch in chunks if all(ch[1])]
        assert (problems(size, chunks) == []) == brute(size, chunks), (size, chunks)


def test_coverage_names_the_faults_among_many_chunks():
    from ckptdoctor.layouts.coverage import problems
    cols = [((0, i), (4, 1)) for i in range(8000)]
    assert problems((4, 8000), cols) == []
    msgs = " ".join(m for m, _ in problems((4, 8000), cols[:-1]))
    assert "hole at offsets [0, 7999]" in msgs
    msgs = " ".join(m for m, _ in problems((4, 8000), cols + [cols[5]]))
    assert "overlap" in msgs


# ---- 12/16. counts are checked before anything is expanded --------------------------------------------------
@pytest.mark.parametrize("args, words", [
    (["--nodelist", "n[1-99999,1-99999,1-99999]", "--ranks-per-node", "2"], "more than 100000 hosts"),
    (["--nodelist", "n[1-2]", "--ranks-per-node", "999999999999"], "need 1 to 65536"),
    (["--nodelist", "n[1-2]", "--ranks-per-node", "8(x9999999999)"], "more than 100000 nodes"),
    (["--nodelist", "n[1-2]", "--ranks-per-node", "0"], "need 1 to 65536"),
])
def test_allocation_bounds_are_usage_errors(tmp_path, args, words):
    rc, out, err, rss = _measured("preflight", str(tmp_path), *args, timeout=30)
    assert rc == 2 and words in err and len(err.splitlines()) == 1, err
    assert rss < 200, rss


@pytest.mark.parametrize("doc, words", [
    ({"version": 1, "target": "x", "findings": [], "facts": {"slice": {"k": 5, "n": 0}}}, "not a valid K/N"),
    ({"version": 1, "target": "x", "findings": [], "facts": {"slice": {"k": "0", "n": 1}}}, "not a `verify --slice"),
    ({"version": 1, "target": "x", "findings": [{"rule": "CKD999"}], "facts": {"slice": {"k": 0, "n": 1}}},
     "not ckptdoctor findings"),
    ([1, 2], "not a `verify --slice"),
])
def test_forged_slice_reports_are_refused(tmp_path, doc, words):
    p = tmp_path / "r.json"
    p.write_text(json.dumps(doc))
    rc, out, err = run_cli("merge", str(p))
    assert rc == 2 and words in err and "Traceback" not in err, err


# ---- 15. preflight checks that what a rank needs can be read ---------------------------------------------
def test_preflight_unreadable_shard_is_an_error(tmp_path):
    from helpers import spread
    src = iter_dir(tmp_path / "src" / "iter_0000100")
    loc = spread(src, tmp_path / "nodes", ["n1", "n2"], 1)
    os.chmod(tmp_path, 0o755)
    shard = tmp_path / "nodes" / "n2" / "run7" / "iter_0000100" / "__1_0.distcp"
    os.chmod(shard, 0)
    p = subprocess.run(as_unprivileged() + [sys.executable, "-m", "ckptdoctor", "preflight", loc, "--nodelist",
                                            "n[1-2]", "--ranks-per-node", "1", "-f", "json"],
                       capture_output=True, text=True, timeout=60)
    hits = [f for f in json.loads(p.stdout)["findings"] if f["rule"] == "CKD401"]
    assert p.returncode == 1 and hits and hits[0]["details"]["unreadable"] == ["__1_0.distcp"], p.stdout
    assert hits[0]["details"]["node"] == "n2" and "unreadable" in hits[0]["message"]


# ---- 17. bad input is a finding or exit 2, never exit 3 ------------------------------------------------------
def test_unreadable_metadata_and_tracker_are_findings_with_json(tmp_path):
    root = tmp_path / "run"
    d = iter_dir(root / "iter_0000100")
    (root / TRACKER).write_text("100")
    os.chmod(tmp_path, 0o755)
    os.chmod(d / ".metadata", 0)
    os.chmod(root / TRACKER, 0)
    p = subprocess.run(as_unprivileged() + [sys.executable, "-m", "ckptdoctor", "verify", "-f", "json", str(root)],
                       capture_output=True, text=True, timeout=60)
    doc = json.loads(p.stdout)
    rules = {f["rule"] for f in doc["findings"]}
    assert p.returncode == 1 and {"CKD110", "CKD112"} <= rules, (p.stderr, doc["findings"])


def test_absurd_safetensors_shape_is_a_finding(tmp_path):
    import struct
    d = tmp_path / "st"
    d.mkdir()
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [int("9" * 4000)], "data_offsets": [0, 4]}}).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(hdr)) + hdr + b"\0" * 4)
    rc, out, err = run_cli("verify", "-f", "json", str(d))
    hits = [f for f in json.loads(out)["findings"] if f["rule"] == "CKD120"]
    assert rc == 1 and hits and "2^63" in hits[0]["message"], (err, out)


def test_deeply_nested_metadata_is_a_finding(tmp_path):
    d = iter_dir(tmp_path / "iter_0000100")
    (d / ".metadata").write_bytes(b"\x80\x02)" + b"\x85" * 200_000 + b".")
    rc, out, err = run_cli("verify", "-f", "json", str(d))
    assert rc == 1 and "CKD110" in {f["rule"] for f in json.loads(out)["findings"]}, err


def test_deep_source_tree_is_one_line_exit_2(tmp_path):
    src = iter_dir(tmp_path / "src" / "iter_0000100")
    deep = src
    for _ in range(100):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "f").write_bytes(b"x")
    rc, out, err = run_cli("publish", "-q", str(src), str(tmp_path / "dest"))
    assert rc == 2 and "deeper than 64 levels" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "dest" / "iter_0000100").exists()


def test_non_ascii_digits_in_the_destination_tracker(tmp_path):
    src = iter_dir(tmp_path / "src" / "iter_0000200", 200)
    dest = tmp_path / "dest"
    iter_dir(dest / "iter_0000100")
    (dest / TRACKER).write_text("١٠٠")  # Arabic-Indic 100: Megatron's int() reads it, our names do not
    rc, out, err = run_cli("publish", "-q", str(src), str(dest), "-f", "json")
    assert rc == 0 and (dest / TRACKER).read_text() == "200", err


def test_report_to_a_full_disk_is_one_line_exit_2(tmp_path):
    d = iter_dir(tmp_path / "iter_0000100")
    p = subprocess.run(f"{sys.executable} -m ckptdoctor verify {d} > /dev/full", shell=True, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "standard output" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_path_with_a_newline_gives_a_one_line_error(tmp_path):
    rc, out, err = run_cli("verify", str(tmp_path / "no\nsuch"))
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "no\\nsuch" in err, err


def test_reconcile_fix_never_loses_a_concurrent_write(tmp_path, monkeypatch):
    from ckptdoctor.commands import reconcile as flow
    from ckptdoctor.engine.errors import UsageError
    doc = {"schema": "ckptdoctor.run_state/v1",
           "config": {"num_prompts_per_step": 4, "group_size": 8, "sampler": "in_order", "max_lookahead_versions": 1},
           "trainer": {"step": 7, "version": 7, "epoch": 0}, "sampler": {"cursor": 6, "cursor_source": "saved"},
           "dataloader": {"batches_total": 8},
           "buffer": {"groups": [{"target_step": 7, "status": "ready", "size": 8, "start_version": 6}] * 4}}
    p = tmp_path / "state.json"
    p.write_text(json.dumps(doc))
    view = flow.load(str(p), None, [])
    assert view.plan.safe
    from ckptdoctor.io import atomic
    real = atomic._commit_via_temp

    def racing(path, data, temp_name, commit):  # another writer lands between our read and our rename
        p.write_text(json.dumps(dict(doc, note="written concurrently")))
        return real(path, data, temp_name, commit)
    monkeypatch.setattr(atomic, "_commit_via_temp", racing)
    with pytest.raises(UsageError, match="changed while being repaired"):
        flow.fix(view)
    assert json.loads(p.read_text())["note"] == "written concurrently"


def test_enospc_on_the_directory_fsync_after_the_rename_says_it_landed(tmp_path, monkeypatch):
    import errno
    from ckptdoctor.engine.errors import InputError
    from ckptdoctor.publishing import flow
    src = iter_dir(tmp_path / "src" / "iter_0000100")
    dest = tmp_path / "dest"

    def full(path):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(flow, "fsync_dir", full)  # the fsync of DEST_ROOT right after the rename
    with pytest.raises(InputError) as ei:
        api.publish(str(src), str(dest))
    msg = str(ei.value)
    assert "renamed into place" in msg and "tracker was not moved" in msg and "temporary copy removed" not in msg
    assert (dest / "iter_0000100" / ".metadata").exists() and not (dest / TRACKER).exists()


def test_symlink_to_root_inside_a_checkpoint_under_checksums(tmp_path):
    d = iter_dir(tmp_path / "iter_0000100")
    from ckptdoctor.commands.manifest import write_manifest
    write_manifest(str(d), quiet=True)
    os.symlink("/", d / "root")
    rc, out, err = run_cli("verify", "--checksums", "-f", "json", str(d), timeout=60)
    doc = json.loads(out)
    hits = [f for f in doc["findings"] if f["rule"] == "CKD125"]
    assert rc == 0 and hits and "outside the checkpoint" in hits[0]["message"], (err, doc["findings"])


def test_progress_says_elapsed_and_eta_in_one_unit(capsys):
    from ckptdoctor.report.progress import Progress
    p = Progress(3 << 30, "hashing x", every=0)
    p.tty = False
    p.t0 -= 10
    p(1 << 30)
    line = capsys.readouterr().err.strip()
    assert line == "ckptdoctor: hashing x: 1.00/3.00 GiB (33%), 102 MiB/s, 10 s elapsed, about 20 s left", line


# ---- issue 38: no exit 3 from any input ----------------------------------------------------------
@pytest.mark.parametrize("args", [["verify"], ["verify", "--checksums"], ["verify", "--deep"], ["verify", "--fix"],
                                  ["prune", "--keep-last", "1"], ["manifest"], ["reconcile"]])
def test_a_symlink_loop_is_an_input_error_naming_the_path(tmp_path, args):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    rc, out, err = cli(*args, str(tmp_path / "a"))
    assert rc == 2 and "Traceback" not in err and str(tmp_path / "a") in err and len(err.splitlines()) == 1, err


def test_publish_from_a_symlink_loop_is_an_input_error(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "dst").mkdir()
    rc, out, err = cli("publish", str(tmp_path / "a"), str(tmp_path / "dst"))
    assert rc == 2 and "Traceback" not in err, err


def test_sarif_escapes_a_path_that_is_not_utf8(tmp_path):
    from ckptdoctor.layouts import dcp_writer
    d = os.fsdecode(os.path.join(os.fsencode(str(tmp_path)), b"run\xff"))
    dcp_writer.write(str(tmp_path / "run"), [dcp_writer.Item("w", (2,), offsets=(0,), sizes=(2,))])
    os.rename(tmp_path / "run", d)   # then named with a byte that is not UTF-8
    os.truncate(os.path.join(d, "__0_0.distcp"), 10)
    for fmt in ("sarif", "json"):
        rc, out, err = cli("verify", "-f", fmt, d)
        assert rc == 1 and "Traceback" not in err, (fmt, err)
        assert "%FF" in out or "\\udcff" in out, fmt   # the byte is escaped, not lost


@pytest.mark.parametrize("bad", ["nan", "-1", "0", "inf"])
def test_publish_part_timeout_must_be_finite_and_positive(tmp_path, bad):
    rc, out, err = cli("publish", "--part", "0/2", "--publish-id", "x", "--timeout", bad, str(tmp_path), str(tmp_path))
    assert rc == 2 and "--timeout" in err, err


def test_part_numbers_are_ascii_digits(tmp_path):
    rc, out, err = cli("publish", "--part", "\u0660/\u0662", "--publish-id", "x", str(tmp_path), str(tmp_path))
    assert rc == 2 and "expected K/N" in err, err


def test_ctrl_c_at_any_moment_is_one_line_and_130(monkeypatch, capsys):
    """While the modules load (no command handler exists yet), in a command, or after the verdict."""
    import ckptdoctor.__main__ as entry
    import ckptdoctor.cli as cli_mod

    def boom(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli_mod, "main", boom)
    monkeypatch.setattr(sys, "argv", ["ckptdoctor", "verify", "x"])
    import signal
    old = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as exc:
            entry.run()
    finally:
        signal.signal(signal.SIGINT, old)
    assert exc.value.code == 130 and capsys.readouterr().err == "ckptdoctor: interrupted\n"


def test_sigint_while_ckptdoctor_loads_is_130_without_a_traceback(tmp_path):
    """The interrupt is sent once the interpreter reports (-X importtime) that it imports ckptdoctor's
    command modules (the entry point's first lines have run): from then on, wherever it lands, the
    process says one line and ends with 130 (or, when the command already finished, with its
    verdict).  Before that first line nothing of ckptdoctor runs that could handle it."""
    import signal
    p = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "ckptdoctor", "verify", str(tmp_path)],
                         stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=terminal_sigint)
    seen = []
    for line in p.stderr:
        seen.append(line)
        if "ckptdoctor." in line:
            p.send_signal(signal.SIGINT)
            break
    out, err = p.communicate(timeout=60)
    err = "".join(seen) + err
    assert "Traceback" not in err, err
    assert p.returncode in (130, 2), p.returncode
