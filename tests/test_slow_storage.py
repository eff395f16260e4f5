"""Issue 42: on storage where a metadata call is a round trip, the calls are issued together, and the
relaunch gate reads shard bytes only of the checkpoint the framework will load.

Concurrency is proven by a barrier that only opens when several calls are in flight at once (no
timing luck: a serial implementation times out the barrier and the test fails); the wall-clock
figures live in benchmarks/latency/ (see benchmarks/README.md).
"""
from __future__ import annotations

import json
import os
import threading

import pytest

from ckptdoctor.io import fs
from ckptdoctor.layouts import dcp_writer as W
from ckptdoctor import api
from tests.helpers import cli


@pytest.fixture(autouse=True)
def no_pool_left_behind():
    """Later tests in this process fork (--deep) only while it is single-threaded: stop the pool."""
    yield
    fs.shutdown_pool()


@pytest.fixture
def fresh_io(monkeypatch):
    """Each test decides for itself whether storage was seen slow (the flag is per process)."""
    monkeypatch.setattr(fs, "_seen_slow", False)
    monkeypatch.delenv(fs.IO_THREADS_ENV, raising=False)
    return fs


def _slow_then_together(parties: int, probe: int):
    """fn for map_io: the first `probe` calls are slow round trips (0.3 ms, over SLOW_CALL_S);
    each later call waits until `parties` calls are inside at once (a barrier with a deadline)."""
    barrier = threading.Barrier(parties, timeout=3)   # in flight together within ms; 3 s only bounds a failure
    inside = {"now": 0, "max": 0}
    lock = threading.Lock()

    def fn(i):
        with lock:
            inside["now"] += 1
            inside["max"] = max(inside["max"], inside["now"])
        try:
            if i < probe:
                import time
                time.sleep(0.0003)
            else:
                barrier.wait()
            return i * 10
        finally:
            with lock:
                inside["now"] -= 1
    return fn, inside


def test_slow_metadata_calls_are_issued_together_and_answered_in_order(fresh_io):
    fn, inside = _slow_then_together(parties=8, probe=fs.PROBE_CALLS)
    out = list(fs.map_io(fn, range(fs.PROBE_CALLS + 64)))
    assert not [r for r in out if isinstance(r, BaseException)], "calls were not in flight together"
    assert out == [i * 10 for i in range(fs.PROBE_CALLS + 64)]
    assert inside["max"] >= 8
    assert fs._seen_slow
    fs.shutdown_pool()
    assert not [t for t in threading.enumerate() if t.name.startswith("ckd-io")]


def test_fast_calls_stay_on_the_calling_thread(fresh_io):
    threads = set()
    out = list(fs.map_io(lambda i: threads.add(threading.current_thread().name) or i, range(500)))
    assert out == list(range(500))
    assert threads == {threading.current_thread().name}, "a local disk's stats were sent to a thread pool"


def test_io_threads_1_never_goes_concurrent(fresh_io, monkeypatch):
    monkeypatch.setenv(fs.IO_THREADS_ENV, "1")
    names = set()

    def slow(i):
        import time
        time.sleep(0.0003)
        names.add(threading.current_thread().name)
        return i
    assert list(fs.map_io(slow, range(40))) == list(range(40))
    assert names == {threading.current_thread().name}


def test_a_failed_call_is_returned_in_its_place_not_raised(fresh_io, monkeypatch):
    monkeypatch.setattr(fs, "_seen_slow", True)   # concurrent from the first call

    def fn(i):
        if i == 7:
            raise FileNotFoundError(2, "gone", f"f{i}")
        return i
    out = list(fs.map_io(fn, range(20)))
    assert isinstance(out[7], FileNotFoundError) and out[7].filename == "f7"
    assert [r for k, r in enumerate(out) if k != 7] == [k for k in range(20) if k != 7]


