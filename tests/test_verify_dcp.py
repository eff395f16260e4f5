"""verify on real torch DCP checkpoints: one broken variant per rule, healthy ones stay clean."""
import os
import pickle
import shutil
import time
from pathlib import Path

import pytest

from ckptdoctor import api
from conftest import needs_torch
from helpers import assert_fires, assert_no_errors

pytestmark = needs_torch


@pytest.mark.parametrize("name", ["dcp_single", "dcp_4rank", "dcp_nocoll", "dcp_dedup", "titan_run",
                                  "megatron_run", "megatron_legacy"])
def test_healthy_fixtures_have_no_findings(fixture_root, name):
    rep = api.verify(str(fixture_root / name))
    assert rep.findings == [], [(f.rule, f.message) for f in rep.findings]


def test_zero_byte_dedup_shard_is_legal(fixture_root):
    d = fixture_root / "dcp_dedup"
    assert (d / "__1_0.distcp").stat().st_size == 0  # the real torch behaviour this guards
    rep = api.verify(str(d))
    assert "CKD106" not in rep.rules()


def test_missing_marker(real):
    d = real("dcp_single")
    (d / ".metadata").unlink()
    rep = api.verify(str(d))
    assert_fires(rep, "CKD101")


def test_metadata_tmp_leftover(real):
    d = real("dcp_single")
    (d / ".metadata").rename(d / ".metadata.tmp")
    rep = api.verify(str(d))
    assert_fires(rep, "CKD102", path_contains=".metadata.tmp")
    assert_fires(rep, "CKD101")


def test_missing_shard(real):
    d = real("dcp_4rank")
    (d / "__2_0.distcp").unlink()
    rep = api.verify(str(d))
    hit = assert_fires(rep, "CKD103", path_contains="__2_0.distcp")[0]
    assert hit.details["records"] >= 1


def test_truncated_shard_reports_expected_and_actual(real):
    d = real("dcp_4rank")
    f = d / "__1_0.distcp"
    os.truncate(f, 1000)
    rep = api.verify(str(d))
    hit = assert_fires(rep, "CKD104", path_contains="__1_0.distcp")[0]
    assert hit.details["actual_bytes"] == 1000
    assert hit.details["expected_min_bytes"] == 3154 and hit.details["missing_bytes"] == 2154, hit.details


def test_a_shard_deleted_after_the_listing_is_named_with_the_systems_reason_and_fails_closed(real, monkeypatch):
    """The race forced, not timed: the shard disappears between the listing and its open."""
    from ckptdoctor.checks import verify_dcp
    d = real("dcp_4rank")
    real_open = verify_dcp.open_regular

    def vanishing(path, *a, **kw):
        if path.endswith("__1_0.distcp"):
            os.remove(path)   # deleted by someone else after verify listed it
        return real_open(path, *a, **kw)
    monkeypatch.setattr(verify_dcp, "open_regular", vanishing)
    rep = api.verify(str(d))
    [hit] = assert_fires(rep, "CKD901", path_contains="__1_0.distcp", severity="error")
    assert hit.message.startswith("cannot read __1_0.distcp: No such file or directory (it was listed"), hit.message
    assert hit.details["errno"] == 2 and rep.failed()


def test_overwritten_slice_is_not_a_zip(real):
    d = real("dcp_4rank")
    f = d / "__1_0.distcp"
    data = bytearray(f.read_bytes())
    data[1577:1581] = b"XXXX"  # the second record's local header
    f.write_bytes(bytes(data))
    rep = api.verify(str(d))
    assert_fires(rep, "CKD105", path_contains="__1_0.distcp")


@pytest.mark.parametrize("size", [1, 100])
def test_stray_nonempty_shard(real, size):
    """A .distcp the metadata does not name is a warning from its first byte (an empty one is
    DCP's own dedup placeholder and is no finding)."""
    d = real("dcp_4rank")
    (d / "__9_0.distcp").write_bytes(b"x" * size)
    rep = api.verify(str(d))
    (hit,) = assert_fires(rep, "CKD106", path_contains="__9_0.distcp", severity="warning")
    assert hit.message == f"__9_0.distcp ({size} bytes) is not referenced by the metadata", hit.message
    assert not rep.failed()
    (d / "__9_0.distcp").write_bytes(b"")
    assert "CKD106" not in api.verify(str(d)).rules()


