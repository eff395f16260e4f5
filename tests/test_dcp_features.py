"""DCP features of current torch, written by torch itself: several files per rank (thread_count),
async_save, and the Hugging Face storage writer (safetensors shards + index through DCP).  Healthy
saves: no error and no warning, and torch loads them; a truncated file: an error naming it, and
torch fails on the same bytes (issue 15)."""
import json
import os

import pytest

from helpers import cli

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402


def state():
    g = torch.Generator().manual_seed(0)
    sd = {f"l{i}.w": torch.randn(64, 32, generator=g) for i in range(6)}
    sd["step"] = 3
    return sd


def findings(path):
    rc, out, err = cli("verify", "--format", "json", str(path))
    assert "Traceback" not in err, err
    return rc, [f for f in json.loads(out)["findings"] if f["severity"] in ("error", "warning")]


def zeros_like(sd):
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in sd.items()}


def truncate(path, keep=0.5):
    os.truncate(path, int(os.path.getsize(path) * keep))


def test_several_files_per_rank(tmp_path):
    sd = state()
    ck = tmp_path / "threads"
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(ck), thread_count=4), no_dist=True)
    shards = sorted(p.name for p in ck.glob("__0_*.distcp"))
    assert len(shards) == 4
    assert findings(ck) == (0, [])
    got = zeros_like(sd)
    dcp.load(got, checkpoint_id=str(ck))
    assert all(torch.equal(got[k], sd[k]) for k in sd if k != "step")
    victim = max(ck.glob("__0_*.distcp"), key=lambda p: p.stat().st_size)
    truncate(victim)
    rc, fs = findings(ck)
    assert rc == 1 and any(f["severity"] == "error" and victim.name in f["path"] for f in fs), fs
    with pytest.raises(BaseException):
        dcp.load(zeros_like(sd), checkpoint_id=str(ck))


def test_async_save(tmp_path):
    sd = state()
    ck = tmp_path / "async"
    dcp.async_save(sd, checkpoint_id=str(ck)).result()
    assert findings(ck) == (0, [])
    got = zeros_like(sd)
    dcp.load(got, checkpoint_id=str(ck))
    assert torch.equal(got["l3.w"], sd["l3.w"])
    (ck / ".metadata").unlink()  # the async save died before its marker
    rc, fs = findings(ck)
    assert rc == 1 and any(f["rule"] == "CKD101" for f in fs), fs


def test_huggingface_storage_writer(tmp_path):
    from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
    sd = {k: v for k, v in state().items() if k != "step"}
    ck = tmp_path / "hf"
    dcp.save(sd, storage_writer=HuggingFaceStorageWriter(path=str(ck), save_distributed=False,
                                                         enable_consolidation=False), no_dist=True)
    assert (ck / "model.safetensors.index.json").exists()
    assert findings(ck) == (0, [])
    got = zeros_like(sd)
    dcp.load(got, storage_reader=HuggingFaceStorageReader(path=str(ck)), no_dist=True)
    assert all(torch.equal(got[k], sd[k]) for k in sd)
    shard = next(ck.glob("model-*.safetensors"))
    truncate(shard, 0.9)
    rc, fs = findings(ck)
    assert rc == 1 and any(f["severity"] == "error" and shard.name in f["path"] for f in fs), fs
    with pytest.raises(BaseException):
        dcp.load(zeros_like(sd), storage_reader=HuggingFaceStorageReader(path=str(ck)), no_dist=True)


def test_huggingface_writer_distributed_with_consolidation(tmp_path):
    import shutil
    import subprocess
    import sys
    out = tmp_path / "hfd"
    p = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "fixtures", "hf_writer_job.py"),
                        str(out)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-2000:]
    assert sorted(x.name for x in (out / "sharded").iterdir()) == [
        "shard-00001-model-00001-of-00001.safetensors", "shard-00002-model-00001-of-00001.safetensors"]
    assert findings(out) == (0, [])  # the consolidated output is what loads; sharded/ is its input
    # consolidation died before writing its output: never "ok"
    dead = tmp_path / "dead"
    shutil.copytree(out, dead)
    for f in ("model-00001-of-00001.safetensors", "model.safetensors.index.json"):
        (dead / f).unlink()
    rc, out_, err = cli("verify", "--format", "json", str(dead))
    assert rc == 1, out_
    doc = json.loads(out_)
    assert doc["facts"]["layout"] == "hf-dcp-sharded"  # recognised, not "unknown layout"
    assert [f["rule"] for f in doc["findings"] if f["severity"] == "error"] == ["CKD101"]
