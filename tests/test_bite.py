"""Tests that pin the boundaries of core decisions, so a small plausible bug in them fails a test.
Each one guards a mutant in scripts/mutation_check.py that once survived the whole suite."""
import io
import json
import os
import struct

import pytest

from ckptdoctor import api
from ckptdoctor.io import ptfile, unpickle
from ckptdoctor.io.unpickle import RefusedGlobal
from ckptdoctor.layouts import dcp_writer as W
from helpers import assert_fires, cli


def dcp(d, world=2):
    """Written by ckptdoctor's torch-free DCP writer (the format torch's dcp.load reads: the torch
    tests load this writer's output for real); used here because these tests need no torch."""
    W.write(str(d), [W.Item("w", (2 * world, 4), (2 * r, 0), (2, 4), [1.0 + r] * 8, rank=r) for r in range(world)])
    return d


# ---- CKD104: a shard one byte short fails; the exact size passes --------------------------------
def test_shard_size_boundary_is_exact_and_reported_once(tmp_path):
    from ckptdoctor.layouts import dcp as reader
    d = dcp(tmp_path / "ck")
    md = reader.parse((d / ".metadata").read_bytes())
    need = max(s.file_offset + s.length for s in md.storage if s.relative_path == "__1_0.distcp")
    shard = d / "__1_0.distcp"
    os.truncate(shard, need)
    assert "CKD104" not in api.verify(str(d)).rules()
    os.truncate(shard, need - 1)
    rep = api.verify(str(d))
    hit = assert_fires(rep, "CKD104", path_contains="__1_0.distcp")[0]
    assert hit.details["actual_bytes"] == need - 1 and hit.details["expected_min_bytes"] == need
    # the record that runs past the end is CKD104's alone: --deep's slice check (CKD105) skips it
    # rather than reporting the same missing byte a second time as a corrupt archive
    assert "CKD105" not in rep.rules()


# ---- CKD107: 1.5 s newer than the marker is a copy's jitter; 2.5 s is not ----------------------------
@pytest.mark.parametrize("delta, fires", [(1.5, False), (2.5, True), (10.0, True)])
def test_mtime_tolerance_boundary(tmp_path, delta, fires):
    d = dcp(tmp_path / "ck")
    t = os.stat(d / ".metadata").st_mtime
    for f in d.glob("__*.distcp"):
        os.utime(f, (t - 5, t - 5))
    os.utime(d / "__1_0.distcp", (t + delta, t + delta))
    assert ("CKD107" in api.verify(str(d)).rules()) is fires


# ---- trackers: what the framework would refuse -----------------------------------------------------
@pytest.mark.parametrize("text, ok", [("100", True), ("-1", False), ("1e3", False), ("١٠٠", True),
                                      ("100\n", True), ("", False)])
def test_tracker_values(tmp_path, text, ok):
    from ckptdoctor.layouts import spec, trackers
    lay = spec.get("megatron")
    v = trackers.parse(lay, text.encode())
    assert (v.problem is None) is ok, v
    if ok:
        assert v.target == "iter_0000100"