def test_shard_rewritten_after_marker(real):
    d = real("dcp_4rank")
    m = (d / ".metadata").stat().st_mtime_ns
    os.utime(d / "__3_0.distcp", ns=(m + 60_123_456_789, m + 60_123_456_789))
    rep = api.verify(str(d))
    hit = assert_fires(rep, "CKD107", path_contains="__3_0.distcp", severity="error")[0]  # no copy takes 60 s for 1.5 KB
    assert hit.details["max_seconds_after_marker"] == pytest.approx(60.123, abs=2e-3), hit.details   # to the ms


def test_a_rewrite_after_the_marker_is_named_by_its_newest_shard(real):
    """CKD107 with two shards rewritten after the marker names the newer one and its gap: the one
    that bounds how long after the commit the directory was still being written."""
    d = real("dcp_4rank")
    m = (d / ".metadata").stat().st_mtime_ns
    os.utime(d / "__1_0.distcp", ns=(m + 300_000_000_000,) * 2)
    os.utime(d / "__3_0.distcp", ns=(m + 60_000_000_000,) * 2)
    (hit,) = assert_fires(api.verify(str(d)), "CKD107", severity="error")
    assert "__1_0.distcp" in hit.path and "2 shard(s) modified after the commit marker" in hit.message
    assert "(newest __1_0.distcp, 300.0 s later" in hit.message, hit.message


def test_a_late_shard_is_a_copys_when_the_bytes_written_before_it_explain_the_gap(real):
    """CKD107 judges a late shard with everything written between the marker and it: 8 MiB landed
    4 s after the marker, the late shard 7 s after -- a copy at 1 MiB/s explains that (a warning),
    though the late shard alone is 1.5 KB."""
    d = real("dcp_4rank")
    m = (d / ".metadata").stat().st_mtime
    for f in d.glob("__*_0.distcp"):
        os.utime(f, (m - 10, m - 10))
    big, late = d / "__1_0.distcp", d / "__3_0.distcp"
    os.truncate(big, 8 << 20)
    os.utime(big, (m + 4, m + 4))
    os.utime(late, (m + 7, m + 7))
    hit = assert_fires(api.verify(str(d)), "CKD107", path_contains="__3_0.distcp", severity="warning")[0]
    assert hit.details["bytes_after_marker"] == (8 << 20) + late.stat().st_size, hit.details


def test_a_record_cut_by_truncation_is_ckd104s_and_not_read_as_corrupt(tmp_path):
    """A shard truncated inside its last record (3 records of 1,672 bytes, cut at 4,000): CKD104 names
    the missing bytes; CKD105 does not read the cut record as a corrupt one."""
    from ckptdoctor.layouts import dcp_writer as W
    d = tmp_path / "ck"
    W.write(str(d), [W.Item(f"w{i}", (64,), (0,), (64,), [1.0] * 64, rank=0) for i in range(3)])
    assert (d / "__0_0.distcp").stat().st_size == 5016
    os.truncate(d / "__0_0.distcp", 4000)
    rep = api.verify(str(d))
    assert_fires(rep, "CKD104", path_contains="__0_0.distcp", severity="error")
    assert "CKD105" not in rep.rules(), [(f.rule, f.message) for f in rep.findings]


def test_many_late_shards_are_counted_and_the_first_20_listed(tmp_path):
    """22 shards rewritten an hour after the marker: CKD107 counts all 22 and its details list the
    first 20 names (a bounded report)."""
    from ckptdoctor.layouts import dcp_writer as W
    d = tmp_path / "ck"
    W.write(str(d), [W.Item("w", (22, 1), (r, 0), (1, 1), [1.0], rank=r) for r in range(22)])
    m = (d / ".metadata").stat().st_mtime
    for f in d.glob("__*_0.distcp"):
        os.utime(f, (m + 3600, m + 3600))
    (hit,) = assert_fires(api.verify(str(d)), "CKD107", severity="error")
    names = sorted(f.name for f in d.glob("__*_0.distcp"))
    assert hit.message.startswith("22 shard(s) modified after the commit marker"), hit.message
    assert hit.details["files"] == names[:20], hit.details


