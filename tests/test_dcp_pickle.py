"""The memo-free `.metadata` reader (io.dcp_pickle) against the C unpickler path, in both
directions: on files torch writes it must read exactly what the C path reads (and actually take
its lanes, or the 1M peak is not what the benchmarks say), and on damaged files every verdict, an
error's wording included, must be the C path's: the fast reader either agrees or declines."""
from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from ckptdoctor import api
from ckptdoctor.io import dcp_pickle as P
from ckptdoctor.io.unpickle import RefusedGlobal
from ckptdoctor.layouts import dcp as D

FIXTURES = Path(__file__).parent / "fixtures" / "dcp_metadata"   # torch-written, read where torch is not

SHAPES = r'''
import sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed.checkpoint as dcp
sd = {"model": {}, "optim": {"state": {}}, "step": 7, "blob": {"cfg": "x" * 40, "ids": [1, 2, 3]}}
shapes = [(), (5,), (3, 4), (2, 3, 4), (2, 1, 3, 3), (1, 2, 1, 2, 2)]
dtypes = [torch.float32, torch.bfloat16, torch.int64, torch.float16, torch.bool, torch.uint8]
for i in range(1500):
    sd["model"][f"layers.{i // 7}.w{i % 7}"] = torch.zeros(shapes[i % 6], dtype=dtypes[i % 5])
sd["model"]["emb.\u00e9t\u00e9.\u4e2d"] = torch.ones(3)              # non-ASCII names
sd["model"]["x" * 300] = torch.ones(2)                            # BINUNICODE, not SHORT_
sd["model"]["big"] = torch.zeros(70000, 2)                        # offsets past 65535 (BININT)
for i in range(600):
    sd["optim"]["state"][f"p{i}"] = {"exp_avg": torch.zeros(4), "step": torch.tensor(float(i))}
dcp.save(sd, checkpoint_id=sys.argv[1], no_dist=True)
'''

REDUMP = r'''
import sys, pickle, warnings
warnings.filterwarnings("ignore")
import torch.distributed.checkpoint as dcp
md = dcp.FileSystemReader(sys.argv[1]).read_metadata()
pickle.dump(md, open(sys.argv[1] + "/.metadata", "wb"))
'''


@pytest.fixture(scope="module")
def torch_files(tmp_path_factory, fixture_root):
    """`.metadata` files torch wrote: a save of many shapes, dtypes and names; the layout
    benchmarks/common.build_torch_metadata measures (ckptdoctor's writer, read and re-dumped by
    torch); and every file of the session's real fixtures (single, 4-rank gloo, per-rank
    metadata, deduplicated, torchtitan steps)."""
    from ckptdoctor.layouts import dcp_writer as W
    root = tmp_path_factory.mktemp("pk")
    out = {}
    subprocess.run([sys.executable, "-c", SHAPES, str(root / "shapes")], check=True)
    out["shapes"] = root / "shapes" / ".metadata"
    d = root / "redump"
    items = [W.Item(f"layers.{f}.p{j}", (300, 1), (0, 0), (1, 1), [0.5], rank=f) for f in range(8) for j in range(300)]
    for it in items:
        it.global_shape = (1, 1)
    W.write(str(d), items)
    subprocess.run([sys.executable, "-c", REDUMP, str(d)], check=True)
    out["redump"] = d / ".metadata"
    for p in sorted(Path(fixture_root).rglob("*.metadata")):
        out[str(p.relative_to(fixture_root))] = p
    return out


def reading(data: bytes, fast: bool, monkeypatch):
    """What `parse` says of `data`: the records, or the error's class and wording."""
    monkeypatch.setattr(D, "FAST", fast)
    try:
        return "ok", D.parse(data)
    except (D.MetadataError, RefusedGlobal, ValueError) as exc:
        return "error", type(exc).__name__, str(exc)


def test_torch_files_read_the_same_and_take_the_lanes(torch_files, monkeypatch):
    """Every file torch wrote reads as the C path reads it, and the big ones through the lanes:
    nearly every record matched (the rest are each dict's first records and the few a FRAME
    header splits)."""
    assert len(torch_files) >= 8, sorted(torch_files)
    for name, path in torch_files.items():
        data = path.read_bytes()
        c_path = reading(data, False, monkeypatch)
        assert c_path[0] == "ok", (name, c_path)
        got = P.load(data, D.TensorInfo, D.StorageEntry)
        assert got is not None, f"{name}: the fast reader declined a file torch wrote"
        monkeypatch.setattr(D, "FAST", True)
        fast = D._paused(lambda: D._fast(data, None))
        assert fast == c_path[1], name
        n = len(c_path[1].tensors)
        if n > 1000:
            assert got.counts["sdm"] > 0.97 * n and got.counts["sd"] > 0.97 * len(c_path[1].storage), (name, got.counts)
            assert got.counts["planner"] > 0.97 * n, (name, got.counts)
    shapes = D.parse(torch_files["shapes"].read_bytes())
    assert shapes.tensors["model.emb.\u00e9t\u00e9.\u4e2d"].size == (3,)
    assert shapes.tensors["model." + "x" * 300].size == (2,)
    assert shapes.tensors["model.layers.0.w0"].size == () and shapes.tensors["model.layers.0.w0"].dtype == "float32"
    assert shapes.tensors["model.layers.0.w4"].size == (2, 1, 3, 3)
    assert "blob" in shapes.byte_keys or any(k.startswith("blob") for k in shapes.byte_keys)
    assert max(s.file_offset for s in shapes.storage) > 65535


