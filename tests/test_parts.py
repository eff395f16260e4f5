"""publish --part K/N: one checkpoint assembled from N nodes' local disks (separate directories
stand for the nodes' NVMe), run as N concurrent real CLI processes; SIGKILL at phases and at random
moments; conflicting copies; timeouts; a real S3-compatible server; real torch dcp.load of what
was committed (and of what was refused)."""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import cli, spread, terminal_sigint
from test_publish import TRACKER, megatron_iter, tracker_of, verify_json

pytestmark = pytest.mark.slow

NAME = "iter_0000100"


def nodes_of(tmp_path, n_nodes: int, ranks: int = 4, mb: float = 0.2, step: int = 100):
    """A Megatron torch_dist iteration of `ranks` ranks spread node-locally over n_nodes: each node
    holds its ranks' shards and its own copy of .metadata, metadata.json and common.pt."""
    src = tmp_path / "full" / f"iter_{step:07d}"
    megatron_iter(src, step, mb=mb, ranks=ranks)
    torch = pytest.importorskip("torch")
    torch.save({"iteration": step, "args": {"lr": 3e-4}}, src / "common.pt")  # the same file on every node
    nodes = [f"n{i}" for i in range(n_nodes)]
    spread(src, tmp_path / "nodes", nodes, ranks // n_nodes, name=f"iter_{step:07d}", tracker=None)
    return [tmp_path / "nodes" / n / "run7" / f"iter_{step:07d}" for n in nodes], src


def start_part(src, dest, k, n, pid="job7", *extra, env=None):
    e = dict(os.environ, **(env or {}))
    e.pop("CKPTDOCTOR_CONFIG", None)
    return subprocess.Popen([sys.executable, "-m", "ckptdoctor", "publish", "--quiet", "--format", "json", str(src),
                             str(dest), "--part", f"{k}/{n}", "--publish-id", pid, *map(str, extra)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e,
                            preexec_fn=terminal_sigint)   # some tests Ctrl-C it


def finish(p, timeout=120):
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def staging(dest):
    return [e for e in os.listdir(dest) if ".ckptdoctor-parts-" in e] if os.path.isdir(dest) else []


def assert_committed(dest, src, name=NAME):
    rc, rep = verify_json(dest)
    assert rc == 0, rep["findings"]
    man = json.loads((dest / name / "ckptdoctor.manifest.json").read_text())
    assert sorted(man["files"]) == sorted(os.listdir(src))  # exactly the union of the nodes' files
    for rel in os.listdir(src):  # byte for byte what the full checkpoint holds
        assert (dest / name / rel).read_bytes() == (src / rel).read_bytes(), rel
    return man


@pytest.mark.parametrize("n_nodes", [2, 4])
def test_nodes_publish_concurrently_one_commits(tmp_path, n_nodes):
    parts, full = nodes_of(tmp_path, n_nodes)
    dest = tmp_path / "lustre" / "run7"
    procs = [start_part(parts[k], dest, k, n_nodes) for k in range(n_nodes)]
    results = [finish(p) for p in procs]
    assert all(rc == 0 for rc, _, _ in results), [r[2] for r in results]
    docs = [json.loads(out)["facts"]["published"] for _, out, _ in results]
    assert sorted(d["status"] for d in docs) == ["committed"] + ["part-done"] * (n_nodes - 1)
    winner = next(d["part"] for d in docs if d["status"] == "committed")
    assert all(d["committer"] == winner for d in docs)
    # every shared file was placed once and compared by every other node
    assert sum(d["copied"] for d in docs) == len(os.listdir(full))
    assert sum(d["compared"] for d in docs) == 3 * (n_nodes - 1)  # .metadata, metadata.json, common.pt
    man = assert_committed(dest, full)
    assert man["publish_id"] == "job7" and man["committed_by"] == winner and len(man["parts"]) == n_nodes
    assert tracker_of(dest) == "100" and staging(dest) == []


def test_committed_checkpoint_loads_in_torch_and_a_refused_one_does_not(fixture_root, tmp_path):
    """Both directions against the real dcp.load: what the parts commit loads to the same tensors
    as the original save; the assembly refused for a missing shard is one dcp.load cannot load."""
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp
    orig = fixture_root / "dcp_4rank"
    spread(orig, tmp_path / "nodes", ["n0", "n1"], 2, name="step-10", tracker=None)
    dest = tmp_path / "dest"
    srcs = [tmp_path / "nodes" / n / "run7" / "step-10" for n in ("n0", "n1")]
    res = [finish(p) for p in [start_part(srcs[k], dest, k, 2) for k in range(2)]]
    assert all(rc == 0 for rc, _, _ in res), [r[2] for r in res]
    md = dcp.FileSystemReader(str(orig)).read_metadata()
    want = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in md.state_dict_metadata.items()
            if hasattr(m, "size")}
    got = {k: torch.zeros_like(v) for k, v in want.items()}
    dcp.load(want, checkpoint_id=str(orig))
    dcp.load(got, checkpoint_id=str(dest / "step-10"))
    assert want and all(torch.equal(want[k], got[k]) for k in want)
    # n1 lost rank 3's shard: nothing is committed, and the assembled tree is indeed unloadable
    os.unlink(srcs[1] / "__3_0.distcp")
    dest2 = tmp_path / "dest2"
    res = [finish(p) for p in [start_part(srcs[k], dest2, k, 2, "job8") for k in range(2)]]
    assert [rc for rc, _, _ in res] == [1, 1], res
    assert any("CKD103" in err and "__3_0.distcp" in out + err for _, out, err in res), res
    assert not (dest2 / "step-10").exists()
    assembled = dest2 / ".step-10.ckptdoctor-parts-job8" / "step-10"
    with pytest.raises(BaseException) as ei:  # torch's CheckpointException derives from BaseException
        dcp.load({k: torch.zeros_like(v) for k, v in want.items()}, checkpoint_id=str(assembled))
    assert "__3_0.distcp" in str(ei.value)


def test_conflicting_metadata_on_two_nodes_names_both(tmp_path):
    parts, full = nodes_of(tmp_path, 2)
    dest = tmp_path / "dest"
    prev = megatron_iter(tmp_path / "prev" / "iter_0000050", 50)
    assert cli("publish", "--quiet", prev, dest)[0] == 0
    md = parts[1] / ".metadata"
    md.write_bytes(md.read_bytes()[:-1] + bytes([md.read_bytes()[-1] ^ 1]))  # a different save's .metadata
    res = [finish(p) for p in [start_part(parts[k], dest, k, 2) for k in range(2)]]
    assert [rc for rc, _, _ in res] == [1, 1], res
    for _, out, err in res:
        assert ".metadata" in err and "part 0" in err and "part 1" in err and "nothing committed" in err, err
    assert not (dest / NAME).exists() and tracker_of(dest) == "50"
    assert verify_json(dest)[0] == 0  # the previous checkpoint is intact and still the resume target


def _stale_copy(src, dst) -> None:
    """dst: src's size, other bytes (a dead earlier run's copy of the file)."""
    stale = bytearray(src.read_bytes())
    stale[len(stale) // 2] ^= 0xFF
    dst.write_bytes(bytes(stale))


def test_a_stale_file_left_in_staging_by_a_dead_run_is_never_committed(tmp_path):
    """A dead earlier run placed common.pt (then the node saved again): the re-run finds a copy in
    place that is not its own and not in any journal; it compares instead of trusting it."""
    parts, full = nodes_of(tmp_path, 2)
    dest = tmp_path / "dest"
    tree = dest / ".iter_0000100.ckptdoctor-parts-job5" / NAME
    tree.mkdir(parents=True)
    _stale_copy(full / "common.pt", tree / "common.pt")
    res = [finish(p) for p in [start_part(parts[k], dest, k, 2, "job5") for k in range(2)]]
    assert [r[0] for r in res] == [1, 1], res
    assert all("common.pt" in r[2] and "different bytes" in r[2] for r in res), res
    assert not (dest / NAME).exists()


def _phase_log(path):
    return [l.split()[0] for l in open(path)] if os.path.exists(path) else []


@pytest.mark.parametrize("phase", ["copy", "part-record", "manifest", "rename"])
def test_sigkill_of_the_completing_part_then_rerun(tmp_path, phase):
    parts, full = nodes_of(tmp_path, 2)
    dest = tmp_path / "dest"
    prev = megatron_iter(tmp_path / "prev" / "iter_0000050", 50)
    assert cli("publish", "--quiet", prev, dest)[0] == 0
    first = start_part(parts[0], dest, 0, 2, "job7", "--timeout", "60")
    st = dest / ".iter_0000100.ckptdoctor-parts-job7" / "parts" / "0.json"
    t_end = time.monotonic() + 30
    while not st.exists() and time.monotonic() < t_end:
        time.sleep(0.05)
    assert st.exists()
    rc, out, err = finish(start_part(parts[1], dest, 1, 2, "job7", env={"CKPTDOCTOR_TEST_KILL_AT": phase}))
    assert rc == -signal.SIGKILL
    if phase != "rename":  # after the rename the waiting part 0 may already have finished the after-commit
        assert tracker_of(dest) == "50"  # never moved by a part that died
    if (dest / NAME).exists():  # killed after the rename: complete and verifiable, tracker not yet moved
        assert phase == "rename"
        assert_committed(dest, full)
    if phase == "part-record":
        rc0, out0, err0 = finish(first)  # part 1's record is in: part 0 completes the set and commits
        assert rc0 == 0 and json.loads(out0)["facts"]["published"]["status"] == "committed", err0
        assert_committed(dest, full) and tracker_of(dest) == "100"
    rc, out, err = finish(start_part(parts[1], dest, 1, 2, "job7"))
    assert rc == 0, err
    done = json.loads(out)["facts"]["published"]
    if phase == "copy":
        assert done["resumed"] + done["copied"] + done["compared"] == len(os.listdir(parts[1]))
    rc0, out0, err0 = finish(first) if first.returncode is None else (0, None, None)
    assert rc0 == 0, err0
    assert_committed(dest, full)
    assert tracker_of(dest) == "100" and staging(dest) == []


def test_a_waiting_part_that_takes_over_a_committer_dead_after_its_rename_finishes_its_after_commit(tmp_path):
    """Part 0 saw no committed checkpoint, then the committer renamed it into place and died before
    its tracker; part 0's election finds the dead claim and takes it over.  It must see the rename
    landed and finish the after-commit (exit 0, tracker moved), not commit again from a tree that is
    no longer there (seen in CI: exit 2 on ENOENT).  The window is held open, not timed: part 0 waits
    just before its election until part 1 has died after its rename."""
    parts, full = nodes_of(tmp_path, 2)
    dest = tmp_path / "dest"
    prev = megatron_iter(tmp_path / "prev" / "iter_0000050", 50)
    assert cli("publish", "--quiet", prev, dest)[0] == 0
    go, go1, log0 = tmp_path / "go", tmp_path / "go1", tmp_path / "phases0"
    first = start_part(parts[0], dest, 0, 2, "job7", "--timeout", "120",
                       env={"CKPTDOCTOR_TEST_HOLD_AT": f"elect:{go}", "CKPTDOCTOR_TEST_PHASE_LOG": str(log0)})
    second = start_part(parts[1], dest, 1, 2, "job7",
                        env={"CKPTDOCTOR_TEST_KILL_AT": "rename", "CKPTDOCTOR_TEST_HOLD_AT": f"elect:{go1}"})
    t_end = time.monotonic() + 60
    while "elect" not in _phase_log(log0) and time.monotonic() < t_end:   # both records in, part 0 held
        time.sleep(0.05)
    assert "elect" in _phase_log(log0) and first.poll() is None
    go1.touch()                                  # part 1 elects (part 0 cannot), commits, dies after its rename
    rc, out, err = finish(second)
    assert rc == -signal.SIGKILL, err
    assert_committed(dest, full) and tracker_of(dest) == "50"   # renamed into place, tracker not yet moved
    assert first.poll() is None                                 # part 0 is held before its election
    go.touch()
    rc0, out0, err0 = finish(first)
    assert rc0 == 0, err0
    done = json.loads(out0)["facts"]["published"]
    assert done["status"] == "part-done" and done["committer"] == 1, done
    assert "part 1 ended before its after-commit" in " ".join(done["notes"]), done
    assert tracker_of(dest) == "100" and staging(dest) == []
    assert_committed(dest, full)


def test_sigkill_at_random_moments_never_commits_half(tmp_path):
    """A bigger part killed at random times: at every moment the destination shows the previous
    tracker target intact and no iter_0000100 unless it is complete; re-running commits."""
    parts, full = nodes_of(tmp_path, 2, mb=24)
    dest = tmp_path / "dest"
    prev = megatron_iter(tmp_path / "prev" / "iter_0000050", 50)
    assert cli("publish", "--quiet", prev, dest)[0] == 0
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    first = start_part(parts[0], dest, 0, 2, "job9", "--timeout", "120", "--workers", "1")
    for attempt in range(3):
        log = tmp_path / f"phases{attempt}"
        p = start_part(parts[1], dest, 1, 2, "job9", "--workers", "1",
                       env={"CKPTDOCTOR_TEST_PHASE_LOG": str(log), "CKPTDOCTOR_TEST_PAUSE_AT": "copy:0.3"})
        time.sleep(rnd.uniform(0.05, 1.2))
        p.send_signal(signal.SIGKILL)
        p.communicate()
        # part 0 may commit at any moment now: read in the order opposite to the commit's (the
        # tracker, then the directory it would name), so what is seen is one moment
        tracker = tracker_of(dest)
        assert tracker in ("50", "100"), seed
        if (dest / NAME).exists():
            assert_committed(dest, full)
        else:
            assert tracker == "50", seed
            rc, rep = verify_json(dest)  # which may itself overlap the commit
            assert rc == 0, (seed, rep["findings"])
    rc, out, err = finish(start_part(parts[1], dest, 1, 2, "job9"))
    assert rc == 0, (seed, err)
    assert finish(first)[0] == 0
    assert_committed(dest, full)
    assert tracker_of(dest) == "100" and staging(dest) == []


def test_timeout_commits_nothing_and_a_rerun_resumes(tmp_path):
    parts, full = nodes_of(tmp_path, 2)
    dest = tmp_path / "dest"
    rc, out, err = finish(start_part(parts[0], dest, 0, 2, "job3", "--timeout", "1"))
    assert rc == 75, err
    assert "parts 1 never arrived" in err and "nothing committed" in err
    assert not (dest / NAME).exists() and tracker_of(dest) is None
    rc, out, err = cli("verify", "--format", "json", dest)  # a fresh staging is not yet a leftover
    assert "CKD202" not in out
    # part 0's record stands: part 1 alone completes the set and commits
    rc, out, err = finish(start_part(parts[1], dest, 1, 2, "job3"))
    assert rc == 0 and json.loads(out)["facts"]["published"]["status"] == "committed", err
    assert_committed(dest, full)
    # a part arriving after the commit exits 0 and copies nothing
    rc, out, err = finish(start_part(parts[1], dest, 1, 2, "job3"))
    assert rc == 0 and json.loads(out)["facts"]["published"]["status"] == "already-committed"
    # another publish id of the same name refuses to overwrite
    rc, out, err = finish(start_part(parts[1], dest, 1, 2, "job4"))
    assert rc == 73 and "refusing to overwrite" in err


def test_a_part_killed_mid_copy_resumes_from_its_journal(tmp_path):
    """Part 0 dies after its first file is placed (no record yet, so nothing can commit); its re-run
    finds that file in its journal and does not copy it again."""
    parts, full = nodes_of(tmp_path, 2)
    dest = tmp_path / "dest"
    rc, out, err = finish(start_part(parts[0], dest, 0, 2, "job6", "--workers", "1",
                                     env={"CKPTDOCTOR_TEST_KILL_AT": "copy"}))
    assert rc == -signal.SIGKILL
    p0 = start_part(parts[0], dest, 0, 2, "job6")
    p1 = start_part(parts[1], dest, 1, 2, "job6")
    r0, r1 = finish(p0), finish(p1)
    assert r0[0] == 0 and r1[0] == 0, (r0[2], r1[2])
    d0 = json.loads(r0[1])["facts"]["published"]
    assert d0["resumed"] >= 1, d0
    assert d0["resumed"] + d0["copied"] + d0["compared"] == len(os.listdir(parts[0]))
    assert_committed(dest, full)


def test_stale_staging_of_a_dead_publish_is_reported_and_cleaned(tmp_path):
    parts, full = nodes_of(tmp_path, 2)
    dest = tmp_path / "dest"
    assert cli("publish", "--quiet", megatron_iter(tmp_path / "prev" / "iter_0000050", 50), dest)[0] == 0
    assert finish(start_part(parts[0], dest, 0, 2, "dead1", "--timeout", "0.5"))[0] == 75
    old = time.time() - 3600
    stage = dest / ".iter_0000100.ckptdoctor-parts-dead1"
    for root, dirs, files in os.walk(stage):
        for f in dirs + files:
            os.utime(os.path.join(root, f), (old, old))
    rc, out, err = cli("verify", "--format", "json", dest)
    hits = [f for f in json.loads(out)["findings"] if f["rule"] == "CKD202"]
    assert hits and hits[0]["details"]["publish_id"] == "dead1"
    res = [finish(p) for p in [start_part(parts[k], dest, k, 2, "live2") for k in range(2)]]
    assert all(r[0] == 0 for r in res), res
    assert not stage.exists() and staging(dest) == []
    assert_committed(dest, full)


def test_part_usage_errors(tmp_path):
    parts, _ = nodes_of(tmp_path, 2)
    for args, msg in ((["--part", "2/2", "--publish-id", "x"], "0..N-1"), (["--part", "0/2"], "--publish-id"),
                      (["--part", "a/b", "--publish-id", "x"], "K/N"), (["--publish-id", "x"], "--part"),
                      (["--part", "0/2", "--publish-id", "../x"], "--publish-id"),
                      (["--part", "0/2", "--publish-id", "x", "--replace"], "--replace")):
        rc, out, err = cli("publish", str(parts[0]), str(tmp_path / "d"), *args)
        assert rc == 2 and msg in err and "Traceback" not in err, (args, err)


def test_sigterm_mid_copy_of_a_part_stops_at_once(tmp_path):
    src = tmp_path / "n0" / NAME
    src.mkdir(parents=True)
    with open(src / "__0_0.distcp", "wb") as fh:
        fh.truncate(3 << 30)  # sparse: reads fast from the page cache, copies for many seconds
    dest = tmp_path / "dest"
    for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        p = start_part(src, dest, 0, 2, f"sig{code}", "--workers", "1")
        stage = dest / f".{NAME}.ckptdoctor-parts-sig{code}" / "tmp"
        t_end = time.monotonic() + 30
        while time.monotonic() < t_end and not (stage.exists() and os.listdir(stage)):
            time.sleep(0.05)
        time.sleep(0.3)
        t0 = time.monotonic()
        p.send_signal(sig)
        rc, out, err = finish(p, timeout=30)
        assert rc == code and time.monotonic() - t0 < 1.5, (rc, err)
        assert "nothing published" in err and "Traceback" not in err
        assert os.listdir(stage) == []  # this part's copy in flight is removed
        assert not (dest / NAME).exists()


# ---- object stores (a real S3-compatible server on loopback) --------------------------------------
def test_parts_to_s3_commit_marker_last(tmp_path, s3):
    env, fs, bucket = s3
    parts, full = nodes_of(tmp_path, 2)
    url = f"s3://{bucket}/run"
    rc0, _, err0 = finish(start_part(parts[0], url, 0, 2, "s3job", "--timeout", "0.5", env=env))
    assert rc0 == 75, err0  # part 1 not there yet: nothing committed
    # part 1 completes the set, commits, and dies after the data and the framework markers went up,
    # before the manifest: the prefix is visibly uncommitted
    rc, out, err = finish(start_part(parts[1], url, 1, 2, "s3job", env=env | {"CKPTDOCTOR_TEST_KILL_AT": "upload"}))
    assert rc == -signal.SIGKILL
    assert not fs.exists(f"{bucket}/run/{NAME}/ckptdoctor.manifest.json")
    assert not fs.exists(f"{bucket}/run/{TRACKER}")
    r = cli("verify", "--format", "json", f"{url}/{NAME}", env=env)
    assert r[0] == 1 and "CKD201" in r[1]
    # re-run: the dead committer (this host, pid gone) is taken over; a late part exits 0
    rc, out, err = finish(start_part(parts[1], url, 1, 2, "s3job", env=env))
    assert rc == 0 and json.loads(out)["facts"]["published"]["status"] == "committed", err
    rc0, out0, err0 = finish(start_part(parts[0], url, 0, 2, "s3job", env=env))
    assert rc0 == 0 and json.loads(out0)["facts"]["published"]["status"] == "already-committed", err0
    assert fs.cat_file(f"{bucket}/run/{TRACKER}") == b"100"
    assert not fs.exists(f"{bucket}/run/{NAME}/.ckptdoctor-publishing")
    rc, out, err = cli("verify", "--checksums", "--format", "json", url, env=env)
    assert rc == 0, json.loads(out)["findings"]
    for rel in os.listdir(full):
        assert fs.cat_file(f"{bucket}/run/{NAME}/{rel}") == (full / rel).read_bytes(), rel
    assert not fs.exists(f"{bucket}/run/.{NAME}.ckptdoctor-parts-s3job")
    # concurrently, into a second prefix
    res = [finish(p) for p in [start_part(parts[k], f"{url}2", k, 2, "s3b", env=env) for k in range(2)]]
    assert all(r[0] == 0 for r in res), res
    assert cli("verify", "--checksums", f"{url}2", env=env)[0] == 0


def test_parts_to_s3_racing_uploads_of_different_bytes_are_refused(tmp_path, s3):
    """Both nodes find no common.pt object and both upload theirs (paused between the check and the
    upload): no node compared, so only the records disagree -- and that refuses the commit."""
    env, fs, bucket = s3
    parts, full = nodes_of(tmp_path, 2)
    import torch
    torch.save({"iteration": 100, "args": {"lr": 1e-3}}, parts[1] / "common.pt")  # node 1 saved other args
    url = f"s3://{bucket}/run"
    slow = env | {"CKPTDOCTOR_TEST_PAUSE_AT": "put:1.5"}  # wider than the two start-ups differ
    res = [finish(p) for p in [start_part(parts[k], url, k, 2, "race", "--timeout", "60", "--workers", "8",
                                          env=slow) for k in range(2)]]
    assert [r[0] for r in res] == [1, 1], res
    assert all("common.pt" in r[2] and "part 0" in r[2] and "part 1" in r[2] for r in res), res
    assert not fs.exists(f"{bucket}/run/{NAME}/ckptdoctor.manifest.json")


def test_parts_to_s3_conflict_names_both(tmp_path, s3):
    env, fs, bucket = s3
    parts, full = nodes_of(tmp_path, 2)
    (parts[1] / "metadata.json").write_text('{"sharded_backend": "zarr"}')
    url = f"s3://{bucket}/run"
    res = [finish(p) for p in [start_part(parts[k], url, k, 2, "c1", "--timeout", "60", env=env) for k in range(2)]]
    assert [r[0] for r in res] == [1, 1], res
    assert all("metadata.json" in r[2] and "part 0" in r[2] and "part 1" in r[2] for r in res), res
    assert not fs.exists(f"{bucket}/run/{NAME}/ckptdoctor.manifest.json")
    assert not fs.exists(f"{bucket}/run/{TRACKER}")


# ---- inside the job: torch.distributed over gloo ---------------------------------------------------
def _parts_job(out, mode):
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "fixtures", "parts_job.py"),
                        str(out), mode], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return [json.loads((out / f"result.{r}.json").read_text()) for r in range(4)]