def test_cp_r_mtimes_within_tolerance_pass(real):
    """A plain `cp -r` gives fresh mtimes within a second in directory order: must pass."""
    d = real("dcp_4rank")
    now = time.time()
    names = sorted(os.listdir(d))
    for i, n in enumerate(names):  # marker first, shards up to 0.9 s later
        os.utime(d / n, (now + 0.2 * i, now + 0.2 * i))
    rep = api.verify(str(d))
    assert "CKD107" not in rep.rules()
    assert_no_errors(rep)


def _edit_metadata(d, fn):
    import torch.distributed.checkpoint.metadata  # noqa: F401 (trusted: we made this file)
    md = pickle.loads((d / ".metadata").read_bytes())
    fn(md)
    (d / ".metadata").write_bytes(pickle.dumps(md))


def test_chunk_hole_is_reported_with_fqn_and_offset(real):
    d = real("dcp_4rank")

    def drop_chunk(md):
        t = md.state_dict_metadata["dense.weight"]
        t.chunks = [c for c in t.chunks if list(c.offsets) != [4, 0]]
    _edit_metadata(d, drop_chunk)
    rep = api.verify(str(d))
    hit = assert_fires(rep, "CKD108")[0]
    assert hit.details["fqn"] == "dense.weight"
    assert hit.details["hole_at"] == [4, 0]
    assert hit.details["covered"] == 18 and hit.details["expected"] == 24


def test_chunk_overlap_and_out_of_bounds(real):
    d = real("dcp_4rank")
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
    import torch

    def bad(md):
        t = md.state_dict_metadata["dense.weight"]
        t.chunks.append(ChunkStorageMetadata(offsets=torch.Size([1, 0]), sizes=torch.Size([2, 3])))
        t.chunks.append(ChunkStorageMetadata(offsets=torch.Size([7, 0]), sizes=torch.Size([2, 3])))
    _edit_metadata(d, bad)
    rep = api.verify(str(d))
    msgs = " ".join(f.message for f in assert_fires(rep, "CKD108"))
    assert "overlap" in msgs and "outside" in msgs, msgs  # both injected faults are named


def test_truncated_metadata_is_a_finding_not_a_crash(real):
    d = real("dcp_single")
    f = d / ".metadata"
    f.write_bytes(f.read_bytes()[:200])
    rep = api.verify(str(d))
    assert_fires(rep, "CKD110", path_contains=".metadata")


def test_malicious_metadata_is_refused_and_runs_nothing(real, tmp_path):
    d = real("dcp_single")
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))
    (d / ".metadata").write_bytes(pickle.dumps(Evil()))
    rep = api.verify(str(d))
    hit = assert_fires(rep, "CKD110")[0]
    assert hit.details["refused_global"] in ("posix.system", "os.system")
    assert not marker.exists()


def test_per_rank_metadata_variant_checks_shards(real):
    d = real("dcp_nocoll")
    os.truncate(d / "__2_0.distcp", 10)
    rep = api.verify(str(d))
    assert_fires(rep, "CKD104", path_contains="__2_0.distcp")


