"""verify --checksums, the manifest, Megatron integrity.json, slices and merge."""
import hashlib
import json
import os
import subprocess
import sys

import pytest

from ckptdoctor import api
from ckptdoctor.commands.manifest import write_manifest
from ckptdoctor.io import hashing
from ckptdoctor.layouts import dcp_writer as W
from helpers import as_unprivileged, assert_fires, assert_fires_json, assert_no_errors, cli


@pytest.fixture
def ck(tmp_path):
    d = tmp_path / "ck"
    items = [W.Item(f"layers.{i}.w", (64, 64), (0, 0), (64, 64), [float(i)] * 4096, rank=i % 3)
             for i in range(6)]
    W.write(str(d), items)
    return d


def verify(d, **kw):
    return api.verify(str(d), checksums=True, **kw)


def test_manifest_roundtrip_is_clean_and_records_every_file(ck):
    target, nfiles, nbytes = write_manifest(str(ck), quiet=True)
    doc = json.loads(open(target).read())
    assert doc["schema"] == "ckptdoctor.manifest/v1" and doc["algorithm"] == "xxh3-128"
    assert set(doc["files"]) == {".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp"}
    assert doc["layout"] == "dcp" and doc["tool"].startswith("ckptdoctor ")
    assert_no_errors(verify(ck))
    assert verify(ck).findings == []


def test_bit_flip_same_size_names_the_file(ck):
    write_manifest(str(ck), quiet=True)
    f = ck / "__1_0.distcp"
    data = bytearray(f.read_bytes())
    pos = data.find(b"\x00\x00\x80\x3f" * 8) + 100  # inside layer 1's tensor bytes (1.0f)
    data[pos] ^= 0x01
    f.write_bytes(bytes(data))
    rep = verify(ck)
    hit = assert_fires(rep, "CKD151", path_contains="__1_0.distcp")[0]
    assert hit.details["why"] == "content differs"
    assert [f.rule for f in rep.findings] == ["CKD151"]  # structurally still fine: only content caught it


def test_truncated_missing_and_extra_are_separate_findings(ck):
    write_manifest(str(ck), quiet=True)
    os.truncate(ck / "__0_0.distcp", 100)
    (ck / "__2_0.distcp").unlink()
    (ck / "notes.txt").write_text("hi")
    rep = verify(ck)
    assert assert_fires(rep, "CKD151", path_contains="__0_0")[0].details["why"] == "size differs"
    assert_fires(rep, "CKD152", path_contains="__2_0.distcp")
    assert_fires(rep, "CKD153", path_contains="notes.txt", severity="warning")


def test_no_manifest_fails_closed(ck):
    rep = verify(ck)
    assert_fires(rep, "CKD150")
    assert rep.failed()
    assert "CKD150" not in api.verify(str(ck)).rules()  # only under --checksums


def test_corrupt_manifest_is_a_clear_finding(ck):
    (ck / "ckptdoctor.manifest.json").write_text('{"schema": "ckptdoctor.manifest/v1", "files": ')
    rc, out, err = cli("verify", "--checksums", "-f", "json", str(ck))
    assert rc == 1 and "Traceback" not in err
    assert [f["rule"] for f in json.loads(out)["findings"]] == ["CKD154"]
    assert "not valid JSON" in assert_fires(verify(ck), "CKD154")[0].message


