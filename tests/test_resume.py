"""Resume proofs: per-rank digests recorded at save time by a real 2-rank gloo FSDP2 job (AdamW,
LambdaLR, all RNG streams, DCP) and checked after a restore in new processes, in both
directions; an incomplete digest set is a verify finding; `digests diff` names items and ranks."""
import json
import os
from pathlib import Path

import pytest

from ckptdoctor import api
from conftest import _run_script
from helpers import assert_fires, assert_fires_json, cli

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _job(*args):
    _run_script("resume_job.py", *args, timeout=300)  # the session fixtures' runner: one line of failure output


def _results(out: Path) -> dict[int, str]:
    return {r: (out / f"rank{r}.txt").read_text() for r in range(2)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One healthy save and one whose rank 1 exp_avg changed between record() and dcp.save()."""
    base = tmp_path_factory.mktemp("resume")
    _job("save", base / "good", base / "good-save")
    _job("save", base / "bad", base / "bad-save", "--alter-rank", "1")
    return base


def test_check_in_the_saving_process_is_refused_as_proof(saved):
    assert _results(saved / "good-save") == {0: "refused", 1: "refused"}


def test_restore_in_new_processes_passes(saved, tmp_path):
    _job("load", saved / "good", tmp_path / "out")
    assert _results(tmp_path / "out") == {0: "ok", 1: "ok"}
    rep = api.verify(str(saved / "good"))  # the digests directory is part of a healthy checkpoint
    assert not rep.findings, [(f.rule, f.message) for f in rep.findings]


def test_altered_exp_avg_is_named_on_its_rank_only(saved, tmp_path):
    _job("load", saved / "bad", tmp_path / "out")
    res = _results(tmp_path / "out")
    assert res[0] == "ok"
    got = json.loads(res[1])
    assert got == {"differing": ["state/optim/state/0.weight/exp_avg"], "missing": [], "unexpected": []}


def test_incomplete_digest_set_is_a_verify_finding(saved, tmp_path):
    import shutil
    ck = tmp_path / "ck"
    shutil.copytree(saved / "good", ck)
    os.remove(ck / "ckptdoctor.digests" / "rank_00001.json")
    hit = assert_fires(api.verify(str(ck)), "CKD501", path_contains="ckptdoctor.digests")[0]
    assert hit.details["missing"] == ["rank_00001.json"] and hit.details["world_size"] == 2
    (ck / "ckptdoctor.digests" / "rank_00001.json").write_text("{not json")
    hit = assert_fires(api.verify(str(ck)), "CKD501", path_contains="rank_00001.json")[0]
    assert "not JSON" in hit.message


def test_mismatch_lists_differing_missing_and_unexpected(tmp_path, monkeypatch):
    from ckptdoctor import resume
    state = {"w": torch.arange(6.0).reshape(2, 3), "opt": {"lr": 0.1, "betas": (0.9, 0.99)}, "step": 5,
             "gone": torch.zeros(2)}
    resume.record(state, str(tmp_path), rank=0, rng=False)
    resume.record({"t": torch.zeros(3), "z": -0.0}, str(tmp_path / "b"), rank=0, rng=False)
    monkeypatch.setattr(resume, "process_identity", lambda: {"host": "elsewhere", "pid": 1, "boot_id": "b",
                                                             "start_time": "1"})  # stands for a new process
    now = {"w": torch.arange(6.0).reshape(2, 3), "opt": {"lr": 0.1, "betas": (0.9, 0.999)}, "step": 5.0,
           "new": 1}
    with pytest.raises(resume.ResumeMismatch) as ei:
        resume.check(now, str(tmp_path), rank=0, rng=False)
    e = ei.value
    assert e.differing == ["state/opt/betas/1", "state/step"]
    assert e.missing == ["state/gone"] and e.unexpected == ["state/new"]
    assert "state/opt/betas/1" in str(e) and "rank 0" in str(e)
    # dtype and shape changes are named as such, -0.0 is not 0.0
    with pytest.raises(resume.ResumeMismatch) as ei:
        resume.check({"t": torch.zeros(3, dtype=torch.float64), "z": 0.0}, str(tmp_path / "b"), rank=0, rng=False)
    assert ei.value.detail["state/t"].startswith("dtype torch.float64 now") and "state/z" in ei.value.differing


def test_objects_without_a_state_are_refused_by_name(tmp_path):
    from ckptdoctor import resume
    with pytest.raises(TypeError, match="state/cb: cannot digest a builtins.function"):
        resume.record({"cb": lambda: 1}, str(tmp_path), rank=0, rng=False)


def test_digests_diff_names_ranks_and_items(tmp_path):
    from ckptdoctor import resume
    for name, scale in (("a", 1.0), ("b", 2.0)):
        for r in range(2):
            resume.record({"w": torch.ones(3) * (scale if r == 1 else 1.0), "step": 3}, str(tmp_path / name),
                          rank=r, world_size=2, rng=False)
    rc, out, err = cli("digests", "diff", str(tmp_path / "a"), str(tmp_path / "b"), "-f", "json")
    assert rc == 1, err
    doc = json.loads(out)
    (f,) = assert_fires_json(doc, "CKD502")
    assert f["rule"] == "CKD502" and f["details"]["rank"] == 1 and f["details"]["differing"] == ["state/w"]
    assert doc["facts"]["ranks"] == {"compared": 2, "only_in_one": 0, "differing": 1}
    rc, out, err = cli("digests", "diff", str(tmp_path / "a"), str(tmp_path / "a"))
    assert rc == 0, out + err
    rc, out, err = cli("digests", "diff", str(tmp_path / "a"), str(tmp_path / "nothing"))
    assert rc == 2 and "nothing" in err and "Traceback" not in err


_ADAM_JOB = r"""
import json, sys, torch
from ckptdoctor import resume
mode, d = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Linear(3, 2)
opt = torch.optim.AdamW(model.parameters(), lr=0.1)
if mode == "save":
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, d + "/ckpt.pt")
    resume.record({"model": model, "optim": opt}, d, rank=0, world_size=1, rng=False)
    print("saved")