@pytest.mark.parametrize("late_s, padded_mib, severity", [
    (30, 40, "warning"),     # 40 MiB written after the marker: a slow copy explains 30 s
    (30, 0, "error"),        # a few KB cannot take 30 s to copy: the shard was re-saved
    (3600, 40, "error"),     # an hour after the marker: a re-save that crashed before its new marker
])
def test_mixed_generations_are_errors_when_no_copy_explains_them(real, late_s, padded_mib, severity):
    d = real("dcp_4rank")
    m = (d / ".metadata").stat().st_mtime
    for f in d.glob("__*_0.distcp"):
        os.utime(f, (m - 10, m - 10))          # the other shards precede the marker
    shard = d / "__3_0.distcp"
    if padded_mib:
        os.truncate(shard, padded_mib << 20)   # (sparse) bytes that a copy would have to write
    os.utime(shard, (m + late_s, m + late_s))
    rep = api.verify(str(d))
    hit = assert_fires(rep, "CKD107", path_contains="__3_0.distcp", severity=severity)[0]
    assert hit.details["bytes_after_marker"] == shard.stat().st_size
    assert rep.failed() is (severity == "error")
    if severity == "error":   # the error states the copy rates it assumed, as the rule doc gives them
        assert "even at 1 MiB/s and 20 files/s: a re-save into the same directory" in hit.message, hit.message


def test_zstd_compressed_dcp_is_not_corrupt(tmp_path):
    """Issue 15: torch's zstd storage extension writes zstd frames, not zip slices (12 false CKD105s
    before); a damaged frame start is still named, and --deep says what it did not scan."""
    d = tmp_path / "zst"
    shutil.copytree(Path(__file__).parent / "fixtures" / "zstd", d)
    (d / "README.md").unlink()
    rep = api.verify(str(d))
    assert not rep.findings, [(f.rule, f.message) for f in rep.findings]
    from ckptdoctor.layouts import dcp as D
    md = D.parse((d / ".metadata").read_bytes())
    assert all(s.transforms == ("stream.zstd/1",) for s in md.storage)
    hit = assert_fires(api.verify(str(d), deep=True), "CKD901", path_contains="__0_0.distcp")[0]
    assert hit.details["records"] == 3
    w = next(s for s in md.storage if s.fqn == "w")
    with open(d / "__0_0.distcp", "r+b") as fh:
        fh.seek(w.file_offset)
        fh.write(b"\0\0\0\0")
    hit = assert_fires(api.verify(str(d)), "CKD105", path_contains="__0_0.distcp")[0]
    assert hit.details["fqn"] == "w" and "zstd" in hit.message


_END_DAMAGE = {  # name: (position relative to the EOCD's start, bytes written); torch.save ends an archive
    # with the zip64 record (56 bytes), the zip64 locator (20) and the EOCD (22)
    "eocd-cd-offset": (16, b"\xff\xff\xff\x7f"), "eocd-cd-size": (12, b"\xff\xff\xff\x7f"),
    "eocd-entries": (10, b"\x09\x00"), "eocd-signature": (0, b"\0\0\0\0"),
    "locator-signature": (-20, b"\0\0\0\0"), "locator-offset": (-12, b"\xff" * 7 + b"\x00"),
    "locator-disks": (-4, b"\x02\x00\x00\x00"), "zip64-signature": (-76, b"\0\0\0\0"),
    "zip64-cd-offset": (-76 + 48, b"\xff" * 4 + b"\0" * 4), "zip64-cd-size": (-76 + 40, b"\xff" * 4 + b"\0" * 4),
    "zip64-entries": (-76 + 32, b"\x09" + b"\0" * 7),
}


@pytest.fixture(scope="module")
def end_record_saves(tmp_path_factory):
    """One real single-process DCP save per record size: 4 floats (shards read whole, in one
    shared buffer) and 64k floats (records above 8 KiB: two preads each)."""
    import torch
    import torch.distributed.checkpoint as dcp
    out = {}
    for n in (4, 64 * 1024):
        d = tmp_path_factory.mktemp(f"end{n}")
        dcp.save({"a": torch.arange(n, dtype=torch.float32), "b": torch.ones(n)}, checkpoint_id=str(d), no_dist=True)
        out[n] = d
    return out


