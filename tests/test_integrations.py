"""ckptdoctor.integrations.dcp.ManifestWriter: digests computed while the real DCP save writes,
the manifest written before `.metadata`; proven with a real 4-rank gloo save, the real dcp.load,
and verify --checksums in both directions."""
import json
import os
import subprocess
import sys

import pytest

from helpers import cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("mw") / "iter_0000300"
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "fixtures", "manifest_writer_job.py"),
                        str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def copy_of(saved, tmp_path):
    import shutil
    dst = tmp_path / saved.name
    shutil.copytree(saved, dst, copy_function=shutil.copy2)
    return dst


def test_manifest_written_during_save_lists_every_file_and_precedes_the_marker(saved):
    man = json.loads((saved / "ckptdoctor.manifest.json").read_text())
    assert set(man["files"]) == set(os.listdir(saved)) - {"ckptdoctor.manifest.json"}
    assert sum(1 for f in man["files"] if f.endswith(".distcp")) == 8  # 4 ranks x thread_count 2
    assert "ManifestWriter" in man["tool"]
    # marker last: the manifest is older than .metadata (nanosecond mtimes on the same filesystem)
    assert os.stat(saved / "ckptdoctor.manifest.json").st_mtime_ns <= os.stat(saved / ".metadata").st_mtime_ns
    rc, out, err = cli("verify", "--checksums", "--format", "json", str(saved))
    assert rc == 0, out


def test_the_saved_checkpoint_loads_and_a_flipped_byte_is_named(saved, tmp_path):
    import torch
    import torch.distributed.checkpoint as dcp
    ck = copy_of(saved, tmp_path)
    md = dcp.FileSystemReader(str(ck)).read_metadata()
    sd = {k: torch.zeros(m.size, dtype=m.properties.dtype) for k, m in md.state_dict_metadata.items()
          if hasattr(m, "size")}
    dcp.load(sd, checkpoint_id=str(ck))  # the real loader reads what ManifestWriter let DCP write
    assert sd["w"].shape == (2048, 64) and torch.equal(sd["b"], torch.ones(7))
    victim = max((p for p in ck.glob("__*.distcp")), key=lambda p: p.stat().st_size)
    with open(victim, "r+b") as fh:
        fh.seek(victim.stat().st_size // 2)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x10]))
    rc, out, err = cli("verify", "--checksums", "--format", "json", str(ck))
    assert rc == 1
    hits = [f for f in json.loads(out)["findings"] if f["severity"] == "error"]
    assert any(victim.name in f["path"] for f in hits), hits
    # ... while torch loads the flipped byte without a word: only the manifest catches it
    sd2 = {k: torch.zeros_like(v) for k, v in sd.items()}
    dcp.load(sd2, checkpoint_id=str(ck))


def test_publish_checks_the_source_against_the_save_time_manifest(saved, tmp_path):
    ck = copy_of(saved, tmp_path)
    rc, out, err = cli("publish", "--quiet", str(ck), str(tmp_path / "dest"), "--tracker", "none")
    assert rc == 0, err
    read_plan = json.loads((ck / "ckptdoctor.manifest.json").read_text())["read_plan"]
    assert read_plan == {"schema": "ckptdoctor.read_plan/v1", "world": 4,
                         "keys": {"b": "all", "emb": "all", "step": "all", "w": "all"}}
    assert json.loads((tmp_path / "dest" / ck.name / "ckptdoctor.manifest.json").read_text())["read_plan"] == read_plan
    victim = sorted(ck.glob("__*_0.distcp"))[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 1
    st = victim.stat()
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # silent corruption: same size, same mtime
    rc, out, err = cli("publish", "--quiet", str(ck), str(tmp_path / "dest2"), "--tracker", "none")
    assert rc != 0 and victim.name in err and "manifest" in err, err
    assert not (tmp_path / "dest2" / ck.name).exists()


def test_single_process_save_and_no_manifest_without_collectives(tmp_path):
    """A single-process save is its own coordinator (manifest written, verify passes);
    use_collectives=False has no coordinator to merge digests: no manifest, and verify
    --checksums fails closed (CKD150) instead of passing."""
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp
    from ckptdoctor.integrations.dcp import ManifestWriter
    out = tmp_path / "one"
    dcp.save({"w": torch.ones(4)}, storage_writer=ManifestWriter(str(out)), no_dist=True)
    assert (out / "ckptdoctor.manifest.json").exists()
    rc, o, e = cli("verify", "--checksums", str(out))
    assert rc == 0, o
    nc = tmp_path / "nocoll"
    dcp.save({"w": torch.ones(4)}, storage_writer=ManifestWriter(str(nc)), use_collectives=False)
    assert not (nc / "ckptdoctor.manifest.json").exists() and (nc / "__0.metadata").exists()
    rc, o, e = cli("verify", "--checksums", "--format", "json", str(nc))
    assert rc == 1 and "CKD150" in o


def test_part_publish_checks_each_node_against_the_save_time_manifest(saved, tmp_path):
    """The coordinator's node holds the manifest ManifestWriter wrote while saving; a node whose
    local shard rotted since the save (same size, same mtime) is named, and nothing is committed.
    Without the damage the same parts commit and the published manifest agrees with the save's."""
    from helpers import spread
    from test_parts import finish, start_part
    spread(saved, tmp_path / "nodes", ["n0", "n1"], 2, name="step-300", tracker=None)  # torchtitan naming
    srcs = [tmp_path / "nodes" / n / "run7" / "step-300" for n in ("n0", "n1")]
    for p in srcs[1].glob("*"):  # only the coordinator's node has the manifest and .metadata
        if p.name in ("ckptdoctor.manifest.json", ".metadata"):
            p.unlink()
    res = [finish(p) for p in [start_part(srcs[k], tmp_path / "ok", k, 2, "a1") for k in range(2)]]
    assert all(r[0] == 0 for r in res), res
    saved_doc = json.loads((saved / "ckptdoctor.manifest.json").read_text())
    published = json.loads((tmp_path / "ok" / "step-300" / "ckptdoctor.manifest.json").read_text())
    assert published["files"] == saved_doc["files"]
    assert published["read_plan"] == saved_doc["read_plan"]  # preflight of the published copy stays exact
    victim = sorted(srcs[0].glob("__1_*.distcp"), key=lambda p: -p.stat().st_size)[0]
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[len(data) // 3] ^= 4
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    res = [finish(p) for p in [start_part(srcs[k], tmp_path / "bad", k, 2, "a2", "--timeout", "5") for k in range(2)]]
    assert res[0][0] == 2 and victim.name in res[0][2] and "save time" in res[0][2], res[0]
    assert res[1][0] == 75  # the other part waited for a record that never came: nothing committed
    assert not (tmp_path / "bad" / "step-300").exists()