def test_concurrent_listing_equals_the_serial_one(fresh_io, monkeypatch, tmp_path):
    """Sizes, types, links (good, dangling, looping) are the same whichever way the stats ran."""
    d = tmp_path / "d"
    d.mkdir()
    for i in range(100):
        (d / f"f{i}").write_bytes(b"x" * i)
    (d / "sub").mkdir()
    os.symlink("f3", d / "good-link")
    os.symlink("nowhere", d / "dangling")
    os.symlink("loop", d / "loop")
    os.mkfifo(d / "fifo")
    serial = sorted(fs.LocalStorage(str(d)).listdir(), key=lambda e: e.name)
    monkeypatch.setattr(fs, "_seen_slow", True)
    concurrent = sorted(fs.LocalStorage(str(d)).listdir(), key=lambda e: e.name)
    assert concurrent == serial
    assert {e.name for e in serial} >= {"f0", "f99", "sub", "good-link", "dangling", "loop", "fifo"}


# ---- the relaunch gate reads only what the framework will load ------------------------------------
def _run_root(tmp_path, steps=(100, 200, 300), ranks=4):
    root = tmp_path / "run"
    for s in steps:
        p = root / f"iter_{s:07d}"
        W.write(str(p), [W.Item("w", (ranks, 1), (r, 0), (1, 1), [1.0], rank=r) for r in range(ranks)])
        (p / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')   # what Megatron writes
    (root / "latest_checkpointed_iteration.txt").write_text(str(steps[-1]))
    return root


def _overwrite_record_header(shard):
    data = bytearray(shard.read_bytes())
    data[0:4] = b"XXXX"   # the first record's zip local header
    shard.write_bytes(bytes(data))


def test_the_gate_does_not_read_the_shards_of_checkpoints_it_will_not_load(tmp_path):
    root = _run_root(tmp_path)
    _overwrite_record_header(root / "iter_0000100" / "__1_0.distcp")
    rc, out, _ = cli("verify", "--target", "resume", "--format", "json", str(root))
    doc = json.loads(out)
    assert rc == 0, out
    assert doc["facts"]["gate"]["passed"] is True
    assert not [f for f in doc["findings"] if f["rule"] == "CKD105"]
    rows = {row["name"]: row for row in doc["facts"]["checkpoints"]}
    assert list(rows) == ["iter_0000300"] and "data_read" not in rows["iter_0000300"]
    assert doc["facts"]["not_judged"] == ["iter_0000100", "iter_0000200"]
    text = cli("verify", "--target", "resume", str(root))[1]
    assert "not judged by the gate: iter_0000100, iter_0000200" in text


def test_the_gate_lists_only_the_target_when_it_is_complete(tmp_path, monkeypatch):
    root = _run_root(tmp_path)
    listed = []
    real = fs.LocalStorage.listdir
    monkeypatch.setattr(fs.LocalStorage, "listdir", lambda self, rel="": listed.append(rel) or real(self, rel))
    rep = api.verify(str(root), target="resume")
    assert not rep.failed() and sorted(listed) == ["", "iter_0000300"]


def test_a_checkpoint_newer_than_the_target_is_still_judged_by_the_gate(tmp_path):
    root = _run_root(tmp_path)
    (root / "latest_checkpointed_iteration.txt").write_text("200")
    _overwrite_record_header(root / "iter_0000300" / "__1_0.distcp")   # newer, and not loaded: listed, not read
    (root / "iter_0000300" / "__2_0.distcp").unlink()                     # ... and incomplete
    doc = json.loads(cli("verify", "--target", "resume", "--format", "json", str(root))[1])
    rows = {row["name"]: row for row in doc["facts"]["checkpoints"]}
    assert sorted(rows) == ["iter_0000200", "iter_0000300"] and rows["iter_0000300"]["data_read"] is False
    assert rows["iter_0000300"]["complete"] is False and doc["facts"]["not_judged"] == ["iter_0000100"]
    assert doc["facts"]["gate"]["passed"] is True


def test_verifying_every_checkpoint_still_reads_every_shard(tmp_path):
    root = _run_root(tmp_path)
    _overwrite_record_header(root / "iter_0000100" / "__1_0.distcp")
    doc = json.loads(cli("verify", "--format", "json", str(root))[1])
    hits = [f for f in doc["findings"] if f["rule"] == "CKD105"]
    assert hits and "iter_0000100/__1_0.distcp" in hits[0]["path"] and hits[0]["severity"] == "error"
    assert all("data_read" not in row for row in doc["facts"]["checkpoints"])


def test_the_gate_still_reads_every_shard_of_the_checkpoint_it_resumes(tmp_path):
    root = _run_root(tmp_path)
    _overwrite_record_header(root / "iter_0000300" / "__2_0.distcp")
    rc, out, _ = cli("verify", "--target", "resume", "--format", "json", str(root))
    doc = json.loads(out)
    assert rc == 1
    assert doc["facts"]["gate"]["passed"] is False
    hit = [f for f in doc["findings"] if f["rule"] == "CKD105"]
    assert hit and hit[0]["severity"] == "error" and "iter_0000300/__2_0.distcp" in hit[0]["path"]


def test_the_gate_reads_the_target_shards_on_slow_storage_too(tmp_path, monkeypatch):
    """The same verdicts when the opens run concurrently (as they do over a slow filesystem)."""
    from ckptdoctor import api
    root = _run_root(tmp_path, ranks=40)
    _overwrite_record_header(root / "iter_0000300" / "__33_0.distcp")
    monkeypatch.setattr(fs, "_seen_slow", True)
    rep = api.verify(str(root))
    hits = [f for f in rep.findings if f.rule == "CKD105"]
    assert [h.path.rsplit("/", 2)[-2:] for h in hits] == [["iter_0000300", "__33_0.distcp"]]


def test_on_slow_storage_the_shard_bytes_are_read_together_not_one_shard_after_another(tmp_path, monkeypatch):
    """On Lustre or NFS a read of a cold shard is a round trip to a data server, like its open: the
    gate's reads of its target's shards are in flight together (a barrier of 4 readers that a
    serial reader never opens: its read fails and the check with it), with the same verdict."""
    from ckptdoctor import api
    root = _run_root(tmp_path, ranks=40)
    _overwrite_record_header(root / "iter_0000300" / "__33_0.distcp")
    monkeypatch.setattr(fs, "_seen_slow", True)
    barrier = threading.Barrier(4, timeout=3)
    waited = []
    real_preadv, real_pread = os.preadv, os.pread

    def gated(real):
        def read(fd, *a):
            if os.readlink(f"/proc/self/fd/{fd}").endswith(".distcp") and len(waited) < 8:
                waited.append(fd)
                barrier.wait()
            return real(fd, *a)
        return read
    monkeypatch.setattr(os, "preadv", gated(real_preadv))
    monkeypatch.setattr(os, "pread", gated(real_pread))
    rep = api.verify(str(root), target="resume")
    assert len(waited) == 8
    assert not [f for f in rep.findings if f.rule in ("CKD900", "CKD901")], "a shard read failed: read serially"
    hits = [f for f in rep.findings if f.rule == "CKD105"]
    assert [h.path.rsplit("/", 2)[-2:] for h in hits] == [["iter_0000300", "__33_0.distcp"]]


# ---- CKD107 on a copy of many small files (an upload to an object store writes .metadata first) ----
@pytest.mark.parametrize("shards, spread_s, severity", [
    (400, 12, "warning"),   # 400 small shards uploaded over 12 s after the marker: a copy's round trips
    (4, 12, "error"),       # 4 small shards cannot take 12 s to copy: re-saved after the commit
])
def test_a_copy_of_many_small_shards_is_not_called_a_resave(tmp_path, shards, spread_s, severity):
    from ckptdoctor import api
    d = tmp_path / "ck"
    W.write(str(d), [W.Item("w", (shards, 1), (r, 0), (1, 1), [1.0], rank=r) for r in range(shards)])
    m = (d / ".metadata").stat().st_mtime
    for r in range(shards):   # uploaded in order after the marker, the last one spread_s later
        t = m + spread_s * (r + 1) / shards
        os.utime(d / f"__{r}_0.distcp", (t, t))
    rep = api.verify(str(d))
    hits = [f for f in rep.findings if f.rule == "CKD107"]
    assert len(hits) == 1 and hits[0].severity == severity
    assert hits[0].details["files_after_marker"] == shards
    assert rep.failed() is (severity == "error")


# ---- preflight opens node views together on slow storage ------------------------------------------
def _node_views(tmp_path, nodes=24, per_node=2):
    world = nodes * per_node
    src = tmp_path / "src"
    W.write(str(src), [W.Item("w", (world, 1), (r, 0), (1, 1), [1.0], rank=r) for r in range(world)])
    for i in range(nodes):
        d = tmp_path / f"n{i:02d}" / "run7" / "iter_0000100"
        d.mkdir(parents=True)
        for f in os.listdir(src):
            if f.startswith("__") and int(f[2:].split("_")[0]) // per_node != i:
                continue
            os.link(src / f, d / f)
        (tmp_path / f"n{i:02d}" / "run7" / "latest_checkpointed_iteration.txt").write_text("100")
    return str(tmp_path / "{node}" / "run7"), [f"n{i:02d}" for i in range(nodes)]


def _preflight(location, nodes, per_node=2):
    from ckptdoctor import api
    from ckptdoctor.commands import preflight as flow
    from ckptdoctor.preflight.model import Allocation
    eng = api.make_engine("preflight", location)
    flow.run(location, eng, Allocation.block(nodes, [per_node] * len(nodes)))
    return eng.report


def test_preflight_opens_node_views_together_when_each_is_slow(fresh_io, monkeypatch, tmp_path):
    from ckptdoctor.commands import preflight as flow
    location, nodes = _node_views(tmp_path)
    real = flow.open_view
    barrier = threading.Barrier(4, timeout=10)
    calls = []

    def slow_view(node, loc):
        calls.append(node)
        if len(calls) <= fs.PROBE_CALLS:
            import time
            time.sleep(flow.VIEW_SLOW_S * 1.5)   # round trips, not CPU
        else:
            barrier.wait()                        # only passes with 4 views in flight at once
        return real(node, loc)
    monkeypatch.setattr(flow, "open_view", slow_view)
    rep = _preflight(location, nodes)
    assert not [f for f in rep.findings if f.severity == "error"], [f.message for f in rep.findings]
    assert rep.facts["resume_from"] == "iter_0000100"
    assert sorted(calls) == nodes


def test_preflight_finds_the_same_gaps_with_views_opened_together(fresh_io, monkeypatch, tmp_path):
    """A node that lost a shard and one that cannot read one: named the same, serial or concurrent."""
    location, nodes = _node_views(tmp_path)
    os.unlink(tmp_path / "n05" / "run7" / "iter_0000100" / "__11_0.distcp")
    locked = tmp_path / "n20" / "run7" / "iter_0000100" / "__40_0.distcp"
    data = locked.read_bytes()
    locked.unlink()                 # its own inode (the source's hard link stays readable)
    locked.write_bytes(data)
    os.chmod(locked, 0)

    def gaps(rep):
        return sorted((f.rule, f.severity, f.path.split(str(tmp_path))[-1]) for f in rep.findings
                      if f.severity != "info")
    serial = gaps(_preflight(location, nodes))
    monkeypatch.setattr(fs, "_seen_slow", True)
    together = gaps(_preflight(location, nodes))
    assert together == serial
    assert any("n05" in p and "__11_0.distcp" in p for _, _, p in serial)
    if os.geteuid() != 0:   # root reads a mode-000 file: access(2) says so, and so does the real load
        assert any("n20" in p and "__40_0.distcp" in p for _, _, p in serial)


def test_cached_views_are_computed_once_per_instance_without_a_shared_lock(tmp_path):
    """Two views' listings may run at once (functools.cached_property before 3.12 serialised
    every instance behind one lock), and each view still lists its directory once."""
    from ckptdoctor.layouts.model import CheckpointView
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    st = fs.LocalStorage(str(tmp_path))
    barrier = threading.Barrier(2, timeout=10)
    listed = []
    real = st.listdir

    def listdir(rel=""):
        listed.append(rel)
        barrier.wait()   # both views inside their listing at once, or this times out
        return real(rel)
    st.listdir = listdir
    views = [CheckpointView(st, "a", None), CheckpointView(st, "b", None)]
    out = {}
    ts = [threading.Thread(target=lambda v=v: out.setdefault(v.rel, v.entries)) for v in views]
    for t in ts:
        t.start()
    for t in ts:
        t.join(20)
    assert set(out) == {"a", "b"} and sorted(listed) == ["a", "b"]
    views[0].entries
    assert sorted(listed) == ["a", "b"]


def test_prune_removes_a_checkpoints_files_together_on_slow_storage(fresh_io, monkeypatch, tmp_path):
    """Where an unlink is a round trip, a pruned checkpoint's shards are unlinked several at once
    (a barrier that opens only with 4 unlinks in flight; serial removal times it out and fails),
    and the removal is whole: nested directories gone, a symlink removed and its target kept."""
    victim = tmp_path / "trash"
    (victim / "sub").mkdir(parents=True)
    for i in range(40):
        (victim / f"__{i}_0.distcp").write_bytes(b"x")
    (victim / "sub" / "common.pt").write_bytes(b"y")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"k")
    os.symlink(outside, victim / "link")
    fn, inside = _slow_then_together(4, fs.PROBE_CALLS)
    real_unlink, calls, order = os.unlink, [], iter(range(10 ** 6))

    def unlink(p, *a, **k):
        i = next(order)   # the order calls arrive in (next() on a range iterator is atomic under the GIL)
        if i < fs.PROBE_CALLS + 24:
            fn(i)   # the probe, then 6 rounds of 4 at the barrier; the last 2 need no partner
        calls.append(p)
        return real_unlink(p, *a, **k)
    monkeypatch.setattr(os, "unlink", unlink)
    fs.remove_tree(str(victim))
    assert not victim.exists() and (outside / "keep").read_bytes() == b"k"
    assert inside["max"] >= 4 and len(calls) == 42