@pytest.mark.parametrize("n", [4, 64 * 1024])
@pytest.mark.parametrize("damage", sorted(_END_DAMAGE))
def test_slice_end_records_are_judged_as_torch_reads_them(end_record_saves, tmp_path, n, damage):
    """CKD105 on a damaged end record of a shard's last archive agrees with torch's own
    dcp.load in both directions.  torch.save always writes a zip64 record, and its reader then
    never reads the 32-bit EOCD sizes: damage there loads fine (it was a false CKD105 before),
    damage to the zip64 sizes fails to load (it was a false pass before).  The same for --deep."""
    import torch
    import torch.distributed.checkpoint as dcp
    from ckptdoctor.layouts import dcp as D
    d = tmp_path / "ck"
    shutil.copytree(end_record_saves[n], d)
    md = D.parse((d / ".metadata").read_bytes())
    last = max(md.storage, key=lambda s: s.file_offset)
    rel, at = _END_DAMAGE[damage]
    with open(d / last.relative_path, "r+b") as fh:
        fh.seek(last.file_offset + last.length - 22 + rel)
        fh.write(at)
    out = {"a": torch.zeros(n), "b": torch.zeros(n)}
    try:
        dcp.load(out, checkpoint_id=str(d), no_dist=True)
        loads = torch.equal(out["a"], torch.arange(n, dtype=torch.float32)) and torch.equal(out["b"], torch.ones(n))
    except BaseException:   # CheckpointException (a BaseException) wraps torch.load's RuntimeError
        loads = False
    hits = [f for f in api.verify(str(d)).findings if f.rule == "CKD105"]
    assert bool(hits) == (not loads), (damage, loads, [f.message for f in hits])
    if hits:
        assert hits[0].details["fqn"] == last.fqn and last.relative_path in hits[0].path
    # --deep reads each archive's directory itself: it must agree too (a damaged zip64 or locator
    # signature loads in torch, and --deep called the directory unreadable before)
    deep = api.verify(str(d), deep=True).findings
    assert [f.rule for f in deep] == (["CKD105"] if hits else []), (damage, [(f.rule, f.message) for f in deep])


def test_shared_shard_buffer_never_hands_out_the_previous_shards_bytes(tmp_path):
    """A shard that shrank between the listing and the read: the records past its new end must not
    be judged on the bytes a larger shard left in the shared buffer (that would be a false ok)."""
    from ckptdoctor.io.fs import ShardReader
    from ckptdoctor.layouts import ptzip
    rec = ptzip.LOCAL_HEADER + b"\0" * 60 + ptzip.EOCD + b"\0" * 18   # a minimal empty zip archive
    big, small = tmp_path / "big", tmp_path / "small"
    big.write_bytes(rec * 4)
    small.write_bytes(rec)   # listed at 4 records' size, holds one now
    r = ShardReader()
    for path, size in ((big, 4 * len(rec)), (small, 4 * len(rec))):
        fd = os.open(path, os.O_RDONLY)
        try:
            r.open(fd, size, 4)
            got = [ptzip.slice_problem(r.read, i * len(rec), len(rec)) is None for i in range(4)]
            tail = r.read(3 * len(rec), 4)
        finally:
            os.close(fd)
    assert got == [True, False, False, False]
    assert tail == b""


@pytest.mark.parametrize("drop", ["tensor", "bytes"])
def test_item_without_storage_record_is_an_error_as_dcp_load_raises(real, drop):
    """A `.metadata` listing an item whose storage record is gone: shard sizes and zip framing are
    all fine, yet the real dcp.load raises KeyError MetadataIndex(...) (CKD133, error)."""
    import torch
    import torch.distributed.checkpoint as dcp
    d = real("dcp_single")
    victim = {}

    def drop_record(md):
        byte_keys = {k for k, v in md.state_dict_metadata.items() if not hasattr(v, "chunks")}
        for idx in list(md.storage_data):
            if (idx.fqn in byte_keys) == (drop == "bytes"):
                victim["fqn"] = idx.fqn
                del md.storage_data[idx]
                return
    _edit_metadata(d, drop_record)
    if "fqn" not in victim:
        pytest.skip(f"the fixture holds no {drop} item")
    rep = api.verify(str(d))
    hit = assert_fires(rep, "CKD133", path_contains=".metadata", severity="error")[0]
    assert hit.details["fqn"] == victim["fqn"]
    md = dcp.FileSystemReader(str(d)).read_metadata()
    sd = {}
    for k, v in md.state_dict_metadata.items():
        sd[k] = torch.empty(tuple(v.size), dtype=v.properties.dtype) if hasattr(v, "chunks") else None
    sd = {k: v for k, v in sd.items() if v is not None or k == victim["fqn"]}
    if drop == "bytes":
        sd[victim["fqn"]] = __import__("io").BytesIO()
    with pytest.raises(BaseException, match="MetadataIndex"):   # CheckpointException is a BaseException
        dcp.load(sd, checkpoint_id=str(d))