else:
    sd = torch.load(d + "/ckpt.pt", weights_only=True)
    if mode == "str-keys":   # restored through a JSON-ish path: the param ids became strings
        sd["optim"]["state"] = {str(k): v for k, v in sd["optim"]["state"].items()}
    if mode == "reshaped":
        sd["model"]["weight"] = sd["model"]["weight"].reshape(3, 2).contiguous()
        model.weight = torch.nn.Parameter(torch.empty(3, 2))
    model.load_state_dict(sd["model"])
    opt.load_state_dict(sd["optim"])
    try:
        resume.check({"model": model, "optim": opt}, d, rank=0, rng=False)
        print("proved")
    except resume.ResumeMismatch as exc:
        print("mismatch", json.dumps({"differing": exc.differing, "missing": exc.missing,
                                      "unexpected": exc.unexpected, "detail": exc.detail}))
"""


def _adam(tmp_path, mode):
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-c", _ADAM_JOB, mode, str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    word, _, rest = p.stdout.strip().partition(" ")
    return word, (json.loads(rest) if rest else None)


def test_digests_tell_int_keys_from_str_keys_of_a_real_optimizer(tmp_path):
    """AdamW restored with str state keys "0", "1" leaves its moments attached to no parameter
    (torch accepts the dict); the proof must fail, naming the moved items."""
    assert _adam(tmp_path, "save")[0] == "saved"
    assert _adam(tmp_path, "same") == ("proved", None)
    word, got = _adam(tmp_path, "str-keys")
    assert word == "mismatch"
    assert "state/optim/state/0/exp_avg" in got["missing"] and "state/optim/state/'0'/exp_avg" in got["unexpected"]


def test_a_weight_restored_reshaped_with_the_same_bytes_is_no_proof(tmp_path):
    assert _adam(tmp_path, "save")[0] == "saved"
    word, got = _adam(tmp_path, "reshaped")
    assert word == "mismatch" and got["detail"]["state/model/weight"].startswith("shape [3, 2] now")


def test_rng_streams_can_be_chosen_and_same_process_needs_the_explicit_override(tmp_path):
    from ckptdoctor import resume
    resume.record({"w": [1, 2]}, str(tmp_path), rank=0, world_size=1, rng={"python"})
    with pytest.raises(resume.NotAProof, match="allow_same_process"):
        resume.check({"w": [1, 2]}, str(tmp_path), rank=0, rng={"python"})
    assert resume.check({"w": [1, 2]}, str(tmp_path), rank=0, rng={"python"}, allow_same_process=True).items == 3
    assert resume.check({"w": [1, 2]}, str(tmp_path), rank=0, rng=False, allow_same_process=True).items == 2
    import random
    random.random()   # the python stream moved: a proof that checks it fails
    with pytest.raises(resume.ResumeMismatch, match="rng/python"):
        resume.check({"w": [1, 2]}, str(tmp_path), rank=0, rng={"python"}, allow_same_process=True)
    with pytest.raises(ValueError, match="unknown stream"):
        resume.check({"w": [1, 2]}, str(tmp_path), rank=0, rng={"cuda"}, allow_same_process=True)


# ---- generated survivors of the resume group's run (session 23) ------------------------------------
def _dcp_checkpoint(d):
    from ckptdoctor.layouts import dcp_writer as W
    W.write(str(d), [W.Item("w", (2, 2), (0, 0), (2, 2), [1.0] * 4, rank=0)])
    return d


def test_a_digest_set_missing_seven_of_eight_ranks_names_five_and_counts_the_rest(tmp_path):
    from ckptdoctor import resume
    ck = _dcp_checkpoint(tmp_path / "ck")
    resume.record({"w": [1]}, str(ck), rank=0, world_size=8, rng=False)
    (hit,) = assert_fires(api.verify(str(ck)), "CKD501", severity="error")
    assert hit.message.endswith("7 of 8 rank digest file(s) missing: rank_00001.json, rank_00002.json, "
                                "rank_00003.json, rank_00004.json, rank_00005.json and 2 more"), hit.message


def test_a_digest_directory_ignores_other_files_and_a_directory_named_like_a_rank_file(tmp_path):
    from ckptdoctor import resume
    ck = _dcp_checkpoint(tmp_path / "ck")
    resume.record({"w": [1]}, str(ck), rank=0, world_size=1, rng=False)
    (ck / resume.DIR / "README.txt").write_text("notes")
    (ck / resume.DIR / "rank_00001.json").mkdir()
    rep = api.verify(str(ck))
    assert not [f for f in rep.findings if f.rule == "CKD501"], [f.message for f in rep.findings]


def test_a_mismatch_message_shows_twenty_items_and_marks_more_with_dots():
    from ckptdoctor import resume
    twenty = resume.ResumeMismatch(0, [f"w{i}" for i in range(20)], [], [])
    assert str(twenty).endswith("20 item(s) differ: " + ", ".join(f"w{i}" for i in range(20)))
    more = resume.ResumeMismatch(0, [f"w{i}" for i in range(21)], [], [])
    assert str(more).endswith(", w19 ...")


def test_a_digest_names_a_layout_change_and_otherwise_says_the_bytes_differ():
    from ckptdoctor import resume
    a = resume.Digest("dtensor", "x", "torch.float32", (4,), "global [8] ['Shard(dim=0)']")
    b = resume.Digest("dtensor", "y", "torch.float32", (4,), "global [8] ['Replicate()']")
    assert a.describe(b) == "layout global [8] ['Replicate()'] now, global [8] ['Shard(dim=0)'] when saved"
    assert a.describe(resume.Digest("dtensor", "y", "torch.float32", (4,), a.extra)) == "bytes differ"


def test_complex_values_are_digested_by_their_exact_parts():
    from ckptdoctor import resume
    import xxhash
    d = resume.digest_state({"c": 1 + 2j, "n": complex(0.0, -0.0), "p": complex(0.0, 0.0)})
    assert d["c"].digest == xxhash.xxh3_128(b"c" + (1.0).hex().encode() + b"," + (2.0).hex().encode()).hexdigest()
    assert d["n"].digest != d["p"].digest        # -0.0 and 0.0 stay distinct, as for floats


def test_a_state_nested_deeper_than_64_lists_is_refused_in_one_line():
    """A leaf 64 levels down is digested; one level deeper is refused."""
    from ckptdoctor import resume

    def nested(levels):
        deep = 1
        for _ in range(levels):
            deep = [deep]
        return deep
    assert len(resume.digest_state(nested(64))) == 1
    with pytest.raises(TypeError, match=r"nested deeper than 64 levels$"):
        resume.digest_state(nested(65))
    with pytest.raises(TypeError, match=r"nested deeper than 64 levels$"):
        resume.digest_state(nested(71))


def test_the_numpy_stream_is_recorded_when_numpy_is_in_use_and_follows_its_state():
    import numpy as np
    from ckptdoctor import resume
    np.random.seed(1)
    a = resume.rng_state(("numpy",))
    np.random.random()
    b = resume.rng_state(("numpy",))
    assert list(a) == ["numpy"] and a["numpy"].digest != b["numpy"].digest


@pytest.mark.parametrize("bad", [1, 0.5, 0, 0.0])
def test_rng_that_is_neither_a_flag_nor_stream_names_is_a_one_line_error(tmp_path, bad):
    from ckptdoctor import resume
    with pytest.raises(ValueError, match=rf"^rng={bad}: pass True, False or stream names"):
        resume.record({"w": [1]}, str(tmp_path), rank=0, world_size=1, rng=bad)


@pytest.mark.parametrize("rank,world", [(5, 2), (2, 2), (-1, 2)])
def test_a_rank_outside_the_world_is_refused_when_recording(tmp_path, rank, world):
    from ckptdoctor import resume
    with pytest.raises(ValueError, match=rf"^rank {rank} is outside a world of {world}"):
        resume.record({"w": [1]}, str(tmp_path), rank=rank, world_size=world, rng=False)


@pytest.mark.parametrize("rank", [-1, 2, 3, 300])
def test_a_digest_file_with_a_rank_outside_its_world_is_refused(rank):
    from ckptdoctor import resume
    doc = {"format": resume.FORMAT, "rank": rank, "world_size": 2, "items": {}}
    with pytest.raises(ValueError, match=r"^f\.json: rank, world_size or items missing or out of range$"):
        resume.parse(json.dumps(doc).encode(), "f.json")


def test_a_digest_file_over_the_size_bound_is_refused_in_one_line_naming_it(tmp_path, monkeypatch):
    import re
    from ckptdoctor import resume
    path = resume.record({"w": list(range(50))}, str(tmp_path), rank=0, world_size=1, rng=False)
    monkeypatch.setattr(resume, "MAX_DIGEST_FILE", 64)
    with pytest.raises(ValueError, match=rf"^{re.escape(path)}: \d+ bytes, larger than the 64-byte limit for this file$"):
        resume.load(path)


def test_bytes_values_are_digested_by_their_exact_bytes_and_never_like_a_string():
    """A bytes leaf (a tokenizer blob, a packed RNG state) is digested as its bytes, marked as bytes:
    b"abc" and "abc" differ, one changed byte differs, and empty bytes are a value of their own."""
    import xxhash
    from ckptdoctor import resume
    d = resume.digest_state({"b": b"abc", "s": "abc", "ba": bytearray(b"abc"), "e": b"", "x": b"abd"})
    assert d["b"].digest == xxhash.xxh3_128(b"babc").hexdigest() == d["ba"].digest
    assert len({d["b"].digest, d["s"].digest, d["e"].digest, d["x"].digest}) == 4


@pytest.mark.parametrize("kind", ["dict", "state_dict"])
def test_a_state_nested_64_levels_of_dicts_or_state_dicts_is_digested_and_65_refused(kind):
    """The 64-level bound counts every level alike: nested dicts, and objects whose state_dict() holds
    another such object (a wrapper around a wrapper)."""
    from ckptdoctor import resume

    class Wrap:
        def __init__(self, inner):
            self.inner = inner

        def state_dict(self):
            return self.inner

    def nested(levels):
        deep = 1
        for _ in range(levels):
            deep = {"k": deep} if kind == "dict" else Wrap(deep)
        return deep
    assert len(resume.digest_state(nested(64))) == 1
    for levels in (65, 66, 127):
        with pytest.raises(TypeError, match=r"nested deeper than 64 levels$"):
            resume.digest_state(nested(levels))


def test_numpy_arrays_are_digested_by_dtype_shape_and_bytes():
    import numpy as np
    import xxhash
    from ckptdoctor import resume
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    d = resume.digest_state({"a": a, "t": a.T, "e": np.zeros((0, 3))})
    assert d["a"].digest == xxhash.xxh3_128(a.tobytes()).hexdigest() and d["a"].shape == (2, 3)
    assert d["a"].dtype == "numpy.int32" and d["t"].digest == xxhash.xxh3_128(a.T.copy().tobytes()).hexdigest()
    assert d["e"].digest == xxhash.xxh3_128(b"").hexdigest() and d["e"].shape == (0, 3)


def test_a_one_element_tensor_is_digested_by_its_value():
    torch = pytest.importorskip("torch")
    from ckptdoctor import resume
    d = resume.digest_state({"a": torch.tensor([5.0]), "b": torch.tensor([6.0]), "e": torch.zeros(0)})
    assert len({d["a"].digest, d["b"].digest, d["e"].digest}) == 3


@pytest.mark.parametrize("fmt", ["ckptdoctor.digests/v0", "ckptdoctor.digests/v2", "other", None])
def test_a_digest_file_of_another_format_is_refused(fmt):
    from ckptdoctor import resume
    doc = {"format": fmt, "rank": 0, "world_size": 1, "items": {}}
    with pytest.raises(ValueError, match=r"^f\.json: not a ckptdoctor\.digests/v1 file$"):
        resume.parse(json.dumps(doc).encode(), "f.json")


def test_a_digest_file_that_cannot_be_read_says_why_in_one_line(tmp_path):
    from ckptdoctor import resume
    (tmp_path / "rank_00000.json").mkdir()
    with pytest.raises(ValueError) as ei:
        resume.load(str(tmp_path / "rank_00000.json"))
    assert str(ei.value) == f"{tmp_path}/rank_00000.json: cannot read (a directory, not a regular file; not read)"
    with pytest.raises(ValueError, match=r": cannot read \(No such file or directory\)$"):
        resume.load(str(tmp_path / "absent.json"))


def test_a_digest_says_a_tensor_became_a_value_and_a_value_a_tensor():
    from ckptdoctor import resume
    t = resume.Digest("tensor", "x", "torch.float32", (2,))
    v = resume.Digest("value", "y")
    assert t.describe(v) == "value now, tensor when saved" and v.describe(t) == "tensor now, value when saved"


def test_a_mismatch_of_fewer_than_twenty_items_shows_them_all_without_dots():
    from ckptdoctor import resume
    assert str(resume.ResumeMismatch(0, ["w0", "w1"], [], [])).endswith("2 item(s) differ: w0, w1")


@pytest.mark.parametrize("world", [3, 6])
def test_a_digest_set_missing_five_ranks_or_fewer_names_them_all_and_no_more(tmp_path, world):
    from ckptdoctor import resume
    ck = _dcp_checkpoint(tmp_path / "ck")
    resume.record({"w": [1]}, str(ck), rank=0, world_size=world, rng=False)
    (hit,) = assert_fires(api.verify(str(ck)), "CKD501", severity="error")
    names = ", ".join(f"rank_{r:05d}.json" for r in range(1, world))
    assert hit.message.endswith(f"{world - 1} of {world} rank digest file(s) missing: {names}"), hit.message


def test_a_rank_file_past_rank_256_is_matched_to_its_rank_by_value(tmp_path):
    """rank_00300.json saying rank 300 is that rank's file (compared by value, not identity)."""
    from ckptdoctor import resume
    ck = _dcp_checkpoint(tmp_path / "ck")
    resume.record({"w": [1]}, str(ck), rank=300, world_size=301, rng=False)
    rep = api.verify(str(ck))
    assert not [f for f in rep.findings if "unreadable" in f.message], [f.message for f in rep.findings]
    (hit,) = assert_fires(rep, "CKD501", severity="error")
    assert hit.message.startswith(f"{resume.DIR}: 300 of 301 rank digest file(s) missing: rank_00000.json, ") and \
        hit.message.endswith(" and 295 more"), hit.message