def test_a_listing_of_readable_files_asks_the_kernel_nothing_more(tmp_path, monkeypatch):
    """Whether this user may read a file is judged from the stat the listing already made: on a
    filesystem where each metadata call is a round trip, a healthy checkpoint costs no access(2)."""
    from ckptdoctor.io import fs
    for n in ("a.bin", "b.bin"):
        (tmp_path / n).write_bytes(b"x")
    calls = []
    monkeypatch.setattr(fs.os, "access", lambda *a, **k: calls.append(a) or True)
    ents = fs.LocalStorage(str(tmp_path)).listdir("")
    assert all(e.readable for e in ents) and not calls, calls


@pytest.mark.parametrize("kernel_says", [True, False])
def test_a_file_whose_mode_denies_reading_is_confirmed_with_the_kernel(tmp_path, monkeypatch, kernel_says):
    """Mode bits that deny this user are not the last word (root's CAP_DAC_OVERRIDE, an ACL): then,
    and only then, access(2) decides, with the effective ids, in a listing and in a stat alike."""
    from ckptdoctor.io import fs
    (tmp_path / "locked.bin").write_bytes(b"x")
    os.chmod(tmp_path / "locked.bin", 0)
    calls = []

    def access(path, mode, **k):
        calls.append((path, mode, k.get("effective_ids")))
        return kernel_says
    monkeypatch.setattr(fs.os, "access", access)
    st = fs.LocalStorage(str(tmp_path))
    (e,) = st.listdir("")
    assert e.readable is kernel_says and st.stat("locked.bin").readable is kernel_says
    assert calls == [(str(tmp_path / "locked.bin"), os.R_OK, True)] * 2, calls