def test_the_expert_count_comes_from_the_nearest_config_of_the_checkpoint_its_parent_or_the_one_above(tmp_path):
    """CKD109's expected experts: config.json in the checkpoint's directory, else its parent (the
    run root), else the one above -- the nearest wins, one level at a time."""
    import json as _json
    from types import SimpleNamespace
    from ckptdoctor.checks.verify_dcp import _expected_experts
    from ckptdoctor.io.fs import LocalStorage
    base = tmp_path / "jobs"
    ck_dir = base / "run" / "ckpts" / "iter_1"
    ck_dir.mkdir(parents=True)
    st = LocalStorage(str(base))
    ck = SimpleNamespace(storage=st, rel="run/ckpts/iter_1")
    eng = SimpleNamespace(opt=lambda name: None)
    assert _expected_experts(ck, eng) == (None, None)
    (base / "config.json").write_text(_json.dumps({"num_experts": 32}))              # three levels up: not read
    assert _expected_experts(ck, eng) == (None, None)
    (base / "run" / "config.json").write_text(_json.dumps({"num_experts": 8}))       # the one above the parent
    assert _expected_experts(ck, eng)[0] == 8
    (base / "run" / "ckpts" / "config.json").write_text(_json.dumps({"num_local_experts": 4}))
    assert _expected_experts(ck, eng)[0] == 4
    (ck_dir / "config.json").write_text(_json.dumps({"n_routed_experts": 16}))
    assert _expected_experts(ck, eng)[0] == 16


def test_deep_names_every_storage_extension_a_record_was_written_through(tmp_path, monkeypatch):
    """A record written through a chain of storage extensions (torch's zstd plus another a site
    registers) is not scanned, and the note says so naming the whole chain in the save's order;
    `details.transform` stays the first, as for a single extension."""
    from ckptdoctor.layouts import dcp as D
    d = tmp_path / "zst"
    shutil.copytree(Path(__file__).parent / "fixtures" / "zstd", d)
    (d / "README.md").unlink()
    def two_extensions(parse):
        def parsed(*a, **k):
            md = parse(*a, **k)
            for s in md.storage:
                s.transforms = ("stream.zstd/1", "site.crypt/1")
            return md
        return parsed
    for fn in ("parse", "parse_file"):  # a local checkpoint's reader and a fetched one's
        monkeypatch.setattr(D, fn, two_extensions(getattr(D, fn)))
    hit = [f for f in api.verify(str(d), deep=True).findings if f.rule == "CKD901" and "__0_0.distcp" in f.path][0]
    assert "through 'stream.zstd/1' then 'site.crypt/1'; their bytes were not scanned" in hit.message, hit.message
    assert hit.details["transform"] == "stream.zstd/1" and hit.details["transforms"] == ["stream.zstd/1", "site.crypt/1"]


@pytest.mark.parametrize("n", [8, 13])
def test_a_shard_with_many_corrupt_records_names_five_and_counts_the_rest(tmp_path, n):
    """CKD105 names the first five bad records of a shard and says exactly how many more there are
    (the concurrent reader keeps only those five per shard, so a batch of shards stays small)."""
    from ckptdoctor.layouts import dcp_writer as W
    d = tmp_path / "ck"
    W.write(str(d), [W.Item(f"w{i}", (8, 1), (0, 0), (8, 1), [1.0] * 8, rank=0) for i in range(n)])
    f = d / "__0_0.distcp"
    f.write_bytes(f.read_bytes().replace(b"PK\x03\x04", b"XXXX"))   # every record's local header
    hits = assert_fires(api.verify(str(d)), "CKD105", path_contains="__0_0.distcp", severity="error")
    named = [h for h in hits if h.message.startswith("record ")]
    assert len(named) == 5 and len({h.details["fqn"] for h in named}) == 5, [h.message for h in hits]
    (more,) = [h for h in hits if "more" in h.details]
    assert more.message == f"{n - 5} more corrupt records in __0_0.distcp" and more.details["more"] == n - 5, \
        (more.message, more.details)