def test_publish_distributed_over_gloo_commits_and_the_job_loads_it(tmp_path):
    pytest.importorskip("torch")
    res = _parts_job(tmp_path, "ok")
    assert [r["status"] for r in res] == ["committed", "not-a-copier", "part-done", "not-a-copier"]
    assert {r["committer"] for r in res} == {0} and [r["part"] for r in res] == [0, 0, 1, 1]
    assert all(r["loaded_equal"] for r in res)  # the real multi-rank dcp.load of the published checkpoint
    dest = tmp_path / "lustre" / "run7"
    assert tracker_of(dest) == "100" and staging(dest) == []
    rc, rep = verify_json(dest)
    assert rc == 0, rep["findings"]
    names = sorted(os.listdir(dest / NAME))
    assert names == sorted({*os.listdir(tmp_path / "nvme" / "n0" / NAME), *os.listdir(tmp_path / "nvme" / "n1" / NAME),
                            "ckptdoctor.manifest.json"})


def test_publish_distributed_refuses_on_every_rank_when_a_node_lost_a_shard(tmp_path):
    pytest.importorskip("torch")
    res = _parts_job(tmp_path, "lost-shard")
    assert [r["status"] for r in res] == ["refused"] * 4
    assert all("CKD103" in r["error"] and "__3_0.distcp" in r["error"] for r in res), res[0]
    dest = tmp_path / "lustre" / "run7"
    assert not (dest / NAME).exists() and tracker_of(dest) is None


