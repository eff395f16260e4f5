"""The `.metadata` reader: one parser (the restricted C unpickler), exact on torch's own files, and
the inputs that once made a second, memo-free reader disagree with it (issue 38) get its verdict."""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from ckptdoctor import api
from ckptdoctor.layouts import dcp
from conftest import needs_torch
from helpers import assert_fires

FIX = Path(__file__).parent / "fixtures" / "dcp_metadata"


@pytest.mark.parametrize("name", ["shapes.metadata", "redump.metadata"])
def test_torch_written_metadata_reads_on_every_python(name):
    md = dcp.parse((FIX / name).read_bytes())
    assert md.tensors and md.storage
    have = {(s.fqn, s.offset) for s in md.storage}
    for fqn, t in md.tensors.items():   # every chunk torch wrote has its storage record
        assert all((fqn, tuple(o)) in have for o, _ in t.chunks), fqn
    assert all((k, None) in have for k in md.byte_keys)


def _edit(d, fn):
    import torch.distributed.checkpoint.metadata  # noqa: F401 (trusted: the test made this file)
    md = pickle.loads((d / ".metadata").read_bytes())
    fn(md)
    (d / ".metadata").write_bytes(pickle.dumps(md))


def _shared_dict_with_junk(md):
    md.planner_data = md.state_dict_metadata   # pickled once, referenced twice
    md.state_dict_metadata["x"] = ("p", "q")


def _rekeyed(md):
    sdm = md.state_dict_metadata
    keys = [k for k, v in sdm.items() if hasattr(v, "chunks")]
    sdm[None] = sdm[keys[0]]                    # the same record under a second, non-str key
    sdm[keys[0]] = sdm[keys[-1]]


def _negative_length(md):
    last = list(md.storage_data)[-1]
    md.storage_data[last].length = -7


@needs_torch
@pytest.mark.parametrize("damage", [_shared_dict_with_junk, _rekeyed, _negative_length])
def test_hand_assembled_metadata_is_unreadable_not_healthy(real, damage):
    d = real("dcp_single")
    _edit(d, damage)
    rep = api.verify(str(d))
    assert_fires(rep, "CKD110", path_contains=".metadata", severity="error")
    assert rep.failed()


@pytest.mark.parametrize("module", ["numpy", "torch.nn", "builtins"])
def test_a_dtype_global_from_another_module_is_refused(tmp_path, module):
    """A dtype is a torch dtype: `numpy.float32` (or any other module's float32) in its place is a
    refused global (CKD110), never a healthy tensor."""
    from ckptdoctor.layouts import dcp_writer as W
    d = tmp_path / "ck"
    W.write(str(d), [W.Item("w", (2,), (0,), (2,), [1.0, 2.0])])
    md = d / ".metadata"
    raw = md.read_bytes()
    needle = b"ctorch\nfloat32\n"   # the writer's GLOBAL opcode for the dtype
    assert needle in raw
    md.write_bytes(raw.replace(needle, b"c" + module.encode() + b"\nfloat32\n", 1))
    rep = api.verify(str(d))
    hit = assert_fires(rep, "CKD110", severity="error")[0]
    assert hit.details.get("refused_global") and "float32" in hit.details["refused_global"]


def test_a_tensor_properties_record_written_by_torch_before_2_1_gives_its_dtype():
    """torch < 2.1 pickled TensorProperties' __dict__ (2.1+ a 5-tuple): both give the dtype."""
    from ckptdoctor.io.unpickle import DCP, loads_dcp
    from ckptdoctor.layouts import dcp_writer as W
    p = W._P()
    p.newobj(f"{DCP}.metadata", "TensorProperties")
    p.build_dict([("dtype", lambda: p.glob("torch", "bfloat16")), ("requires_grad", lambda: p.bool(False))])
    assert str(loads_dcp(p.getvalue()).dtype()) == "bfloat16"
    p = W._P()
    p.newobj(f"{DCP}.metadata", "TensorProperties")
    p.op(pickle.MARK)
    p.glob("torch", "float16")
    p.bool(False)
    p.op(pickle.TUPLE + pickle.BUILD)
    assert str(loads_dcp(p.getvalue()).dtype()) == "float16"


def test_megatron_core_metadata_which_pickles_dcp_planner_enums_is_read():
    """Megatron-Core 0.16's .metadata pickles DCP's SavePlan with WriteItemType members (by
    value): they resolve, and the real checkpoint verifies clean (fixture written by mcore itself)."""
    root = Path(__file__).parent / "fixtures" / "real" / "megatron-core" / "torch_dist"
    data = (root / "iter_0000001" / ".metadata").read_bytes()
    assert b"WriteItemType" in data
    md = dcp.parse(data)
    assert md.tensors and md.storage
    rep = api.verify(str(root / "iter_0000001"))
    assert not [f for f in rep.findings if f.rule in ("CKD110", "CKD900")] and not rep.failed()


def test_a_metadata_file_that_holds_another_dcp_object_names_that_objects_class():
    """A `.metadata` replaced by another pickled DCP object (a SavePlan a planner dumped) is
    unreadable, and the message names the class it holds, as torch's own class name."""
    from ckptdoctor.layouts import dcp_writer as W
    p = W._P()
    p.newobj("torch.distributed.checkpoint.planner", "SavePlan")
    p.build_dict([("items", lambda: p.op(pickle.EMPTY_LIST))])
    with pytest.raises(dcp.MetadataError, match=r"^pickle holds SavePlan, not DCP Metadata$"):
        dcp.parse(p.getvalue())


def test_a_foreign_object_is_shown_by_its_class_and_public_fields_not_its_private_state():
    """A stand-in for a pickled class outside the allow-list of types (what a run-state path that
    lands on an object prints) names torch's class and the fields a user can address."""
    from ckptdoctor.io.unpickle import bag_class
    b = bag_class("torch.distributed.checkpoint.planner.SavePlan")(items=[], planner_data=None)
    assert repr(b) == "<torch.distributed.checkpoint.planner.SavePlan ['items', 'planner_data']>"