def test_a_digest_directory_with_only_an_unreadable_rank_file_names_it_and_nothing_else(tmp_path):
    from ckptdoctor import resume
    ck = _dcp_checkpoint(tmp_path / "ck")
    (ck / resume.DIR).mkdir()
    (ck / resume.DIR / "rank_00000.json").write_text("{not json")
    msgs = [f.message for f in api.verify(str(ck)).findings if f.rule == "CKD501"]
    assert len(msgs) == 1 and "rank_00000.json is unreadable" in msgs[0] and "disagree" not in msgs[0], msgs


def test_a_digest_file_one_byte_past_256_mib_is_refused_unread(tmp_path):
    """The digest file's bound is 256 MiB (a million items' digests fit in a tenth of it): a sparse file
    one byte past it is refused from its size alone, naming the limit."""
    from ckptdoctor import resume
    p = tmp_path / "rank_00000.json"
    with open(p, "wb") as fh:
        fh.truncate((256 << 20) + 1)
    with pytest.raises(ValueError, match=rf"{(256 << 20) + 1} bytes, larger than the {256 << 20}-byte limit"):
        resume.load(str(p))


@pytest.mark.parametrize("kind", ["cuda", "npu", "aiu"])
def test_a_tensor_on_an_accelerator_is_digested_by_its_bytes_copied_to_the_host(kind):
    """A rank saves from its GPU and proves its resume by the same bytes a CPU copy has (no
    accelerator here: a stand-in reports its device and gives its bytes only through .cpu()).  Any
    device but "cpu": a backend renamed from PrivateUse1 may be called anything, "aiu" included."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace
    from ckptdoctor import resume
    host = torch.arange(6, dtype=torch.float32).reshape(2, 3)

    class OnAccelerator:
        device, dtype, shape = SimpleNamespace(type=kind), host.dtype, host.shape

        def detach(self):
            return self

        def cpu(self):
            return host.clone()
    assert resume._tensor(OnAccelerator()) == resume.digest_state({"w": host})["w"]


_SHARDED_JOB = r"""
import json, sys, tempfile, warnings, torch, torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor, Shard
from torch.distributed._shard.metadata import ShardMetadata
from ckptdoctor import resume
warnings.simplefilter("ignore")
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
def sharded(top, bottom):   # handed over bottom first: the digest must follow the offsets, not the order
    shards = [Shard(bottom, ShardMetadata([2, 0], [2, 3], "rank:0/cpu")),
              Shard(top, ShardMetadata([0, 0], [2, 3], "rank:0/cpu"))]
    return ShardedTensor._init_from_local_shards(shards, [4, 3])