def _elect_after(barrier, root, k, out):
    from ckptdoctor.publishing import parts as P
    st = P.LocalParts(root, NAME, P.PartSpec.parse(f"{k}/4", "job5"))
    barrier.wait()
    out.put(st.elect())
    # every contender stays alive until all have decided: a winner that had already exited (a
    # zombie, which counts as dead) would rightly be taken over, which is not the race tested here
    barrier.wait()


def test_a_dead_committer_is_taken_over_by_exactly_one_part(tmp_path):
    """A committer killed on this host leaves its claim; every part that then sees it dead (a
    waiting part, a re-run of the dead one) tries to take over at the same moment.  Exactly one may
    win: two winners both committed in CI, and the later one failed on the tree the first had
    renamed away ("publish --part: [Errno 2] No such file or directory")."""
    import multiprocessing as mp
    from ckptdoctor.publishing import naming
    from ckptdoctor.publishing import parts as P
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    st = P.LocalParts(str(tmp_path), NAME, P.PartSpec.parse("1/4", "job5"))
    os.makedirs(st.dir)
    claim = json.dumps({"part": 1, "host": naming.HOST, "pid": dead.pid, "start": "1"}).encode()
    ctx = mp.get_context("fork")
    for _round in range(40):
        with open(os.path.join(st.dir, "commit"), "wb") as fh:
            fh.write(claim)
        barrier, out = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_elect_after, args=(barrier, str(tmp_path), k, out)) for k in range(4)]
        for p in procs:
            p.start()
        won = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(60)
        assert won.count(True) == 1, (_round, won)
        owner = json.loads(open(os.path.join(st.dir, "commit"), "rb").read())
        assert owner["pid"] != dead.pid and owner["host"] == naming.HOST


