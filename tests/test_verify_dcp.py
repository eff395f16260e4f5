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
    assert hit.details["expected_min_bytes"] == 3154


def test_overwritten_slice_is_not_a_zip(real):
    d = real("dcp_4rank")
    f = d / "__1_0.distcp"
    data = bytearray(f.read_bytes())
    data[1577:1581] = b"XXXX"  # the second record's local header
    f.write_bytes(bytes(data))
    rep = api.verify(str(d))
    assert_fires(rep, "CKD105", path_contains="__1_0.distcp")


def test_stray_nonempty_shard(real):
    d = real("dcp_4rank")
    (d / "__9_0.distcp").write_bytes(b"x" * 100)
    rep = api.verify(str(d))
    assert_fires(rep, "CKD106", path_contains="__9_0.distcp", severity="warning")
    assert not rep.failed()


def test_shard_rewritten_after_marker(real):
    d = real("dcp_4rank")
    m = (d / ".metadata").stat().st_mtime
    os.utime(d / "__3_0.distcp", (m + 60, m + 60))
    rep = api.verify(str(d))
    hit = assert_fires(rep, "CKD107", path_contains="__3_0.distcp")[0]
    assert hit.details["max_seconds_after_marker"] == pytest.approx(60, abs=1)


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