a, b = torch.arange(6.).reshape(2, 3), torch.arange(6., 12.).reshape(2, 3)
d = resume.digest_state({"w": sharded(a, b), "v": sharded(a, b + 1)})
print(json.dumps({k: [x.kind, x.digest, x.shape, x.extra] for k, x in d.items()}))
"""


def test_a_legacy_sharded_tensor_is_digested_by_its_local_shards_in_offset_order():
    """torch's ShardedTensor (still in older FSDP/TorchRec state dicts): its local shards' bytes in
    offset order, with the global shape -- one changed shard changes the digest."""
    pytest.importorskip("torch")
    import subprocess
    import sys
    import xxhash
    p = subprocess.run([sys.executable, "-c", _SHARDED_JOB], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    import numpy as np
    top, bottom = np.arange(6, dtype=np.float32), np.arange(6, 12, dtype=np.float32)
    assert d["w"] == ["sharded", xxhash.xxh3_128(top.tobytes() + bottom.tobytes()).hexdigest(), [4, 3],
                      "local shards at [[0, 0], [2, 0]]"]
    assert d["v"][1] != d["w"][1]


def test_a_digest_file_that_is_not_json_quotes_at_most_80_characters_of_the_parsers_error(monkeypatch):
    """The parser's own words, cut at 80 characters (made long here: its messages differ between
    Python versions)."""
    from ckptdoctor import resume
    said = "the parser's explanation, " * 10

    def parser_says(*a, **k):
        raise ValueError(said)
    monkeypatch.setattr(resume.json, "loads", parser_says)
    with pytest.raises(ValueError) as ei:
        resume.parse(b"{not json", "rank_00000.json")
    assert str(ei.value) == f"rank_00000.json: not JSON ({said[:80]})"


def test_digests_diff_says_what_differs_and_what_is_only_on_either_side_and_nothing_more(tmp_path):
    """CKD502's sentence per rank: the differing items, those only in the first set, those only in
    the second -- each part present exactly when it has items."""
    torch = pytest.importorskip("torch")
    from ckptdoctor import resume
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    resume.record({"w": torch.ones(3), "gone": 1}, a, rank=0, world_size=2, rng=False)
    resume.record({"w": torch.ones(3) * 2, "new": 1}, b, rank=0, world_size=2, rng=False)
    resume.record({"w": torch.ones(3)}, a, rank=1, world_size=2, rng=False)
    resume.record({"w": torch.ones(3) * 2}, b, rank=1, world_size=2, rng=False)
    rc, out, err = cli("digests", "diff", a, b, "-f", "json")
    assert rc == 1, err
    hits = {f["details"]["rank"]: f["message"] for f in assert_fires_json(json.loads(out), "CKD502")}
    assert hits == {0: f"rank 0: 1 differ: state/w (bytes differ); 1 only in {a}: state/gone; 1 only in {b}: state/new",
                    1: "rank 1: 1 differ: state/w (bytes differ)"}, hits
    resume.record({"w": torch.ones(3), "gone": 1}, a, rank=1, world_size=2, rng=False)    # only lacks one item
    resume.record({"w": torch.ones(3)}, b, rank=1, world_size=2, rng=False)
    rc, out, err = cli("digests", "diff", a, b, "-f", "json")
    hits = {f["details"]["rank"]: f["message"] for f in assert_fires_json(json.loads(out), "CKD502")}
    assert hits[1] == f"rank 1: 1 only in {a}: state/gone", hits


def test_digests_diff_names_a_rank_recorded_on_one_side_only(tmp_path):
    from ckptdoctor import resume
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for r in (0, 1):
        resume.record({"w": 1}, a, rank=r, world_size=2, rng=False)
    resume.record({"w": 1}, b, rank=0, world_size=2, rng=False)
    rc, out, err = cli("digests", "diff", a, b, "-f", "json")
    (hit,) = assert_fires_json(json.loads(out), "CKD502")
    assert rc == 1 and hit["message"] == f"rank 1 has digests only in {a}" and hit["details"]["only_in"] == a, hit


def test_a_digest_read_back_from_its_file_says_bytes_differ_when_only_the_bytes_do(tmp_path):
    """The saved digest comes from JSON and the new one from the tensor: equal shapes held in
    different tuples are the same shape, not a "shape change"."""
    torch = pytest.importorskip("torch")
    from ckptdoctor import resume
    resume.record({"w": torch.ones(2, 3)}, str(tmp_path), rank=0, world_size=1, rng=False)
    saved = resume.load(resume.path_for(str(tmp_path), 0)).items
    now = resume.digest_state({"state": {"w": torch.zeros(2, 3)}})
    key = next(iter(saved))
    assert saved[key].shape == now[key].shape and saved[key].describe(now[key]) == "bytes differ"


def test_the_torch_cpu_stream_is_recorded_when_torch_is_in_use_and_follows_its_seed():
    torch = pytest.importorskip("torch")
    from ckptdoctor import resume
    torch.manual_seed(1)
    a = resume.rng_state(("torch_cpu",))
    torch.manual_seed(2)
    b = resume.rng_state(("torch_cpu",))
    assert list(a) == ["torch_cpu"] and a["torch_cpu"].digest != b["torch_cpu"].digest


@pytest.mark.parametrize("initialized", [False, True])
def test_the_cuda_stream_is_recorded_only_where_cuda_is_already_in_use(monkeypatch, initialized):
    """Asking for the CUDA generators initializes CUDA: a process that never used its GPU must
    not get a CUDA context from a digest (no GPU here: torch.cuda answers as on a GPU node)."""
    torch = pytest.importorskip("torch")
    from ckptdoctor import resume
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialized)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: asked.append(1) or [torch.zeros(8, dtype=torch.uint8)])
    got = resume.rng_state(("torch_cuda",))
    assert (list(got), asked) == ((["torch_cuda"], [1]) if initialized else ([], []))


def test_a_machine_without_a_boot_id_records_the_process_without_one(monkeypatch):
    """No /proc (a container without it, macOS): the identity is still recorded, boot_id None."""
    import builtins
    from ckptdoctor import resume

    def no_proc(path, *a, **k):
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(2, "No such file or directory", path)
        return builtins.open(path, *a, **k)
    monkeypatch.setattr(resume, "open", no_proc, raising=False)
    ident = resume.process_identity()
    assert ident["boot_id"] is None and ident["pid"] == os.getpid() and ident["host"]


@pytest.mark.parametrize("worlds", [(2, 4), (2, 4, 8)])
def test_rank_files_from_saves_of_different_world_sizes_are_named_as_mixed(tmp_path, worlds):
    """Two world sizes among the rank files are already two saves mixed (not only three)."""
    from ckptdoctor import resume
    ck = _dcp_checkpoint(tmp_path / "ck")
    for r, w in enumerate(worlds):
        resume.record({"w": [1]}, str(ck), rank=r, world_size=w, rng=False)
    (hit,) = assert_fires(api.verify(str(ck)), "CKD501", severity="error")
    assert hit.details == {"world_sizes": list(worlds)} and "disagree on the world size" in hit.message, hit.message


def test_a_digest_keeps_its_dtype_shape_and_layout_through_its_file_and_writes_no_empty_fields():
    from ckptdoctor import resume
    full = resume.Digest("dtensor", "ab", "torch.float32", (4, 2), "global [8, 2] ['Shard(dim=0)']")
    assert resume.Digest.from_json(json.loads(json.dumps(full.to_json()))) == full
    bare = resume.Digest("value", "cd")
    assert bare.to_json() == {"kind": "value", "xxh3_128": "cd"} and resume.Digest.from_json(bare.to_json()) == bare


def test_distinct_dict_keys_never_share_a_digest_path():
    """Keys of different types or spellings are never merged into one item: an int and its string,
    a float and the string spelling its typed form, quotes, '#', '/', '%' and bools."""
    from ckptdoctor import resume
    keys = [0, "0", -1, "-1", 1.5, "float:1.5", "'0'", "#1", True, "bool:True", "a/b", "a%2Fb", "x:y", "'x:y'"]
    d = resume.digest_state({k: i for i, k in enumerate(keys)})
    assert len(d) == len(keys), sorted(d)


def test_an_empty_dict_or_list_is_digested_where_it_sits():
    from ckptdoctor import resume
    d = resume.digest_state({"a": {}, "b": [], "c": {"d": {}}})
    assert sorted(d) == ["a", "b", "c/d"] and d["a"].digest != d["b"].digest
    assert list(resume.digest_state({})) == ["<root>"]


@pytest.mark.parametrize("record", [{"kind": "tensor"}, {"xxh3_128": "ab"}, {"kind": 1, "xxh3_128": "ab"},
                                    {"kind": "tensor", "xxh3_128": 5}, ["tensor", "ab"]])
def test_a_digest_record_without_its_kind_or_hash_is_refused_in_one_line(record):
    from ckptdoctor import resume
    with pytest.raises(ValueError, match=r"^not a digest record: "):
        resume.Digest.from_json(record)


def test_a_torch_built_without_distributed_still_digests_plain_tensors(monkeypatch):
    """Some builds (macOS wheels of older releases, minimal containers) ship torch without
    torch.distributed: DTensor and ShardedTensor are then simply not there."""
    torch = pytest.importorskip("torch")
    import sys
    from ckptdoctor import resume
    want = resume.digest_state({"w": torch.ones(2)})
    monkeypatch.setitem(sys.modules, "torch.distributed.tensor", None)
    monkeypatch.setitem(sys.modules, "torch.distributed._shard.sharded_tensor", None)
    assert resume.digest_state({"w": torch.ones(2)}) == want


def test_a_digest_file_with_a_bad_record_is_refused_naming_the_file():
    from ckptdoctor import resume
    doc = {"format": resume.FORMAT, "rank": 0, "world_size": 1, "items": {"state/w": {"kind": "tensor"}}}
    with pytest.raises(ValueError, match=r"^rank_00000\.json: not a digest record: "):
        resume.parse(json.dumps(doc).encode(), "rank_00000.json")


def test_without_a_process_group_or_arguments_a_process_is_rank_0_of_1(tmp_path):
    """A single-process job records as rank 0 of a world of 1, so its own directory is complete."""
    from ckptdoctor import resume
    path = resume.record({"w": [1]}, str(tmp_path), rng=False)
    ds = resume.load(path)
    assert (ds.rank, ds.world_size) == (0, 1) and path == resume.path_for(str(tmp_path), 0)
    with pytest.raises(ValueError, match=r"^rank 1 is outside a world of 1 \(pass world_size="):
        resume.record({"w": [1]}, str(tmp_path), rank=1, rng=False)


@pytest.mark.parametrize("now", [{"w": 1}, {"w": 1, "step": 5, "extra": 0}], ids=["an-item-missing", "an-item-unexpected"])
def test_a_restore_that_only_lacks_or_only_adds_an_item_is_no_proof(tmp_path, monkeypatch, now):
    """Every saved item restored with the same digest and nothing else: one item missing (nothing
    differing) or one item more is a mismatch on its own."""
    from ckptdoctor import resume
    resume.record({"w": 1, "step": 5}, str(tmp_path), rank=0, world_size=1, rng=False)
    monkeypatch.setattr(resume, "process_identity", lambda: {"host": "elsewhere", "pid": 1, "boot_id": "b",
                                                             "start_time": "1"})  # stands for a new process
    with pytest.raises(resume.ResumeMismatch) as ei:
        resume.check(now, str(tmp_path), rank=0, rng=False)
    assert (ei.value.differing, ei.value.missing, ei.value.unexpected) == \
        (([], ["state/step"], []) if len(now) == 1 else ([], [], ["state/extra"]))


def test_a_layout_read_back_from_its_file_is_the_same_layout():
    """A sharded digest's layout from the saved JSON against the one computed now: equal text is the
    same layout (only the bytes differ), whatever string objects hold it."""
    from ckptdoctor import resume
    offs = [[0, 0], [2, 0]]
    saved = resume.Digest.from_json(json.loads(json.dumps(
        resume.Digest("sharded", "a", "torch.float32", (4, 3), f"local shards at {offs}").to_json())))
    now = resume.Digest("sharded", "b", "torch.float32", (4, 3), "local shards at " + str(offs))
    assert saved.describe(now) == "bytes differ"


def test_check_compares_the_rng_streams_by_default(tmp_path, monkeypatch):
    """A restore that forgot the RNG state is no proof unless the caller opts out (rng=False)."""
    import random
    from ckptdoctor import resume
    random.seed(1)
    resume.record({"w": 1}, str(tmp_path), rank=0, world_size=1)
    monkeypatch.setattr(resume, "process_identity", lambda: {"host": "elsewhere", "pid": 1, "boot_id": "b",
                                                             "start_time": "1"})  # stands for a new process
    random.seed(2)
    with pytest.raises(resume.ResumeMismatch) as ei:
        resume.check({"w": 1}, str(tmp_path), rank=0)
    assert "rng/python" in ei.value.differing
    resume.check({"w": 1}, str(tmp_path), rank=0, rng=False)


@pytest.mark.parametrize("says", [0, 2])
def test_a_rank_file_that_says_another_rank_is_unreadable_whichever_way_it_is_off(tmp_path, says):
    from ckptdoctor import resume
    ck = _dcp_checkpoint(tmp_path / "ck")
    resume.record({"w": [1]}, str(ck), rank=0, world_size=3, rng=False)
    resume.record({"w": [1]}, str(ck), rank=2, world_size=3, rng=False)
    src = resume.path_for(str(ck), says)
    os.replace(src, resume.path_for(str(ck), 1))   # rank 1's file holds rank 0's or rank 2's digests
    hits = [h for h in assert_fires(api.verify(str(ck)), "CKD501", severity="error") if "rank_00001.json" in h.path]
    assert hits and hits[0].message.endswith(f"rank_00001.json: says rank {says}"), [h.message for h in hits]


def test_numpy_scalars_are_digested_like_the_python_values_they_hold():
    np = pytest.importorskip("numpy")
    from ckptdoctor import resume
    assert resume.digest_state({"a": np.int64(3), "b": np.float32(1.5), "c": np.bool_(True)}) == \
        resume.digest_state({"a": 3, "b": 1.5, "c": True})


def test_only_the_very_same_process_is_refused_as_proof_not_one_that_sorts_after_it(tmp_path, monkeypatch):
    """Same host, pid, boot and start time: the saving process itself.  Any field different (here all
    smaller than the saver's) is another process, allowed."""
    from ckptdoctor import resume
    resume.record({"w": 1}, str(tmp_path), rank=0, world_size=1, rng=False)
    with pytest.raises(resume.NotAProof):
        resume.check({"w": 1}, str(tmp_path), rank=0, rng=False)
    monkeypatch.setattr(resume, "process_identity", lambda: {"host": "", "pid": 0, "boot_id": "", "start_time": ""})
    resume.check({"w": 1}, str(tmp_path), rank=0, rng=False)


def test_a_shape_change_names_both_shapes():
    from ckptdoctor import resume
    saved = resume.Digest("tensor", "a", "torch.float32", (2, 3))
    assert saved.describe(resume.Digest("tensor", "b", "torch.float32", (3, 2))) == "shape [3, 2] now, [2, 3] when saved"
    assert resume.Digest("tensor", "a", "torch.float32", None).describe(saved) == "shape [2, 3] now, [] when saved"


def test_the_cuda_stream_is_not_recorded_when_only_other_streams_are_asked_for(monkeypatch):
    torch = pytest.importorskip("torch")
    from ckptdoctor import resume
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [torch.zeros(8, dtype=torch.uint8)])
    assert list(resume.rng_state(("torch_cpu",))) == ["torch_cpu"]