def test_the_commit_never_happens_while_a_part_has_not_recorded(tmp_path):
    """Whoever calls the commit (an elected part, a take-over after a dead committer), a part
    whose record is not in is a refusal naming it, even when the parts that did record already
    hold a checkpoint that verifies: that part's files would be missing from the publish."""
    from ckptdoctor.publishing import parts as P
    parts, full = nodes_of(tmp_path, 2)
    whole = tmp_path / "whole" / NAME           # node 0 holds every file: the assembled tree verifies
    shutil.copytree(full, whole)
    dest = tmp_path / "dest"
    rc, out, err = finish(start_part(whole, dest, 0, 2, "job9", "--timeout", "1"))
    assert rc == 75 and "never arrived" in err, (rc, err)   # part 1 never came: a requeue, nothing committed
    st = P.LocalParts(str(dest), NAME, P.PartSpec.parse("0/2", "job9"))
    assert st.record_count() == {0}
    res = P.PartResult(part=0, parts=2, publish_id="job9", dest=str(dest), name=NAME)
    with pytest.raises(P.PartRefused, match=r"no record from parts \[1\]"):
        P.commit_all(st, res, lambda tree: ("megatron", []), lambda *a: None, None, None, None)
    assert not (dest / NAME).exists() and tracker_of(dest) is None


def test_a_file_in_staging_that_no_part_recorded_is_never_published(tmp_path):
    """A dead earlier attempt (say, with more ranks) left a file in staging under a name no part of
    this publish holds: publishing it would add a file the save never wrote.  The commit refuses,
    naming it, and nothing lands."""
    parts, full = nodes_of(tmp_path, 2)
    dest = tmp_path / "dest"
    tree = dest / ".iter_0000100.ckptdoctor-parts-job6" / NAME
    tree.mkdir(parents=True)
    (tree / "__9_0.distcp").write_bytes(b"left by a dead attempt")
    res = [finish(p) for p in [start_part(parts[k], dest, k, 2, "job6") for k in range(2)]]
    assert sorted(r[0] for r in res) == [1, 1], res
    assert any("unrecorded __9_0.distcp" in r[2] for r in res), [r[2] for r in res]
    assert not (dest / NAME).exists() and tracker_of(dest) is None


# ---- part publish races, forced (CKPTDOCTOR_TEST_HOLD_AT holds one side at a phase until released) --
def _wait_phase(log, phase, proc, timeout=60):
    end = time.monotonic() + timeout
    while phase not in _phase_log(log):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, f"never reached {phase}"
        time.sleep(0.05)


def test_a_conflict_seen_by_a_rerun_survives_the_stalled_original_rewriting_its_record(tmp_path):
    """Part 0 is stalled after copying (its record not yet written) and presumed dead; a re-run of
    part 0 elsewhere holds other __0_0.distcp bytes.  The re-run exits 1 on the conflict; the stalled
    original, released, writes its record and exits 1; part 1, arriving last, completes the set of
    records and must still refuse: the conflict is recorded where no record rewrite can drop it."""
    parts, full = nodes_of(tmp_path, 2)
    dest = tmp_path / "dest"
    other = tmp_path / "elsewhere" / NAME
    shutil.copytree(parts[0], other)
    shard = other / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(1, 1))
    log, release = tmp_path / "phases", tmp_path / "release"
    original = start_part(parts[0], dest, 0, 2, "job3", "--timeout", "60",
                          env={"CKPTDOCTOR_TEST_PHASE_LOG": str(log), "CKPTDOCTOR_TEST_HOLD_AT": f"copied:{release}"})
    _wait_phase(log, "copied", original)
    rc, out, err = finish(start_part(other, dest, 0, 2, "job3", "--timeout", "10"))
    assert rc == 1 and "__0_0.distcp" in err and "different bytes" in err and "new --publish-id" in err, (rc, err)
    release.write_text("")
    rc, out, err = finish(original)
    assert rc == 1 and "__0_0.distcp" in err, (rc, err)
    rc, out, err = finish(start_part(parts[1], dest, 1, 2, "job3", "--timeout", "60"))
    assert rc == 1 and "__0_0.distcp" in err and "nothing committed" in err, (rc, err)
    assert not (dest / NAME).exists() and tracker_of(dest) is None


def test_a_committer_killed_after_its_rename_leaves_the_tracker_to_a_waiting_part(tmp_path):
    """Both parts would die right after the rename; exactly one commits, so one dies there and the
    other, waiting, finds the checkpoint committed under its ID with the committer gone: it writes
    the tracker and clears the staging itself, so the run's resume target moves with no re-run."""
    parts, full = nodes_of(tmp_path, 2)
    dest = tmp_path / "dest"
    prev = megatron_iter(tmp_path / "prev" / "iter_0000050", 50)
    assert cli("publish", "--quiet", prev, dest)[0] == 0
    env = {"CKPTDOCTOR_TEST_KILL_AT": "rename"}
    res = [finish(p, timeout=60) for p in [start_part(parts[k], dest, k, 2, "job4", "--timeout", "60", env=env)
                                           for k in range(2)]]
    assert sorted(r[0] for r in res) == [-signal.SIGKILL, 0], res
    survivor = next(json.loads(out)["facts"]["published"] for rc, out, _ in res if rc == 0)
    assert survivor["status"] == "part-done"
    assert_committed(dest, full)
    assert tracker_of(dest) == "100" and staging(dest) == []


def test_a_waiting_part_exits_73_when_another_publish_id_commits_the_name(tmp_path):
    """job4's part 0 waits for a part 1 that never comes; job5 publishes the same name whole.
    job4 can never commit now: its part exits 73 (documented: do not requeue), not 75."""
    parts, full = nodes_of(tmp_path, 2)
    dest = tmp_path / "dest"
    log = tmp_path / "phases"
    waiting = start_part(parts[0], dest, 0, 2, "job4", "--timeout", "120", env={"CKPTDOCTOR_TEST_PHASE_LOG": str(log)})
    _wait_phase(log, "part-record", waiting)
    res = [finish(p) for p in [start_part(parts[k], dest, k, 2, "job5") for k in range(2)]]
    assert [r[0] for r in res] == [0, 0], res
    rc, out, err = finish(waiting)
    assert rc == 73 and "job5" in err and "do not requeue" in err, (rc, err)
    assert json.loads((dest / NAME / "ckptdoctor.manifest.json").read_text())["publish_id"] == "job5"