def test_a_manifest_that_cannot_be_read_is_named_with_the_systems_reason(ck):
    """CKD154 for a manifest the job's user may not read: the file, and why in the system's words
    ("Permission denied"), not a Python repr of the exception; the check fails closed (exit 1)."""
    write_manifest(str(ck), quiet=True)
    os.chmod(ck / "ckptdoctor.manifest.json", 0)
    p = subprocess.run(as_unprivileged() + [sys.executable, "-m", "ckptdoctor", "verify", "--checksums", "-f", "json",
                                            str(ck)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    (hit,) = assert_fires_json(json.loads(p.stdout), "CKD154", severity="error")
    assert hit["message"] == "ckptdoctor.manifest.json: cannot read: Permission denied", hit


def test_manifest_command_never_replaces(ck):
    assert cli("manifest", "-q", str(ck))[0] == 0
    rc, _, err = cli("manifest", str(ck))
    assert rc == 2 and "already exists" in err


def test_megatron_integrity_json_sha256(ck):
    files = {n: hashlib.sha256((ck / n).read_bytes()).hexdigest() for n in (".metadata", "__0_0.distcp",
                                                                          "__1_0.distcp")}
    (ck / "integrity.json").write_text(json.dumps({"algorithm": "sha256", "files": files}))
    rep = verify(ck)
    assert_fires(rep, "CKD153", path_contains="__2_0.distcp", severity="error")  # a data file integrity.json omits
    assert "CKD151" not in rep.rules()
    f = ck / "__0_0.distcp"
    data = bytearray(f.read_bytes())
    data[-30] ^= 0xFF
    f.write_bytes(bytes(data))
    hit = assert_fires(verify(ck), "CKD151", path_contains="__0_0.distcp")[0]
    assert hit.details["source"] == "integrity.json" and hit.details["algorithm"] == "sha256"


def test_partition_covers_every_byte_exactly_once():
    units = hashing.units_for("a", 10_000_000, chunk=1 << 20) + hashing.units_for("b", 5, chunk=1 << 20) + \
        hashing.units_for("c", 3_000_000, chunk=1 << 20)
    for n in (1, 2, 3, 7):
        parts = [hashing.partition(units, k, n) for k in range(n)]
        flat = [u for p in parts for u in p]
        assert sorted(flat) == sorted(units) and len(set(flat)) == len(units)
        per_file = {}
        for u in flat:
            per_file.setdefault(u.rel, []).append((u.start, u.length))
        for rel, spans in per_file.items():
            spans.sort()
            assert spans[0][0] == 0
            assert all(a + la == b for (a, la), (b, _) in zip(spans, spans[1:]))


def test_slices_in_separate_processes_merge_to_the_full_verdict(ck, tmp_path):
    write_manifest(str(ck), quiet=True, chunk_bytes=4096)  # many ranges, so slices split files
    f = ck / "__2_0.distcp"
    data = bytearray(f.read_bytes())
    data[5000] ^= 0x10
    f.write_bytes(bytes(data))
    procs = [subprocess.Popen([sys.executable, "-m", "ckptdoctor", "verify", "--checksums", "-q", "--slice",
                               f"{k}/3", "-f", "json", str(ck)], stdout=subprocess.PIPE, text=True)
             for k in range(3)]
    reports = []
    for k, p in enumerate(procs):
        out, _ = p.communicate(timeout=120)
        path = tmp_path / f"slice{k}.json"
        path.write_text(out)
        reports.append(str(path))
    sl = [json.loads(open(r).read())["facts"]["slice"] for r in reports]
    total = sum(os.path.getsize(ck / n) for n in os.listdir(ck) if n != "ckptdoctor.manifest.json")
    assert sum(s["bytes"] for s in sl) == total          # every byte hashed exactly once
    assert all(s["units"] > 0 for s in sl)
    rc, out, _ = cli("merge", "-f", "json", *reports)
    doc = json.loads(out)
    assert rc == 1 and doc["facts"]["bytes_hashed"] == total
    hits = [x for x in doc["findings"] if x["rule"] == "CKD151"]
    assert len(hits) == 1 and hits[0]["details"]["range"] == [4096, 8192]
    rc, _, err = cli("merge", reports[0], reports[2])
    assert rc == 2 and "missing" in err


def _safetensors(path, n=1000):
    import struct
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + struct.pack(f"<{n}f", *range(n)))


def test_checksums_of_one_file_are_checked_against_the_manifest_beside_it(tmp_path):
    """`verify --checksums DIR/FILE`: the manifest of the directory the file is in is read, and a
    changed byte of that file is named (the single file's view holds only the file itself)."""
    d = tmp_path / "export"
    d.mkdir()
    _safetensors(d / "model.safetensors")
    write_manifest(str(d), quiet=True)
    rc, out, err = cli("verify", "--checksums", "-f", "json", str(d / "model.safetensors"))
    assert rc == 0 and json.loads(out)["findings"] == [], (err, out)
    data = bytearray((d / "model.safetensors").read_bytes())
    data[-5] ^= 0x01
    (d / "model.safetensors").write_bytes(bytes(data))
    rc, out, err = cli("verify", "--checksums", "-f", "json", str(d / "model.safetensors"))
    doc = json.loads(out)
    assert rc == 1 and [x["rule"] for x in doc["findings"]] == ["CKD151"], (err, doc["findings"])
    assert doc["findings"][0]["path"].endswith("model.safetensors")


def test_checksums_reuse_the_checkpoints_listing(ck, monkeypatch):
    """On storage where a listing is a round trip, --checksums walks the checkpoint from the
    listing the other checks made: its directory is listed once."""
    from ckptdoctor.io import fs
    write_manifest(str(ck), quiet=True)
    listed = []
    real = fs.LocalStorage.listdir

    def listdir(self, rel=""):
        listed.append(rel)
        return real(self, rel)
    monkeypatch.setattr(fs.LocalStorage, "listdir", listdir)
    assert_no_errors(verify(ck))
    assert listed.count("") == 1, listed


def test_checksums_of_a_run_root_check_each_checkpoint_against_its_own_manifest(tmp_path):
    """`verify --checksums RUN_ROOT`: each checkpoint's files are read from that checkpoint (its
    manifest's paths are relative to it): a healthy run is clean, and a bit flipped in the newer
    checkpoint is named there, the older one still clean."""
    run = tmp_path / "run"
    for step in (100, 200):
        items = [W.Item(f"layers.{i}.w", (64, 64), (0, 0), (64, 64), [float(i)] * 4096, rank=i % 2) for i in range(4)]
        W.write(str(run / f"step-{step}"), items)
        write_manifest(str(run / f"step-{step}"), quiet=True)
    rep = verify(run)
    assert not [f for f in rep.findings if f.severity != "info"], [(f.rule, f.message) for f in rep.findings]
    f = run / "step-200" / "__1_0.distcp"
    data = bytearray(f.read_bytes())
    data[data.find(b"\x00\x00\x80\x3f" * 8) + 100] ^= 0x01
    f.write_bytes(bytes(data))
    (hit,) = assert_fires(verify(run), "CKD151", path_contains="step-200/__1_0.distcp")
    assert hit.details["why"] == "content differs"
