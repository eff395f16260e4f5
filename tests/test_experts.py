"""Expert-parallel collisions: reproduced with 4 real gloo ranks, caught on disk and at save time."""
import socket
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptdoctor import api
from ckptdoctor.layouts import dcp_writer as W
from conftest import needs_torch
from helpers import assert_fires, assert_no_errors


@pytest.fixture(scope="module")
def ep_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ep")
    p = subprocess.run([sys.executable, str(Path(__file__).parent / "fixtures" / "ep_collision.py"), str(out),
                        str(_free_port())], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    return out, sorted(ranks, key=lambda r: r["rank"])


@needs_torch
def test_collision_is_real_silent_and_caught_by_the_guard(ep_run):
    out, ranks = ep_run
    assert len(ranks) == 4
    # DCP itself raises nothing, yet some ranks load another EP group's experts
    assert not all(r["bad_roundtrip"] for r in ranks)
    assert all(r["good_roundtrip"] for r in ranks)
    for r in ranks:  # the guard raises on every rank, naming key and ranks
        assert "moe.experts.w1" in r["bad_guard"] and "ranks [0]; ranks [2]" in r["bad_guard"]
        assert r["good_guard"] == "passed"


@needs_torch
def test_verify_flags_the_collided_checkpoint_only(ep_run):
    out, _ = ep_run
    hit = assert_fires(api.verify(str(out / "bad")), "CKD109")[0]
    assert hit.details["expected_experts"] == 4 and hit.details["global_shape"] == [2, 2, 2]
    assert hit.details["expected_from"].endswith("config.json:num_experts")
    assert_no_errors(api.verify(str(out / "good")))


def test_per_expert_keys_missing_indices(tmp_path):
    d = tmp_path / "ck"
    items = [W.Item(f"layers.0.mlp.experts.{i}.w", (2,), (0,), (2,), [1.0, 2.0], rank=i % 2) for i in (0, 1)]
    W.write(str(d), items)
    rep = api.verify(str(d), num_experts=4)
    hit = assert_fires(rep, "CKD109")[0]
    assert "2 of 4 experts" in hit.message and hit.details["saved"] == [0, 1]
    assert "CKD109" not in api.verify(str(d), num_experts=2).rules()
    assert "CKD109" not in api.verify(str(d)).rules()  # nothing to compare against: no claim


@pytest.mark.parametrize("shape, fires", [((4, 16), True), ((8, 16), False), ((2, 4, 16), True)])
def test_a_stacked_expert_tensor_of_two_dimensions_is_judged_too(tmp_path, shape, fires):
    """A stacked expert tensor of two dimensions (a per-expert bias, [experts, width]) holding one EP
    group's half of 8 experts is CKD109's error, as a 3-D weight is; the whole set is no finding."""
    d = tmp_path / "ck"
    n = 1
    for x in shape:
        n *= x
    W.write(str(d), [W.Item("layers.0.mlp.experts.gate_up_proj_bias", shape, (0,) * len(shape), shape,
                            [0.5] * n, rank=0)])
    rep = api.verify(str(d), num_experts=8)
    if fires:
        (hit,) = assert_fires(rep, "CKD109", severity="error")
        assert hit.details["global_shape"] == list(shape) and f"{shape[0]} local experts" in hit.message, hit.message
        assert hit.details["writer_ranks"] == [0], hit.details   # the rank whose shard holds it
    else:
        assert "CKD109" not in rep.rules()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("saved", [3, 4, 5])
def test_a_group_that_lost_one_expert_is_an_error(tmp_path, saved):
    """4 experts expected, 3 saved (an EP group lost one): CKD109 error naming expert 3; all 4: clean.
    5 saved (a config that names fewer experts than the checkpoint holds): clean too, since a load
    asks only for the experts its model has and every one of them is there."""
    d = tmp_path / "ck"
    items = [W.Item(f"layers.0.mlp.experts.{i}.w", (2,), (0,), (2,), [1.0, 2.0], rank=i % 2) for i in range(saved)]
    W.write(str(d), items)
    rep = api.verify(str(d), num_experts=4)
    if saved >= 4:
        assert "CKD109" not in rep.rules()
    else:
        hit = assert_fires(rep, "CKD109", severity="error")[0]
        assert "3 of 4 experts" in hit.message and "[3]" in hit.message


@pytest.mark.parametrize("n", ["0", "-4"])
def test_an_expert_count_that_is_not_positive_is_a_usage_error_not_a_silent_pass(tmp_path, n):
    """`--num-experts` states the model's expert count; 0 or a negative count would judge no expert
    key at all (or judge against nonsense), so it is refused in one line with exit 2."""
    from helpers import cli
    d = tmp_path / "ck"
    W.write(str(d), [W.Item("layers.0.mlp.experts.0.w", (2,), (0,), (2,), [1.0, 2.0], rank=0)])
    rc, out, err = cli("verify", str(d), "--num-experts", n)
    assert rc == 2 and "--num-experts" in err and "positive" in err and "Traceback" not in err, (rc, err)
    from ckptdoctor.engine.errors import UsageError
    with pytest.raises(UsageError, match="positive integer"):  # the API refuses it alike
        api.verify(str(d), num_experts=int(n))


@pytest.mark.parametrize("pad_kib,read", [(900, True), (1100, False)])
def test_the_expert_count_is_read_from_a_config_json_of_up_to_1_mib(tmp_path, pad_kib, read):
    """A model's config.json (HF configs with long vocab maps run to hundreds of KiB) is read for the
    expert count up to 1 MiB; a larger one is not read at all (bounded reads), so no count is claimed."""
    d = tmp_path / "ck"
    W.write(str(d), [W.Item(f"layers.0.mlp.experts.{i}.w", (2,), (0,), (2,), [1.0, 2.0], rank=0) for i in (0, 1)])
    (d / "config.json").write_text(json.dumps({"num_experts": 4, "pad": "x" * (pad_kib << 10)}))
    rep = api.verify(str(d))
    if read:
        (hit,) = assert_fires(rep, "CKD109", severity="error")
        assert hit.details["expected_from"].endswith("config.json:num_experts"), hit.details
    else:
        assert "CKD109" not in rep.rules()


@pytest.mark.parametrize("none", [0, -4])
def test_an_expert_count_of_0_in_a_config_is_no_count_and_the_next_key_is_read(tmp_path, none):
    """A config can carry `num_experts: 0` for a dense model (or dense text tower) and the real count
    under another key (e.g. `num_local_experts`): 0 is not a count, nor is a negative one; the next
    key is."""
    d = tmp_path / "ck"
    W.write(str(d), [W.Item(f"layers.0.mlp.experts.{i}.w", (2,), (0,), (2,), [1.0, 2.0], rank=0) for i in (0, 1)])
    (d / "config.json").write_text(json.dumps({"num_experts": none, "num_local_experts": 4}))
    (hit,) = assert_fires(api.verify(str(d)), "CKD109", severity="error")
    assert hit.details["expected_from"].endswith("config.json:num_local_experts") and "2 of 4 experts" in hit.message, hit
    (d / "config.json").write_text(json.dumps({"num_experts": none}))
    assert "CKD109" not in api.verify(str(d)).rules()


def test_stacked_experts_in_a_file_named_unlike_a_rank_shard_are_judged_without_a_writer_rank(tmp_path):
    """A .metadata whose storage file is not named `__RANK_N.distcp` (a custom writer's name): the
    stacked expert tensor in it is still judged by CKD109, its writer ranks unknown (none)."""
    d = tmp_path / "ck"
    W.write(str(d), [W.Item("layers.0.mlp.experts.w1", (4, 2), (0, 0), (4, 2), [0.5] * 8, rank=0)])
    md = (d / ".metadata").read_bytes()
    assert md.count(b"__0_0.distcp") >= 1
    (d / ".metadata").write_bytes(md.replace(b"__0_0.distcp", b"xx0_0.distcp"))
    os.rename(d / "__0_0.distcp", d / "xx0_0.distcp")
    rep = api.verify(str(d), num_experts=8)
    (hit,) = assert_fires(rep, "CKD109", severity="error")
    assert hit.details["writer_ranks"] == [] and "CKD900" not in rep.rules(), [(f.rule, f.message) for f in rep.findings]


def test_a_config_json_that_cannot_be_read_gives_no_count_and_no_crash(tmp_path):
    """A config.json that is a directory (or unreadable) says nothing about the expert count: the
    next place is looked at, and with no count there is no CKD109 claim -- never a crash."""
    d = tmp_path / "ck"
    W.write(str(d), [W.Item(f"layers.0.mlp.experts.{i}.w", (2,), (0,), (2,), [1.0, 2.0], rank=0) for i in (0, 1)])
    (d / "config.json").mkdir()
    rep = api.verify(str(d))
    assert "CKD109" not in rep.rules() and "CKD900" not in rep.rules(), [(f.rule, f.message) for f in rep.findings]


@pytest.mark.parametrize("saved, dots", [(8, False), (7, True)])
def test_missing_experts_are_listed_up_to_eight_then_elided_and_the_saved_ones_kept_up_to_64(tmp_path, saved, dots):
    """CKD109 on per-expert keys: the missing indices are listed, the first eight of them, with
    "..." only when there are more than eight; the saved indices go to the details (up to 64)."""
    d = tmp_path / "ck"
    W.write(str(d), [W.Item(f"layers.0.mlp.experts.{i}.w", (2,), (0,), (2,), [1.0, 2.0], rank=0) for i in range(saved)])
    (hit,) = assert_fires(api.verify(str(d), num_experts=16), "CKD109", severity="error")
    missing = list(range(saved, 16))
    assert hit.message.endswith(f"(missing {missing[:8]}{'...' if dots else ''})"), hit.message
    assert hit.details["saved"] == list(range(saved))


def test_the_saved_expert_indices_in_a_finding_are_bounded_at_64(tmp_path):
    d = tmp_path / "ck"
    W.write(str(d), [W.Item(f"layers.0.mlp.experts.{i}.w", (2,), (0,), (2,), [1.0, 2.0], rank=0) for i in range(65)])
    (hit,) = assert_fires(api.verify(str(d), num_experts=128), "CKD109", severity="error")
    assert hit.details["saved"] == list(range(64)) and "65 of 128 experts saved" in hit.message, hit.message