def test_a_committer_that_loses_the_rename_to_another_publish_id_exits_73(tmp_path):
    """job6's committer is held after sealing, before its rename; job7 commits the name meanwhile.
    Released, job6's rename finds the name taken: it replaces nothing and both of job6's parts exit
    73; job7's checkpoint and tracker stand."""
    parts, full = nodes_of(tmp_path, 2)
    dest = tmp_path / "dest"
    logs = [tmp_path / f"phases{k}" for k in range(2)]
    release = tmp_path / "release"
    job6 = [start_part(parts[k], dest, k, 2, "job6", "--timeout", "120",
                       env={"CKPTDOCTOR_TEST_PHASE_LOG": str(logs[k]), "CKPTDOCTOR_TEST_HOLD_AT": f"manifest:{release}"})
            for k in range(2)]
    end = time.monotonic() + 60
    while not any("manifest" in _phase_log(lg) for lg in logs):
        assert time.monotonic() < end and all(p.poll() is None for p in job6)
        time.sleep(0.05)
    res = [finish(p) for p in [start_part(parts[k], dest, k, 2, "job7") for k in range(2)]]
    assert [r[0] for r in res] == [0, 0], res
    release.write_text("")
    res6 = [finish(p) for p in job6]
    assert [r[0] for r in res6] == [73, 73], res6
    man = json.loads((dest / NAME / "ckptdoctor.manifest.json").read_text())
    assert man["publish_id"] == "job7" and tracker_of(dest) == "100"
    assert_committed(dest, full)


def test_a_rerun_withdraws_its_old_record_and_unplaces_a_file_gone_from_its_source(tmp_path):
    """Part 0 timed out (its record stayed); then extra.bin was deleted from its source and part 0
    re-runs.  While the re-run reads its source, its old record is gone, so part 1 cannot commit the
    old state (it times out); released, the re-run records what the source holds now and the commit
    publishes exactly that, without extra.bin."""
    parts, full = nodes_of(tmp_path, 2)
    dest = tmp_path / "dest"
    (parts[0] / "extra.bin").write_bytes(b"x" * 1000)
    rc, out, err = finish(start_part(parts[0], dest, 0, 2, "job8", "--timeout", "1"))
    assert rc == 75, err
    os.unlink(parts[0] / "extra.bin")
    log, release = tmp_path / "phases", tmp_path / "release"
    rerun = start_part(parts[0], dest, 0, 2, "job8", "--timeout", "60",
                       env={"CKPTDOCTOR_TEST_PHASE_LOG": str(log), "CKPTDOCTOR_TEST_HOLD_AT": f"copied:{release}"})
    _wait_phase(log, "copied", rerun)
    rc, out, err = finish(start_part(parts[1], dest, 1, 2, "job8", "--timeout", "2"))
    assert rc == 75 and "never arrived" in err, (rc, err)
    assert not (dest / NAME).exists()
    release.write_text("")
    rc, out, err = finish(rerun)
    assert rc == 0 and json.loads(out)["facts"]["published"]["status"] == "committed", err
    assert not (dest / NAME / "extra.bin").exists()
    assert_committed(dest, full)


def test_a_killed_committer_that_is_not_yet_reaped_counts_as_gone():
    """A SIGKILLed process stays a zombie until its parent waits for it; to a waiting part it is
    dead (else the part would wait out --timeout for an after-commit that can never come)."""
    from ckptdoctor.publishing import naming
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = naming.start_time(p.pid)
        assert naming.pid_alive(p.pid, start)
        p.kill()
        end = time.monotonic() + 10
        while naming.start_time(p.pid) is not None and open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < end
            time.sleep(0.01)
        assert not naming.pid_alive(p.pid, start) and not naming.pid_alive(p.pid)   # a zombie, not reaped yet
    finally:
        p.wait()


def test_a_staging_touched_by_a_clock_ahead_of_ours_is_zero_seconds_old_never_negative(tmp_path):
    """A part's heartbeat written by a node whose clock runs ahead (or an NFS server's mtime) is
    "just now": age 0, never negative, so no threshold and no `age_seconds` sees a time before now;
    the age is that of the newest sign of life (heartbeat or record)."""
    from ckptdoctor.publishing.parts import staging_age
    st = tmp_path / "staging"
    for sub in ("alive", "parts"):
        (st / sub).mkdir(parents=True)
    (st / "alive" / "0").write_text("x")
    (st / "parts" / "0.json").write_text("{}")
    now = time.time()
    for p in (st / "alive" / "0", st / "parts" / "0.json", st / "alive", st / "parts"):
        os.utime(p, (now - 600, now - 600))
    assert 599 <= staging_age(str(st)) <= 700
    os.utime(st / "parts" / "0.json", (now + 0.6, now + 0.6))
    assert staging_age(str(st)) == 0.0
    assert staging_age(str(tmp_path / "absent")) is None


def test_a_conflict_names_the_part_that_placed_that_very_file(tmp_path):
    """The writer of a file is the part whose journal says it placed that file -- not the first
    part that placed any file sorting after it (part 0 placed its shards, part 1 the .metadata)."""
    from ckptdoctor.publishing import parts as P
    st = [P.LocalParts(str(tmp_path), NAME, P.PartSpec.parse(f"{k}/2", "jw")) for k in range(2)]
    os.makedirs(os.path.join(st[0].dir, "journal"))
    os.makedirs(os.path.join(st[0].dir, "alive"))
    (tmp_path / os.path.relpath(st[1].dir, tmp_path) / "alive" / "1").write_text("nodeB 123 1\n")
    rec = lambda wrote: P.FileRecord(10, ["x"], 0, wrote)  # noqa: E731
    st[0].journal_add("__0_0.distcp", rec(True))
    st[0].journal_add("zz_extra.bin", rec(True))
    st[1].journal_add(".metadata", rec(True))
    st[0].journal_add(".metadata", rec(False))      # part 0 found it in place and compared
    assert st[0].writer_of(".metadata") == "part 1 (nodeB)"
    assert st[1].writer_of("__0_0.distcp") == "part 0 (host unknown)" and st[0].writer_of("absent") is None


@pytest.mark.parametrize("schema", ["ckptdoctor.part/v0", "ckptdoctor.part/v2", "", None])
def test_a_part_record_of_any_other_schema_is_refused_older_or_newer(schema):
    """A part record is only read under the exact schema this version writes: one from an older or
    newer ckptdoctor (or with none) is refused by name, so nothing is committed from a record whose
    fields might mean something else."""
    from ckptdoctor.publishing.parts import records as R
    rec = R.PartRecord(0, 2, "pid1", NAME, "nodeA", "/src", {})
    doc = json.loads(rec.to_bytes())
    assert R.PartRecord.from_bytes(rec.to_bytes(), "p0").part == 0   # this version's own record reads
    doc["schema"] = schema
    with pytest.raises(R.PartRefused, match=r"^p0: not a readable part record \(schema .*\); nothing committed$"):
        R.PartRecord.from_bytes(json.dumps(doc).encode(), "p0")


def test_a_committer_on_another_host_is_gone_only_after_five_unchanged_heartbeats(tmp_path, monkeypatch):
    """A waiting part judges a committer on another node by its heartbeat: gone once the beat has not
    changed for five beats of this host's clock; any change of the beat (whatever it reads) starts
    the count again, so a live committer is never taken over."""
    from ckptdoctor.publishing import parts as P
    from ckptdoctor.publishing.parts import local as L
    st = P.LocalParts(str(tmp_path), NAME, P.PartSpec.parse("1/2", "hb"))
    os.makedirs(os.path.join(st.dir, "alive"))
    with open(os.path.join(st.dir, "commit"), "w") as fh:
        json.dump({"part": 0, "host": "another-node", "pid": 1, "start": 1}, fh)
    clock = [1000.0]
    monkeypatch.setattr(L.time, "monotonic", lambda: clock[0])

    def beat(text):
        with open(os.path.join(st.dir, "alive", "0"), "w") as fh:
            fh.write(text)
    beat("another-node 1 9\n")
    assert not st.committer_gone()                      # first sight of the beat
    clock[0] += 5 * L.HEARTBEAT_SECONDS                 # exactly five beats: not yet
    assert not st.committer_gone()
    beat("another-node 1 10\n")                         # it beat again (sorting before the old line)
    clock[0] += 5 * L.HEARTBEAT_SECONDS + 1
    assert not st.committer_gone()                      # the change restarted the count
    clock[0] += 5 * L.HEARTBEAT_SECONDS + 1             # then silence for more than five beats
    assert st.committer_gone()