# ---- the restricted unpicklers: the exact allow-lists, and exact refusals -----------------------------
def test_dcp_allow_list_is_pinned():
    dcp_mod = "torch.distributed.checkpoint"
    expected = {(f"{dcp_mod}.metadata", n) for n in ("MetadataIndex", "TensorProperties", "_MEM_FORMAT_ENCODING",
                                                     "Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                                                     "ChunkStorageMetadata", "StorageMeta")}
    expected |= {(f"{dcp_mod}.filesystem", "_StorageInfo")}
    expected |= {(f"{dcp_mod}.planner", n) for n in ("SavePlan", "WriteItem", "TensorWriteData", "ReadItem",
                                                     "LoadPlan", "WriteItemType", "LoadItemType")}
    expected |= {("torch", "Size"), ("torch.serialization", "_get_layout"), ("torch", "strided"),
                 ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
                 ("pathlib", "PureWindowsPath"), ("collections", "OrderedDict"), ("builtins", "set"),
                 ("builtins", "frozenset")}
    assert set(unpickle.DCP_ALLOW) == expected


def test_pt_allow_list_is_pinned():
    assert set(ptfile.TORCH_ALLOW) == {
        ("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor"),
        ("torch._utils", "_rebuild_tensor_v3"), ("torch._utils", "_rebuild_parameter"),
        ("torch._utils", "_rebuild_parameter_with_state"), ("torch", "Size"), ("torch", "device"),
        ("collections", "OrderedDict"), ("collections", "defaultdict"), ("builtins", "set"),
        ("builtins", "frozenset"), ("builtins", "complex"), ("builtins", "slice"), ("datetime", "datetime")}


def _global_call(module: str, name: str, arg: str, protocol: int) -> bytes:
    """A pickle that calls module.name(arg): GLOBAL (protocol 2) or STACK_GLOBAL (protocol 4)."""
    s = arg.encode()
    call = b"X" + struct.pack("<I", len(s)) + s + b"\x85R."
    if protocol == 2:
        return b"\x80\x02c" + f"{module}\n{name}\n".encode() + call
    m, n = module.encode(), name.encode()
    return (b"\x80\x04\x95" + struct.pack("<Q", 0) + b"\x8c" + bytes([len(m)]) + m + b"\x8c" + bytes([len(n)]) + n
            + b"\x93" + call)


DANGEROUS = [("builtins", "open"), ("builtins", "getattr"), ("builtins", "__import__"), ("builtins", "eval"),
             ("builtins", "exec"), ("io", "open"), ("os", "system"), ("os", "remove"), ("posix", "system"),
             ("subprocess", "Popen"), ("subprocess", "check_call"), ("torch", "load"), ("torch", "save"),
             ("torch.serialization", "load"), ("torch._C", "_load_for_lite_interpreter")]


@pytest.mark.parametrize("protocol", [2, 4])
@pytest.mark.parametrize("module, name", DANGEROUS)
def test_dangerous_globals_are_refused_by_name_and_run_nothing(tmp_path, module, name, protocol):
    marker = tmp_path / "pwned"
    data = _global_call(module, name, str(marker), protocol)
    with pytest.raises(RefusedGlobal) as ei:
        unpickle.loads_dcp(data)
    assert ei.value.qualname == f"{module}.{name}"
    with pytest.raises(RefusedGlobal) as ei:
        ptfile.PtUnpickler(io.BytesIO(data)).load()
    assert ei.value.qualname == f"{module}.{name}"
    # through verify: a finding naming the exact global
    ck = dcp(tmp_path / "ck", world=1)
    (ck / ".metadata").write_bytes(data)
    hit = assert_fires(api.verify(str(ck)), "CKD110")[0]
    assert hit.details["refused_global"] == f"{module}.{name}" and "refused" in hit.message
    assert not marker.exists()


# ---- publish: the source must still match its own manifest --------------------------------------------
def test_source_not_matching_its_own_manifest_is_not_published(tmp_path):
    src = dcp(tmp_path / "src" / "iter_0000100")
    from ckptdoctor.commands.manifest import write_manifest
    write_manifest(str(src), quiet=True)
    shard = src / "__1_0.distcp"
    b = bytearray(shard.read_bytes())
    b[-100] ^= 1  # same size, structure intact
    shard.write_bytes(b)
    rc, out, err = cli("publish", str(src), str(tmp_path / "dest"), "-q")
    assert rc == 2 and "differ from its own ckptdoctor.manifest.json" in err and "__1_0.distcp" in err, err
    assert not (tmp_path / "dest" / "iter_0000100").exists()
    assert not (tmp_path / "dest" / "latest_checkpointed_iteration.txt").exists()


def test_publish_never_replaces_an_existing_checkpoint_without_renameat2(tmp_path, monkeypatch):
    """The fallback path (no renameat2 syscall): an existing destination is never overwritten."""
    from ckptdoctor.io import atomic
    monkeypatch.setattr(atomic, "_renameat2", lambda *a: False)
    dst = tmp_path / "b"
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_text("new")
    dst.mkdir()
    (dst / "f").write_text("old")
    with pytest.raises(FileExistsError):
        atomic.rename_noreplace(str(tmp_path / "a"), str(dst))
    assert (dst / "f").read_text() == "old"
    (dst / "f").unlink()
    os.rmdir(dst)
    atomic.rename_noreplace(str(tmp_path / "a"), str(dst))
    assert (dst / "f").read_text() == "new"


# ---- reconcile: --fix only when the simulator shows the loss gone ------------------------------------
def test_fix_refused_when_the_simulated_resume_still_loses_prompts(tmp_path):
    doc = {"schema": "ckptdoctor.run_state/v1",
           "config": {"num_prompts_per_step": 4, "group_size": 8, "sampler": "in_order",
                      "max_lookahead_versions": 1},
           "trainer": {"step": 5, "version": 5, "epoch": 0},
           "sampler": {"cursor": 3, "cursor_source": "saved"},
           "dataloader": {"batches_total": 5},
           "buffer": {"groups": [{"target_step": t, "status": "ready", "size": 8, "start_version": t - 1}
                                 for t in (4, 4, 4, 4, 7, 7)]}}
    p = tmp_path / "state.json"
    p.write_text(json.dumps(doc))
    before = p.read_bytes()
    from ckptdoctor.commands import reconcile as flow
    view = flow.load(str(p), None, [])
    plan = view.plan
    assert plan.new_cursor is None and "simulator" in plan.reason
    assert plan.after is not None and plan.after.lost_prompts  # the repair would still lose prompts
    rc, out, err = cli("reconcile", "--fix", str(p))
    assert "no automatic repair" in err and "simulator" in err, err
    assert p.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["state.json"]


# ---- preflight: a node-local shard one byte short; a tracker naming what a node lacks -------------------
def test_node_local_shard_size_boundary(tmp_path):
    from helpers import spread
    src = dcp(tmp_path / "src" / "iter_0000100", world=2)
    loc = spread(src, tmp_path / "nodes", ["n1", "n2"], 1)
    from ckptdoctor.layouts import dcp as reader
    md = reader.parse((src / ".metadata").read_bytes())
    need = max(s.file_offset + s.length for s in md.storage if s.relative_path == "__1_0.distcp")
    shard = tmp_path / "nodes" / "n2" / "run7" / "iter_0000100" / "__1_0.distcp"
    args = ("preflight", loc, "--nodelist", "n[1-2]", "--ranks-per-node", "1", "-f", "json")
    os.truncate(shard, need)
    rc, out, _ = cli(*args)
    assert rc == 0 and "CKD402" not in {f["rule"] for f in json.loads(out)["findings"]}
    os.truncate(shard, need - 1)
    rc, out, _ = cli(*args)
    hits = [f for f in json.loads(out)["findings"] if f["rule"] == "CKD402"]
    assert rc == 1 and hits and hits[0]["details"]["node"] == "n2" and hits[0]["details"]["actual_bytes"] == need - 1


def test_preflight_tracker_naming_a_missing_checkpoint_is_an_error(tmp_path):
    from helpers import spread
    src = dcp(tmp_path / "src" / "iter_0000100", world=2)
    loc = spread(src, tmp_path / "nodes", ["n1", "n2"], 1, tracker="300")
    rc, out, _ = cli("preflight", loc, "--nodelist", "n[1-2]", "--ranks-per-node", "1", "-f", "json")
    hits = [f for f in json.loads(out)["findings"] if f["rule"] == "CKD406"]
    assert rc == 1 and hits and hits[0]["details"]["tracker_names"] == "iter_0000300"
    assert hits[0]["details"]["newest_reachable"] == "iter_0000100"