def test_a_record_past_the_shards_end_does_not_stop_the_check_of_its_other_records(tmp_path):
    """A .metadata whose first record of a shard claims more bytes than the shard has (CKD104's
    finding) and a later record of the same shard overwritten: CKD105 still judges, and names,
    the later record."""
    from ckptdoctor.layouts import dcp_writer as W
    d = str(tmp_path / "ck")
    items = [W.Item(f"w{i}", (8, 1), (0, 0), (8, 1), [1.0] * 8, rank=0) for i in range(3)]
    W.write(d, items)
    shard = tmp_path / "ck" / "__0_0.distcp"
    recs, off = [], 0
    for it in items:   # the records as write() laid them out
        n = len(W.tensor_archive(it.values, it.sizes))
        recs.append([it, "__0_0.distcp", off, n])
        off += n
    data = bytearray(shard.read_bytes())
    recs[0][3] = len(data) * 10                         # w0 runs far past the end
    data[recs[2][2]:recs[2][2] + 4] = b"XXXX"           # w2's local header overwritten
    shard.write_bytes(bytes(data))
    (tmp_path / "ck" / ".metadata").write_bytes(W.metadata_bytes([tuple(r) for r in recs], d))
    rep = api.verify(d)
    assert_fires(rep, "CKD104", path_contains="__0_0.distcp", severity="error")
    (hit,) = assert_fires(rep, "CKD105", path_contains="__0_0.distcp", severity="error")
    assert hit.details["fqn"] == "w2", hit.message


def test_a_missing_shard_says_how_many_metadata_records_point_into_it(tmp_path):
    """CKD103 names a missing shard with the number of metadata records that point into it."""
    from ckptdoctor.layouts import dcp_writer as W
    d = tmp_path / "ck"
    W.write(str(d), [W.Item(f"w{i}", (2,), (0,), (2,), [1.0, 2.0], rank=i % 2) for i in range(6)])
    os.remove(d / "__1_0.distcp")
    (hit,) = assert_fires(api.verify(str(d)), "CKD103", path_contains="__1_0.distcp", severity="error")
    assert hit.message == "shard __1_0.distcp is referenced by 3 metadata record(s) but does not exist", hit.message
    assert hit.details["records"] == 3


def test_more_than_five_items_without_a_storage_record_are_named_five_and_counted(real):
    """CKD133 with all six storage records of a torch-written .metadata gone: five named, then one
    finding saying exactly how many more."""
    d = real("dcp_4rank")

    def drop_all(md):
        assert len(md.storage_data) == 6
        md.storage_data.clear()
    _edit_metadata(d, drop_all)
    hits = assert_fires(api.verify(str(d)), "CKD133", path_contains=".metadata", severity="error")
    assert len(hits) == 6 and all(h.details.get("missing_records") == 6 for h in hits[:5]), [h.message for h in hits]
    assert hits[5].message == "1 more items without a storage record" and hits[5].details == {"more": 1}, hits[5]


def test_exactly_five_items_without_a_storage_record_are_all_named_and_nothing_more(real):
    d = real("dcp_4rank")

    def drop_five(md):
        for idx in list(md.storage_data)[:5]:
            del md.storage_data[idx]
    _edit_metadata(d, drop_five)
    hits = assert_fires(api.verify(str(d)), "CKD133", path_contains=".metadata", severity="error")
    assert len(hits) == 5 and not [h for h in hits if "more" in h.details], [h.message for h in hits]