def test_on_an_object_store_a_part_that_finds_a_live_committers_claim_does_not_commit_too():
    """The election on an object store is an exclusive create of the claim: the part that finds a
    claim of a live process (here this very process), or a claim it cannot read, loses, so two parts
    never both commit; a claim left by a dead process on this host is taken over."""
    import fsspec
    from ckptdoctor.publishing import naming
    from ckptdoctor.publishing.parts.objects import ObjectParts
    from ckptdoctor.publishing.parts.records import PartSpec
    fs = fsspec.filesystem("memory")
    root = f"/elect-{os.getpid()}-{random.Random(7).randrange(1 << 30)}"
    a, b = (ObjectParts(fs, root, NAME, PartSpec.parse(f"{k}/2", "el"), set()) for k in range(2))
    assert a.elect() is True and a.committer() == 0
    assert b.elect() is False and b.committer() == 0
    fs.pipe_file(f"{a.dir}/commit", b"{not json")   # a claim that cannot be read: never taken as a win
    assert b.elect() is False
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    fs.pipe_file(f"{a.dir}/commit", json.dumps({"part": 0, "host": naming.HOST, "pid": p.pid, "start": 1}).encode())
    assert b.elect() is True and b.committer() == 1


@pytest.mark.parametrize("size", [100, 300_000])
def test_a_nodes_file_is_refused_only_when_its_bytes_differ_from_the_save_time_manifest(tmp_path, size):
    """A node's copy is compared with the manifest written at save time by size and chunk digests:
    an unchanged file passes whatever its size (a 100-byte file too), and one byte changed in place
    (same size) is refused, naming the file, before anything is committed."""
    from ckptdoctor.publishing.copier import SourceChanged
    from ckptdoctor.publishing.parts.local import hash_file
    from ckptdoctor.publishing.parts.protocol import _check_save_time_manifest
    from ckptdoctor.publishing.parts.records import FileRecord
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "w.bin").write_bytes(random.Random(size).randbytes(size))
    rc, out, err = cli("manifest", "--force", str(src))
    assert rc == 0, err

    def recs():
        c = hash_file(str(src / "w.bin"))
        return {"w.bin": FileRecord(c.size, c.digests)}
    _check_save_time_manifest(str(src), recs())            # unchanged since the save: no refusal
    data = bytearray((src / "w.bin").read_bytes())
    data[size // 2] ^= 0xFF
    (src / "w.bin").write_bytes(bytes(data))
    with pytest.raises(SourceChanged, match=r"w\.bin: this node's bytes differ from the .* written at save time"):
        _check_save_time_manifest(str(src), recs())


def test_a_dead_committers_claim_that_cannot_be_re_read_under_the_lock_is_left_and_not_won(tmp_path, monkeypatch):
    """Taking over a dead committer's claim re-reads it under the election lock; when that read
    fails (a permission, an I/O error) the claim is left in place and this part does not commit:
    never a crash, never two committers."""
    from ckptdoctor.publishing import naming
    from ckptdoctor.publishing import parts as P
    from ckptdoctor.publishing.parts import local as L
    st = P.LocalParts(str(tmp_path), NAME, P.PartSpec.parse("1/2", "to"))
    os.makedirs(st.dir)
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    claim = json.dumps({"part": 0, "host": naming.HOST, "pid": p.pid, "start": 1})
    (Path(st.dir) / "commit").write_text(claim)
    real, calls = L.read_regular, []

    def read_regular(path, limit):
        calls.append(path)
        if len(calls) > 1:
            raise PermissionError(13, "Permission denied", path)
        return real(path, limit)
    monkeypatch.setattr(L, "read_regular", read_regular)
    assert st.elect() is False and len(calls) == 2
    assert (Path(st.dir) / "commit").read_text() == claim


def test_a_rerun_withdrawing_a_file_it_never_got_to_place_goes_on(tmp_path):
    """A part killed between its record and its copy leaves a record naming a file that is not in
    the staging tree; the re-run's withdrawal of that file (and of a record that is not there) is a
    no-op, never an error that fails the re-run."""
    from ckptdoctor.publishing import parts as P
    st = P.LocalParts(str(tmp_path), NAME, P.PartSpec.parse("0/2", "rr"))
    os.makedirs(os.path.join(st.tree, "sub"))
    os.makedirs(os.path.join(st.dir, "parts"), exist_ok=True)
    st.withdraw_record()
    st.unplace("sub/__0_0.distcp")
    st.unplace("never/made.bin")
    (Path(st.tree) / "sub" / "kept.bin").write_bytes(b"x")
    st.unplace("sub/kept.bin")
    assert not (Path(st.tree) / "sub" / "kept.bin").exists()


@pytest.mark.parametrize("store", ["object", "local"])
def test_a_waiting_part_reports_the_refusing_parts_own_words(tmp_path, store):
    """When one part refuses the commit, every other part exits with that part's message (what
    changed, on which node), on an object store as on a filesystem; only a refusal that cannot be
    read is the generic "another part refused the commit"."""
    from ckptdoctor.publishing import parts as P
    from ckptdoctor.publishing.parts.objects import ObjectParts
    if store == "object":
        import fsspec
        fs = fsspec.filesystem("memory")
        root = f"/refuse-{os.getpid()}-{random.Random(11).randrange(1 << 30)}"
        a, b = (ObjectParts(fs, root, NAME, P.PartSpec.parse(f"{k}/2", "rf"), set()) for k in range(2))
    else:
        a, b = (P.LocalParts(str(tmp_path), NAME, P.PartSpec.parse(f"{k}/2", "rf")) for k in range(2))
        os.makedirs(a.dir)
    assert b.failed() is None
    why = "nodeA:/ckpt/__0_0.distcp: this node's bytes differ from the manifest written at save time " + "x" * 3000
    a.fail(why)
    assert b.failed() == why
    for unreadable in (b'["not an object"]', b'{"no": "message"}', b"{cut"):
        if store == "object":
            fs.pipe_file(f"{a.dir}/failed.json", unreadable)
        else:
            (Path(a.dir) / "failed.json").write_bytes(unreadable)
        assert b.failed() == "another part refused the commit"


def _one_part_staged(tmp_path, files: dict[str, bytes]):
    """A one-part publish's staging holding `files`, recorded as this part's (no copy made)."""
    from ckptdoctor.publishing import parts as P
    from ckptdoctor.publishing.parts.records import FileRecord, PartRecord
    spec = P.PartSpec.parse("0/1", "cm")
    st = P.LocalParts(str(tmp_path), NAME, spec)
    os.makedirs(os.path.join(st.dir, "parts"))
    os.makedirs(st.tree, exist_ok=True)
    for rel, data in files.items():
        (Path(st.tree) / rel).write_bytes(data)
    st.write_record(PartRecord(0, 1, "cm", NAME, "nodeA", "/src",
                               {rel: FileRecord(len(d), ["x"]) for rel, d in files.items()}))
    return st, spec


def test_a_part_commit_that_fails_verification_names_its_first_four_reasons(tmp_path):
    """The assembled checkpoint is verified before the commit; when it fails, the part says why in
    one line: the first four reasons verify gave, then "nothing committed, tracker untouched"."""
    from ckptdoctor.publishing.parts import protocol as PR
    from ckptdoctor.publishing.parts.records import PartRefused
    st, spec = _one_part_staged(tmp_path, {"a.bin": b"x"})
    with pytest.raises(PartRefused) as ei:
        PR._commit(st, None, spec, NAME, lambda tree: ("megatron", [f"CKD10{i} reason {i}" for i in range(1, 7)]))
    assert str(ei.value) == (f"{NAME}: the checkpoint assembled from 1 parts fails verification: CKD101 reason 1; "
                             "CKD102 reason 2; CKD103 reason 3; CKD104 reason 4; nothing committed, tracker untouched")


def test_with_no_claim_standing_the_committer_counts_as_gone():
    """A waiting part that finds no election claim (the committer finished and removed its staging,
    or none was elected) does not wait for a committer: it is gone."""
    from ckptdoctor.publishing import parts as P
    st = P.LocalParts("/nonexistent-root", NAME, P.PartSpec.parse("1/2", "ng"))
    assert st.claim() is None and st.committer_gone() is True


def test_the_writer_of_a_file_is_found_past_a_stray_entry_in_the_journal_directory(tmp_path):
    """The journal directory can hold what is not a journal (an NFS `.nfs0000...` silly-rename file,
    an editor's backup), or a journal that cannot be read: each is skipped, and the part that placed
    the file is still named."""
    from ckptdoctor.publishing import parts as P
    from ckptdoctor.publishing.parts.records import FileRecord
    st = [P.LocalParts(str(tmp_path), NAME, P.PartSpec.parse(f"{k}/2", "wo")) for k in range(2)]
    os.makedirs(os.path.join(st[0].dir, "journal"))
    os.makedirs(os.path.join(st[0].dir, "alive"))
    (Path(st[0].dir) / "alive" / "1").write_text("nodeB 123 1\n")
    (Path(st[0].dir) / "journal" / ".nfs000000000012").write_text("not a journal\n")
    os.makedirs(Path(st[0].dir) / "journal" / "0.jsonl")          # a journal that cannot be read
    st[1].journal_add("__1_0.distcp", FileRecord(10, ["x"], 0, True))
    assert st[0].writer_of("__1_0.distcp") == "part 1 (nodeB)"


def test_a_rerun_takes_out_only_the_files_no_other_part_holds_and_skips_an_unreadable_record(tmp_path):
    """A re-run of part 0 whose source no longer holds two files it placed: the one part 2's record
    also holds stays (a higher part index, as a lower one would), the other is taken out; part 1's
    record, unreadable, is skipped rather than failing the re-run."""
    from ckptdoctor.publishing import parts as P
    from ckptdoctor.publishing.parts import protocol as PR
    from ckptdoctor.publishing.parts.records import FileRecord, PartRecord
    st = P.LocalParts(str(tmp_path), NAME, P.PartSpec.parse("0/3", "ug"))
    os.makedirs(os.path.join(st.dir, "parts"))
    os.makedirs(st.tree)
    for rel in ("shared.bin", "mine.bin"):
        (Path(st.tree) / rel).write_bytes(b"x")
    (Path(st.dir) / "parts" / "1.json").write_text("{not json")
    (Path(st.dir) / "parts" / "2.json").write_bytes(
        PartRecord(2, 3, "ug", NAME, "nodeC", "/src", {"shared.bin": FileRecord(1, ["x"])}).to_bytes())
    journal = {rel: FileRecord(1, ["x"], 0, True) for rel in ("shared.bin", "mine.bin")}
    PR._unplace_gone(st, journal, files={})
    assert sorted(os.listdir(st.tree)) == ["shared.bin"]


def test_a_part_beats_while_its_staging_exists_and_stops_when_it_is_gone(tmp_path):
    """The heartbeat is what tells other nodes (and staging cleanup) that a part is alive: each beat
    of the loop writes it while the staging exists, and none recreates it once the staging is gone.
    The loop's clock is replaced by a stop event that lets three beats pass (no thread, no timing)."""
    from ckptdoctor.publishing import parts as P

    class Beats:
        def __init__(self, n):
            self.n = n

        def wait(self, _seconds):
            self.n -= 1
            return self.n < 0          # False (beat again) n times, then stop
    st = P.LocalParts(str(tmp_path), NAME, P.PartSpec.parse("0/2", "hb2"))
    os.makedirs(os.path.join(st.dir, "alive"))
    st._stop = Beats(3)
    st._beat_loop()
    assert st._beats == 3 and (Path(st.dir) / "alive" / "0").read_text()
    shutil.rmtree(st.dir)
    st._stop = Beats(3)
    st._beat_loop()
    assert st._beats == 3 and not os.path.exists(st.dir)


def test_hashing_a_part_s_source_file_never_follows_a_link_nor_waits_on_a_fifo(tmp_path):
    """A part hashes each source file opened without following a symbolic link and without
    blocking: a link (which could point anywhere) and a FIFO (which would wait for a writer
    forever) are refused at once as not regular files."""
    import threading
    from ckptdoctor.publishing.parts.local import hash_file
    (tmp_path / "real.bin").write_bytes(b"x" * 10)
    os.symlink(tmp_path / "real.bin", tmp_path / "link.bin")
    with pytest.raises(OSError):
        hash_file(str(tmp_path / "link.bin"))
    os.mkfifo(tmp_path / "fifo.bin")
    out = []

    def run():
        try:
            hash_file(str(tmp_path / "fifo.bin"))
            out.append("hashed")
        except OSError as exc:
            out.append(exc)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():   # unblock the open, so no thread is left waiting
        with open(tmp_path / "fifo.bin", "wb"):
            pass
        t.join(5)
    assert out and isinstance(out[0], OSError), out
    assert hash_file(str(tmp_path / "real.bin")).size == 10


def test_a_waiting_part_lets_a_live_committer_finish_its_after_commit(monkeypatch):
    """A part that finds the checkpoint committed by another part waits while that committer is
    alive and its after-commit pending; when the committer finishes, the waiting part does not
    run the after-commit (tracker, retention) a second time.  Driven by a scripted staging: the
    after-commit is pending for two polls, then done."""
    from types import SimpleNamespace as NS
    from ckptdoctor.publishing.parts import protocol as PR
    monkeypatch.setattr(PR, "POLL_SECONDS", 0)
    pending = iter([True, True, False])
    st = NS(committed_by=0, final="/d/" + NAME, spec=NS(index=1), after_commit_pending=lambda: next(pending),
            committer_gone=lambda: False, remove=lambda: None)
    res, ran = NS(status=None, committer=None, notes=[]), []
    PR._committed_elsewhere(st, res, time.monotonic() + 3600, lambda *a: ran.append(a), "auto", None, None)
    assert ran == [] and res.notes == [] and res.status == "part-done" and res.committer == 0


def test_a_heartbeat_that_cannot_be_written_to_the_object_store_is_skipped_not_raised():
    """A missed heartbeat (the store refused one PUT) only makes the staging look older: it never
    raises out of the heartbeat thread, which beats again next time."""
    from ckptdoctor.publishing import parts as P
    from ckptdoctor.publishing.parts.objects import ObjectParts

    class Refusing:
        def pipe_file(self, *a, **k):
            raise RuntimeError("503 Slow Down")
    st = ObjectParts(Refusing(), "/r", NAME, P.PartSpec.parse("0/2", "hb3"), set())
    st.heartbeat()
    st.heartbeat()
    assert st._beats == 2


def test_on_an_object_store_a_refusal_frees_the_claim_and_a_rerun_clears_the_refusal():
    """A refusing part leaves its reason and takes its election claim away (a re-run can commit);
    a re-run clearing the failure removes the reason too, so waiting parts no longer see it."""
    import fsspec
    from ckptdoctor.publishing import parts as P
    from ckptdoctor.publishing.parts.objects import ObjectParts
    fs = fsspec.filesystem("memory")
    root = f"/clear-{os.getpid()}-{random.Random(13).randrange(1 << 30)}"
    a, b = (ObjectParts(fs, root, NAME, P.PartSpec.parse(f"{k}/2", "cl"), set()) for k in range(2))
    assert a.elect() is True
    a.fail("part 0: the source changed")
    assert a.claim() is None and b.failed() == "part 0: the source changed"
    a.clear_failure()
    assert b.failed() is None and not fs.exists(f"{a.dir}/failed.json")


def test_only_numbered_part_records_count_as_parts(tmp_path):
    """The parts that have recorded are the `<k>.json` files of the staging's parts/ directory; a
    stray file there (a `notes.json`, a writer's `2.json.tmp`, a bare `3`) is not a part and never
    an error."""
    from ckptdoctor.publishing import parts as P
    st = P.LocalParts(str(tmp_path), NAME, P.PartSpec.parse("0/4", "rc"))
    pdir = Path(st.dir) / "parts"
    pdir.mkdir(parents=True)
    for n in ("0.json", "1.json", "notes.json", "2.json.tmp", "3"):
        (pdir / n).write_text("{}")
    assert st.record_count() == {0, 1}
    assert sorted(st.records()) == [0, 1]


def test_a_commit_refused_for_unrecorded_files_names_the_first_three(tmp_path):
    """The assembled tree must hold exactly what the part records say: files no record lists refuse
    the commit, and the message names the first three of them (sorted), so an operator can find them."""
    from ckptdoctor.publishing.parts import protocol as PR
    from ckptdoctor.publishing.parts.records import PartRefused
    st, spec = _one_part_staged(tmp_path, {"a.bin": b"x"})
    for n in ("x1.bin", "x2.bin", "x3.bin", "x4.bin"):
        (Path(st.tree) / n).write_bytes(b"y")
    with pytest.raises(PartRefused) as ei:
        PR._commit(st, None, spec, NAME, lambda tree: ("megatron", []))
    assert str(ei.value) == (f"{st.tree}: the assembled tree differs from the part records (unrecorded x1.bin, "
                             f"x2.bin, x3.bin); nothing committed")


def test_a_stale_part_staging_is_reported_with_its_age(tmp_path):
    """A part publish's staging that no part has touched for longer than parts_stale_seconds is a
    leftover (CKD202), reported with its age in seconds (to 0.1 s) from its newest sign of life; one
    touched a moment ago is a publish in progress, not reported."""
    from ckptdoctor import api
    from ckptdoctor.publishing.parts.local import staging_name
    from helpers import assert_fires
    run = tmp_path / "run"
    megatron_iter(run / "iter_0000100", 100)
    (run / TRACKER).write_text("100")
    st = run / staging_name("iter_0000200", "job77")
    (st / "alive").mkdir(parents=True)
    (st / "alive" / "0").write_text("nodeA 1 1\n")
    old = time.time() - 2 * 86400
    for p in (st / "alive" / "0", st / "alive", st):
        os.utime(p, (old, old))
    for p in (st / "alive" / "0", st / "alive", st):    # touched a moment ago: a part publish in progress
        os.utime(p, None)
    assert "CKD202" not in api.verify(str(run)).rules()
    for p in (st / "alive" / "0", st / "alive", st):
        os.utime(p, (old, old))
    (hit,) = assert_fires(api.verify(str(run)), "CKD202", path_contains="ckptdoctor-parts", severity="warning")
    age = hit.details["age_seconds"]
    assert isinstance(age, float) and 2 * 86400 - 5 < age < 2 * 86400 + 600 and round(age, 1) == age, hit.details
    assert (hit.details["checkpoint"], hit.details["publish_id"]) == ("iter_0000200", "job77")


def test_an_object_store_part_names_a_lower_numbered_part_as_the_writer_of_a_file():
    """On an object store the writer of a conflicting file is read from the other parts' journals,
    every part but the asking one: a file part 0 uploaded is named as part 0's when part 2 asks."""
    import fsspec
    import hashlib
    from ckptdoctor.publishing import parts as P
    from ckptdoctor.publishing.parts.objects import ObjectParts
    fs = fsspec.filesystem("memory")
    root = f"/writer-{os.getpid()}-{random.Random(17).randrange(1 << 30)}"
    st = ObjectParts(fs, root, NAME, P.PartSpec.parse("2/3", "wr"), set())
    key = hashlib.sha1(b"__0_0.distcp").hexdigest()
    for k, host in ((0, "nodeA"), (1, "nodeB"), (2, "nodeC")):
        fs.pipe_file(f"{st.dir}/alive/{k}", f"{host} 1 1\n".encode())
    fs.pipe_file(f"{st.dir}/journal/0/{key}.json", json.dumps({"rel": "__0_0.distcp", "wrote": True}).encode())
    assert st.writer_of("__0_0.distcp") == "part 0 (nodeA)"
    fs.rm(root, recursive=True)


def test_a_comparer_waits_ten_polls_for_the_writers_journal_then_says_another_part(monkeypatch):
    """The part that placed a file journals it just after; a part comparing its copy waits for that
    line ten polls (2 s), then names "another part" rather than waiting on."""
    from types import SimpleNamespace as NS
    from ckptdoctor.publishing.parts import protocol as PR
    monkeypatch.setattr(PR, "POLL_SECONDS", 0)
    asked = []
    st = NS(writer_of=lambda rel: asked.append(rel))
    assert PR._writer_of(st, "x.bin") == "another part" and len(asked) == 10
    late = iter([None, None, "part 3 (nodeD)"])
    assert PR._writer_of(NS(writer_of=lambda rel: next(late)), "x.bin") == "part 3 (nodeD)"


def test_a_journal_entry_on_an_object_store_is_read_up_to_1_mib():
    """Each journal entry is a few hundred bytes; reading one is bounded at 1 MiB, so a hostile or
    corrupt entry past that is skipped, never read whole."""
    import fsspec
    from ckptdoctor.publishing import parts as P
    from ckptdoctor.publishing.parts.objects import ObjectParts
    from ckptdoctor.publishing.parts.records import FileRecord
    fs = fsspec.filesystem("memory")
    root = f"/journal-{os.getpid()}-{random.Random(19).randrange(1 << 30)}"
    st = ObjectParts(fs, root, NAME, P.PartSpec.parse("0/2", "jb"), set())
    st.journal_add("a.bin", FileRecord(3, ["x"], 0, True))
    big = json.dumps({"rel": "b.bin", "size": 1, "digests": ["y" * (1536 << 10)], "wrote": True}).encode()
    fs.pipe_file(f"{st.dir}/journal/0/big.json", big)
    assert sorted(st.journal()) == ["a.bin"]
    fs.rm(root, recursive=True)


def test_a_process_on_another_host_is_never_judged_alive_from_here():
    """A publish's temporary copy names its host and pid; a pid is only looked up on its own host
    (this one's pid numbers say nothing about another node's)."""
    from ckptdoctor.publishing import naming
    assert naming.owner_alive({"host": naming.HOST, "pid": str(os.getpid()), "start": None}) is True
    assert naming.owner_alive({"host": "another-node", "pid": str(os.getpid()), "start": None}) is False


@pytest.mark.parametrize("n", [1, 4, 5, 7])
def test_a_refused_merge_names_up_to_four_conflicting_files_and_counts_the_rest(n):
    """Two parts holding different bytes for n files: the refusal names every conflict up to four,
    in file order, and counts the rest ("(+3 more)" for seven); four or fewer carry no count."""
    from ckptdoctor.publishing.parts import records as R
    files = lambda d: {f"f{i}.bin": R.FileRecord(10, [d * 16]) for i in range(n)}  # noqa: E731
    recs = {0: R.PartRecord(0, 2, "j", NAME, "nodeA", "/src", files("a")),
            1: R.PartRecord(1, 2, "j", NAME, "nodeB", "/src", files("b"))}
    with pytest.raises(R.PartRefused) as ei:
        R.merge_records(recs, "publish")
    msg = str(ei.value)
    assert msg.startswith("publish: conflicting copies, nothing committed: f0.bin: part 0 (nodeA) and part 1 "
                          "(nodeB) hold different bytes (10 vs 10 bytes, xxh3 aaaaaaaaaaaa vs bbbbbbbbbbbb)"), msg
    named = [f"f{i}.bin" for i in range(n) if f"f{i}.bin:" in msg]
    assert named == [f"f{i}.bin" for i in range(min(n, 4))], msg
    assert msg.endswith(f" (+{n - 4} more)" if n > 4 else "bbbbbbbbbbbb)"), msg


def test_another_part_publishs_staging_is_left_alone_while_alive_or_of_unknown_age_and_the_note_says_which(tmp_path):
    """Cleaning before a part publish removes only another publish's staging that has shown no life
    for `stale_after` seconds; one active recently, or one with nothing to date it (empty), is left
    alone with a note saying which of the two it is."""
    from ckptdoctor.publishing.parts.local import clean_stale
    live, empty, dead = (tmp_path / f".{NAME}.ckptdoctor-parts-{i}" for i in ("jobA", "jobB", "jobC"))
    for d in (live, dead):
        (d / "parts").mkdir(parents=True)
        (d / "parts" / "0.json").write_text("{}")
    empty.mkdir()
    old = time.time() - 3600
    os.utime(dead / "parts" / "0.json", (old, old))
    os.utime(dead / "parts", (old, old))
    notes: list[str] = []
    assert clean_stale(str(tmp_path), NAME, "mine", 300, notes) == [dead.name]
    assert notes == [f"left alone: {live.name} (another part publish of {NAME}, active recently)",
                     f"left alone: {empty.name} (another part publish of {NAME}, active at an unknown time)"], notes
    assert live.is_dir() and empty.is_dir() and not dead.exists()


def test_a_part_that_finds_many_foreign_copies_names_four_and_counts_the_rest(tmp_path):
    """A part finding eleven files already in the staging with other bytes (a dead earlier run's)
    refuses at once, naming four of them and counting the other seven; nothing is committed."""
    parts, full = nodes_of(tmp_path, 2, ranks=16)
    dest = tmp_path / "dest"
    tree = dest / f".{NAME}.ckptdoctor-parts-job5" / NAME
    tree.mkdir(parents=True)
    mine = sorted(os.listdir(parts[0]))
    assert len(mine) == 11, mine     # 8 shards, .metadata, metadata.json, common.pt
    for f in mine:
        _stale_copy(parts[0] / f, tree / f)
    rc, out, err = finish(start_part(parts[0], dest, 0, 2, "job5"))
    assert rc == 1 and "conflicting copies, nothing committed" in err, (rc, err)
    assert sum(f"{f}: part 0" in err for f in mine) == 4 and " (+7 more); settle which node's copy is right" in err, err
    assert not (dest / NAME).exists()