def _mutants(data: bytes, rng: random.Random, n: int):
    """Damage a real file the ways a disk or a bug does: a flipped or replaced byte (anywhere, and
    more often inside the records the lanes read), a cut, a byte dropped or doubled."""
    body = data.index(b"state_dict_metadata")
    for _ in range(n):
        kind = rng.random()
        at = rng.randrange(body, len(data)) if rng.random() < 0.8 else rng.randrange(len(data))
        if kind < 0.45:
            yield data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1:]
        elif kind < 0.7:
            yield data[:at] + bytes([rng.choice(b"\x94\x8chjKMJ()]}ubt\x85\x86\x87\x95NR\x81\x00\xff")]) + data[at + 1:]
        elif kind < 0.8:
            yield data[:at]
        elif kind < 0.9:
            yield data[:at] + data[at + 1:]
        else:
            yield data[:at] + data[at:at + 1] + data[at:]


def test_committed_torch_files_read_the_same_through_the_lanes(monkeypatch):
    """The `.metadata` files torch 2.13 wrote that tests/fixtures/dcp_metadata keeps (so that this
    runs on every Python CI tests, torch or not): the same records as the C path, lanes taken."""
    for path in sorted(FIXTURES.glob("*.metadata")):
        data = path.read_bytes()
        c_path = reading(data, False, monkeypatch)
        assert c_path[0] == "ok", (path.name, c_path)
        got = P.load(data, D.TensorInfo, D.StorageEntry)
        assert got is not None and min(got.counts.values()) > 50, (path.name, got and got.counts)
        monkeypatch.setattr(D, "FAST", True)
        assert D._paused(lambda: D._fast(data, None)) == c_path[1], path.name


def _damage_agrees(data: bytes, monkeypatch, n: int = 1200) -> int:
    """n damaged copies of `data`: `parse` (fast reader first) says exactly what the C path alone
    says, records or error wording.  Returns how many the fast reader vouched for itself."""
    rng = random.Random(20)
    vouched = 0
    for i, bad in enumerate(_mutants(data, rng, n)):
        c_path = reading(bad, False, monkeypatch)
        both = reading(bad, True, monkeypatch)
        assert both == c_path, f"mutant {i}: C {str(c_path)[:300]} / fast first {str(both)[:300]}"
        monkeypatch.setattr(D, "FAST", True)
        try:
            vouched += D._paused(lambda: D._fast(bad, None)) is not None
        except D.MetadataError:
            vouched += 1   # the fast reader built the graph; the shared check found the bad record
    return vouched


@pytest.mark.parametrize("name", ["shapes.metadata", "redump.metadata"])
def test_damaged_files_get_the_c_paths_verdict(monkeypatch, name):
    """1200 damaged copies of a file torch wrote, the same verdict either way; and the fast reader
    did vouch for a share of them itself (so this compares two readers, not one with itself)."""
    assert _damage_agrees((FIXTURES / name).read_bytes(), monkeypatch) > 100


def test_damaged_multi_rank_file_gets_the_c_paths_verdict(torch_files, monkeypatch):
    """The same for the 4-rank gloo save (row shards: several chunks per tensor, which the lanes
    leave to the machine)."""
    assert _damage_agrees(torch_files["dcp_4rank/.metadata"].read_bytes(), monkeypatch, 600) > 50


def test_a_declined_file_is_read_by_the_c_path_from_disk(tmp_path, fixture_root, monkeypatch):
    """Where the fast reader declines (here: the protocol-2 pickle ckptdoctor's own writer emits,
    with GLOBAL opcodes), verify still reads the file, through the rewound handle, and the
    verdict on a torch-written checkpoint is the same with the fast reader on and off."""
    from ckptdoctor.layouts import dcp_writer as W
    d = tmp_path / "w"
    W.write(str(d), [W.Item("a", (2, 2), (0, 0), (2, 2), [1.0] * 4, rank=0)])
    assert P.load((d / ".metadata").read_bytes(), D.TensorInfo, D.StorageEntry) is None
    assert not api.verify(str(d)).findings
    for fast in (True, False):
        monkeypatch.setattr(D, "FAST", fast)
        rep = api.verify(str(Path(fixture_root) / "dcp_4rank"))
        assert not [f for f in rep.findings if f.severity == "error"], (fast, [(f.rule, f.message) for f in rep.findings])


def test_hostile_bytes_are_declined_quickly():
    """Bytes built to make a regex backtrack (a planner record of MEMOIZE bytes), to push a
    million strings, to stack marks, or to make the lanes recompile: declined (the C path then words the error), and in
    bounded time: a hang here would stall every prolog that verifies."""
    import time
    for blob in (b"\x80\x04}\x94(\x8c\x0cplanner_data\x94}\x94(" + b"\x8c\xff" + b"\x94" * 300000,
                 b"\x80\x04" + b"\x8c" * 1_000_000, b"\x80\x04" + b"(" * 200_000 + b".",
                 b"\x80\x04\x95" + b"\xff" * 8,
                 # a key the lanes build their regexes from, memoized 200k times inside the dict
                 b"\x80\x04}\x94(\x8c\x13state_dict_metadata\x94}\x94(" + b"\x8c\x04size\x94" * 200_000):
        t = time.perf_counter()
        assert P.load(blob, D.TensorInfo, D.StorageEntry) is None
        assert time.perf_counter() - t < 5.0
