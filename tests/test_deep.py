"""`verify --deep` on files written by the real safetensors library (torch tensors, incl. bfloat16):
injected NaN and Inf are named with their tensor; a zero-filled tail with size and mtime kept is
named with its byte range; healthy files, zero-initialised biases included, give no finding."""
import json
import os
import struct

import pytest

from ckptdoctor import api
from helpers import assert_fires

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _header(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return 8 + n, json.loads(raw[8:8 + n])


def _poke(path, tensor, index, data: bytes):
    """Overwrite element `index` of `tensor` in place, keeping size and mtime."""
    st = os.stat(path)
    base, hdr = _header(path)
    b, _ = hdr[tensor]["data_offsets"]
    with open(path, "r+b") as fh:
        fh.seek(base + b + index * len(data))
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.fixture
def ckpt(tmp_path):
    from safetensors.torch import save_file
    d = tmp_path / "hf"
    d.mkdir()
    g = torch.Generator().manual_seed(0)
    save_file({"a.weight": torch.randn(64, 64, generator=g), "b.weight": torch.randn(64, 64, generator=g).bfloat16(),
               "c.bias": torch.zeros(4096)}, str(d / "model.safetensors"))  # a fresh bias, last in the file
    return d


def test_healthy_real_file_with_a_zero_bias_has_no_finding(ckpt):
    rep = api.verify(str(ckpt), deep=True)
    assert not rep.findings, [(f.rule, f.message) for f in rep.findings]


@pytest.mark.parametrize("tensor, data, nan, inf", [
    ("a.weight", struct.pack("<I", 0x7FC00000), 1, 0),   # F32 NaN
    ("a.weight", struct.pack("<I", 0xFF800000), 0, 1),   # F32 -Inf
    ("b.weight", struct.pack("<H", 0x7FC0), 1, 0),       # BF16 NaN
    ("b.weight", struct.pack("<H", 0x7F80), 0, 1),       # BF16 +Inf
])
def test_nan_and_inf_are_named(ckpt, tensor, data, nan, inf):
    f = ckpt / "model.safetensors"
    _poke(f, tensor, 17, data)
    assert not api.verify(str(ckpt)).findings  # structure alone cannot see it
    hit = assert_fires(api.verify(str(ckpt), deep=True), "CKD130", path_contains="model.safetensors")[0]
    assert hit.details["tensor"] == tensor and (hit.details["nan"], hit.details["inf"]) == (nan, inf)
    assert hit.details["first"] == f"{tensor}[0, 17]" and f"the first at {tensor}[0, 17]" in hit.message


def test_zero_filled_tail_is_named_with_its_range(tmp_path):
    from safetensors.torch import save_file
    d = tmp_path / "hf"
    d.mkdir()
    g = torch.Generator().manual_seed(1)
    save_file({"w": torch.randn(64, 256, generator=g)}, str(d / "model.safetensors"))
    f = d / "model.safetensors"
    st = os.stat(f)
    size = st.st_size
    start = (size - 3 * 4096) // 4096 * 4096  # the last pages never reached the disk
    with open(f, "r+b") as fh:
        fh.seek(start)
        fh.write(b"\0" * (size - start))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not api.verify(str(d)).findings  # size, header and mtime all intact
    from ckptdoctor.checks import deep_scan as ds
    asked, pread = [], ds._zero_tail
    def spy(fd, size):               # the tail is found a page at a time: no read past one page
        real = os.pread
        def counted(fd_, n, off):
            asked.append(n)
            return real(fd_, n, off)
        os.pread = counted
        try:
            return pread(fd, size)
        finally:
            os.pread = real
    ds._zero_tail = spy
    try:
        hit = assert_fires(api.verify(str(d), deep=True), "CKD131", severity="warning")[0]
    finally:
        ds._zero_tail = pread
    assert hit.details["tensor"] == "w" and hit.details["start"] == start and hit.details["end"] == size
    assert len(asked) >= 4 and max(asked) <= 4096, asked


@pytest.mark.parametrize("zeros_from, found", [(4096, True), (-4000, False)])
def test_a_zero_tail_of_a_page_or_more_is_named_wherever_it_starts(tmp_path, zeros_from, found):
    """A zero-filled tail is reported when it covers at least one whole page, however far from the
    end it starts (here all but the first page of a file whose size is no multiple of 4 KiB); a run
    of zeros shorter than a page, at the very end, is no finding."""
    from safetensors.torch import save_file
    d = tmp_path / "hf"
    d.mkdir()
    g = torch.Generator().manual_seed(3)
    f = d / "model.safetensors"
    save_file({"w": torch.randn(64, 64, generator=g)}, str(f))
    st = os.stat(f)
    size = st.st_size
    assert size % 4096 and size > 3 * 4096
    start = zeros_from if zeros_from > 0 else size + zeros_from
    with open(f, "r+b") as fh:
        fh.seek(start)
        fh.write(b"\0" * (size - start))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    rep = api.verify(str(d), deep=True)
    if found:
        hit = assert_fires(rep, "CKD131", severity="warning")[0]
        assert (hit.details["start"], hit.details["end"]) == (4096, size), hit.details
    else:
        assert "CKD131" not in {x.rule for x in rep.findings}, [(x.rule, x.message) for x in rep.findings]


def test_deep_is_off_unless_asked_and_runs_from_the_cli(ckpt):
    _poke(ckpt / "model.safetensors", "a.weight", 3, struct.pack("<I", 0x7F800000))
    from helpers import cli
    rc, out, err = cli("verify", "-f", "json", str(ckpt))
    assert rc == 0
    rc, out, err = cli("verify", "--deep", "-f", "json", str(ckpt))
    assert rc == 1 and [f["rule"] for f in json.loads(out)["findings"]] == ["CKD130"], err


def test_deep_scan_that_cannot_read_the_bytes_fails_closed(ckpt):
    import fsspec
    fs = fsspec.filesystem("memory")
    fs.put(str(ckpt), "/deep-remote", recursive=True)
    rep = api.verify("memory://deep-remote", deep=True)
    hit = assert_fires(rep, "CKD901", severity="error")[0]
    assert "not scanned" in hit.message and "model.safetensors" in hit.path and rep.failed()


# ---- torch zip archives (a Trainer-style checkpoint written by torch.save) ------------------------
def _member(path, suffix):
    """(absolute start, size) of the zip member whose name ends with `suffix`, read with zipfile."""
    import zipfile
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(suffix))
    raw = open(path, "rb").read(info.header_offset + 30)
    nlen, xlen = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    return info.header_offset + 30 + nlen + xlen, info.file_size


def _patch(path, offset, data: bytes):
    st = os.stat(path)
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.fixture
def trainer(tmp_path):
    """checkpoint-10 as the HF Trainer lays it out, every file written by torch/safetensors: AdamW
    after one step (fp32 state), a LambdaLR, RNG state, a bf16 extra state and a zero bias."""
    from safetensors.torch import save_file
    d = tmp_path / "out" / "checkpoint-10"
    d.mkdir(parents=True)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 8))
    torch.nn.init.zeros_(m[1].bias)
    opt = torch.optim.AdamW(m.parameters())
    m(torch.randn(4, 32)).sum().backward()
    opt.step()
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(d / "model.safetensors"))
    torch.save(opt.state_dict(), d / "optimizer.pt")
    torch.save(torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0).state_dict(), d / "scheduler.pt")
    torch.save({"cpu": torch.get_rng_state(), "ema": torch.randn(16).bfloat16()}, d / "rng_state.pth")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": 10}))
    return d


def test_healthy_trainer_checkpoint_has_no_finding(trainer):
    rep = api.verify(str(trainer.parent), deep=True)
    assert not rep.findings, [(f.rule, f.message) for f in rep.findings]
    assert rep.facts["checkpoints"][0]["complete"]


def test_flipped_byte_in_a_pt_record_is_named_and_torch_load_would_not_notice(trainer):
    f = trainer / "optimizer.pt"
    before = torch.load(f)["state"][0]["exp_avg"].clone()
    start, size = _member(f, "/data/1")           # state.0.exp_avg
    _patch(f, start + 5, bytes([open(f, "rb").read()[start + 5] ^ 0x10]))
    after = torch.load(f)["state"][0]["exp_avg"]  # the real loader takes it without a word...
    assert not torch.equal(before, after)          # ...and resumes from different numbers
    assert not api.verify(str(trainer)).findings   # sizes, zip structure and markers all intact
    hit = assert_fires(api.verify(str(trainer), deep=True), "CKD132", path_contains="optimizer.pt")[0]
    assert "state.0.exp_avg" in hit.details["record"] and hit.details["start"] == start
    assert hit.details["end"] == start + size


@pytest.mark.parametrize("fname, suffix, where, width, pattern, nan, inf", [
    ("optimizer.pt", "/data/2", "state.0.exp_avg_sq", 4, 0x7FC00000, 1, 0),   # fp32 NaN
    ("optimizer.pt", "/data/1", "state.0.exp_avg", 4, 0xFF800000, 0, 1),      # fp32 -Inf
    ("rng_state.pth", "/data/1", "ema", 2, 0x7FC1, 1, 0),                     # bf16 NaN
])
def test_nan_and_inf_in_pt_records_are_named_as_torch_sees_them(trainer, fname, suffix, where, width, pattern,
                                                                 nan, inf):
    f = trainer / fname
    start, _ = _member(f, suffix)
    _patch(f, start + 3 * width, struct.pack("<I" if width == 4 else "<H", pattern))
    # CRC still matches? no: the CRC names the change too; the NaN finding is what matters here
    hit = assert_fires(api.verify(str(trainer), deep=True), "CKD130", path_contains=fname)[0]
    assert where in hit.details["tensor"] and (hit.details["nan"], hit.details["inf"]) == (nan, inf)
    obj = torch.load(f)
    t = obj["state"][0]["exp_avg_sq" if "sq" in where else "exp_avg"] if fname == "optimizer.pt" else obj["ema"]
    assert int(torch.isnan(t).sum()) == nan and int(torch.isinf(t).sum()) == inf  # what torch itself loads


def test_nan_is_named_in_the_pickle_torch_loads_when_another_member_ends_in_data_pkl(tmp_path):
    """--deep learns each record's dtype from the data.pkl torch.load reads (beside the archive's
    first member), not from the first name ending in `data.pkl`: led by `archive/extra_data.pkl`,
    the NaN torch loads was a pass."""
    import io
    import pickle
    import zipfile
    buf = io.BytesIO()
    torch.save({"w": torch.tensor([1.0, float("nan"), 3.0])}, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    f = tmp_path / "ck" / "model.pt"
    f.parent.mkdir()
    top = src.namelist()[0].split("/")[0]
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{top}/extra_data.pkl", pickle.dumps({"decoy": 1}, protocol=2))
        for n in src.namelist():
            z.writestr(n, src.read(n))
    assert int(torch.isnan(torch.load(f)["w"]).sum()) == 1   # torch loads it, NaN and all
    hit = assert_fires(api.verify(str(f), deep=True), "CKD130", path_contains="model.pt")[0]
    assert hit.severity == "error" and hit.details["tensor"].startswith("w (") and hit.details["nan"] == 1


def test_crc_not_computed_is_not_a_false_alarm(tmp_path, trainer):
    from torch.utils.serialization import config
    old = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        torch.save({"w": torch.randn(64)}, trainer / "optimizer.pt")
    finally:
        config.save.compute_crc32 = old
    torch.load(trainer / "optimizer.pt")  # torch reads it
    rep = api.verify(str(trainer), deep=True)
    assert not rep.findings, [(f.rule, f.message) for f in rep.findings]


def test_a_file_deep_cannot_read_is_not_passed(trainer):
    import pickle
    (trainer / "extra_state.bin").write_bytes(pickle.dumps({"a": 1}))  # not a torch zip
    hit = assert_fires(api.verify(str(trainer), deep=True), "CKD901", path_contains="extra_state.bin")[0]
    assert "not a torch zip archive" in hit.message


# ---- DCP shards (4 ranks saved over gloo by the real dcp.save) -----------------------------------
def _dcp_item(ckpt, fqn):
    """(file, absolute start of the tensor bytes) of the first write item of `fqn`, from the
    metadata torch itself reads."""
    import torch.distributed.checkpoint as dcp
    md = dcp.FileSystemReader(str(ckpt)).read_metadata()
    idx, info = next((i, s) for i, s in md.storage_data.items() if i.fqn == fqn)
    path = ckpt / info.relative_path
    raw = open(path, "rb").read()[info.offset:info.offset + info.length]
    import io
    import zipfile
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        mi = next(i for i in z.infolist() if "/data/" in i.filename)
    nlen, xlen = struct.unpack("<HH", raw[mi.header_offset + 26:mi.header_offset + 30])
    return path, info.offset + mi.header_offset + 30 + nlen + xlen, idx


def _dcp_load(ckpt):
    """Load the checkpoint with the real single-process dcp.load into a fresh state."""
    import torch.distributed.checkpoint as dcp
    sd = {"dense.weight": torch.zeros(8, 3), "shared.bias": torch.zeros(3), "step": 0}
    dcp.load(sd, checkpoint_id=str(ckpt), no_dist=True)
    return sd


def test_dcp_healthy_then_nan_and_flipped_byte_named(real):
    ck = real("dcp_4rank")
    rep = api.verify(str(ck), deep=True)
    assert not rep.findings, [(f.rule, f.message) for f in rep.findings]
    path, start, idx = _dcp_item(ck, "dense.weight")
    _patch(path, start + 4, struct.pack("<I", 0x7FC00000))
    assert not api.verify(str(ck)).findings
    rep = api.verify(str(ck), deep=True)
    hit = assert_fires(rep, "CKD130", path_contains=path.name)[0]
    assert hit.details["tensor"].startswith("dense.weight") and hit.details["nan"] == 1
    loaded = _dcp_load(ck)["dense.weight"]
    assert int(torch.isnan(loaded).sum()) == 1   # the real load agrees, and on where it is
    where = [int(x) for x in torch.nonzero(torch.isnan(loaded))[0]]
    assert hit.details["first"] == f"dense.weight[{', '.join(map(str, where))}]", (hit.details, where)
    crc = assert_fires(rep, "CKD132", path_contains=path.name)[0]      # and the CRC saw the change
    assert crc.details["record"].startswith("dense.weight")


def test_a_nan_in_the_last_record_of_a_shard_is_found_like_one_in_the_first(tmp_path):
    """A shard holds many tensors one after another: every record is scanned, wherever it starts
    in the file (the real dcp.load returns the NaN from the last as from the first)."""
    import torch.distributed.checkpoint as dcp
    g = torch.Generator().manual_seed(7)
    ck = tmp_path / "ck"
    dcp.save({f"t{i}": torch.randn(4096, generator=g) for i in range(4)}, checkpoint_id=str(ck), no_dist=True)
    assert not api.verify(str(ck), deep=True).findings
    starts = {f: _dcp_item(ck, f)[1] for f in ("t0", "t3")}
    last = max(starts, key=starts.get)                  # the record the save put last in the file
    path, start, _ = _dcp_item(ck, last)
    assert start > 3 * 4096 * 4                         # past the other three tensors' bytes
    _patch(path, start + 8, struct.pack("<I", 0x7FC00000))
    hit = assert_fires(api.verify(str(ck), deep=True), "CKD130", severity="error", path_contains=path.name)[0]
    assert hit.details["tensor"].startswith(last) and hit.details["nan"] == 1, hit.details
    sd = {f"t{i}": torch.zeros(4096) for i in range(4)}
    dcp.load(sd, checkpoint_id=str(ck), no_dist=True)
    assert int(torch.isnan(sd[last]).sum()) == 1 and not any(torch.isnan(sd[k]).any() for k in sd if k != last)


def test_dcp_deep_slices_cover_every_file_once_and_merge_finds_it(real, tmp_path):
    from helpers import cli
    ck = real("dcp_4rank")
    path, start, _ = _dcp_item(ck, "dense.weight")
    _patch(path, start, struct.pack("<I", 0x7F800000))
    docs = []
    for k in range(3):
        rc, out, err = cli("verify", str(ck), "--deep", "--slice", f"{k}/3", "-f", "json")
        (tmp_path / f"s{k}.json").write_text(out)
        docs.append(json.loads(out))
    units = [d["facts"]["slice"]["units"] for d in docs]
    scanned = sum(d["facts"]["slice"]["bytes"] for d in docs)
    data = sum(p.stat().st_size for p in ck.glob("*.distcp"))
    assert sum(units) == len(list(ck.glob("*.distcp"))) and scanned == data  # every file, once
    assert sum(any(f["rule"] == "CKD130" for f in d["findings"]) for d in docs) == 1
    rc, out, err = cli("merge", *[str(tmp_path / f"s{k}.json") for k in range(3)], "-f", "json")
    assert rc == 1 and any(f["rule"] == "CKD130" and path.name in f["path"] for f in json.loads(out)["findings"])


def test_deep_progress_counts_every_scanned_byte(real):
    from ckptdoctor.commands import verify as flow
    ck = real("dcp_4rank")
    seen = []

    class Sink:
        def __init__(self, total, label):
            seen.append([total, 0, label])

        def __call__(self, n):
            seen[-1][1] += n

        def close(self):
            pass
    eng = api.make_engine("verify", str(ck), progress=Sink, deep=True)
    flow.run(str(ck), eng)
    total, done, label = seen[-1]
    assert label.startswith("scanning") and 0 < done <= total
    assert total == sum(p.stat().st_size for p in ck.glob("*.distcp"))


def test_sharded_safetensors_from_huggingface_hub(tmp_path):
    from huggingface_hub import save_torch_state_dict
    d = tmp_path / "hf"
    d.mkdir()
    g = torch.Generator().manual_seed(2)
    sd = {f"layers.{i}.weight": torch.randn(32, 32, generator=g).bfloat16() for i in range(6)}
    sd["layers.5.bias"] = torch.zeros(32).bfloat16()
    save_torch_state_dict(sd, str(d), max_shard_size="5KB")
    shards = sorted(d.glob("*.safetensors"))
    assert len(shards) >= 3
    assert not api.verify(str(d), deep=True).findings
    idx = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    shard = d / idx["layers.3.weight"]
    _poke(shard, "layers.3.weight", 100, struct.pack("<H", 0xFF80))  # bf16 -Inf
    hit = assert_fires(api.verify(str(d), deep=True), "CKD130", path_contains=shard.name)[0]
    assert hit.details["tensor"] == "layers.3.weight" and hit.details["inf"] == 1
    from safetensors.torch import load_file
    assert int(torch.isinf(load_file(str(shard))["layers.3.weight"]).sum()) == 1  # as the library reads it


def test_zlib_fallback_finds_the_same_change(trainer, monkeypatch):
    import zlib
    from ckptdoctor.checks import deep_scan as vd
    monkeypatch.setattr(vd, "CRC32", zlib.crc32)  # without the `deep` extra's ISA-L
    f = trainer / "scheduler.pt"
    start, _ = _member(f, "data.pkl")
    _patch(f, start + 2, b"\x00")
    assert_fires(api.verify(str(trainer), deep=True), "CKD132", path_contains="scheduler.pt")


def test_damaged_archive_directories_give_one_line_not_a_traceback(trainer):
    """Every single-byte corruption of a real archive's directory area: the reader raises its own
    one-line error or reads members; nothing else escapes."""
    from ckptdoctor.layouts import ptzip
    raw = bytearray((trainer / "scheduler.pt").read_bytes())
    cd = raw.rfind(b"PK\x01\x02", 0, len(raw))
    first_cd = raw.find(b"PK\x01\x02")
    for pos in range(first_cd, len(raw)):
        for val in (0x00, 0xFF, raw[pos] ^ 0x80):
            bad = bytes(raw[:pos]) + bytes([val]) + bytes(raw[pos + 1:])
            try:
                ptzip.members(lambda o, n: bad[o:o + n], 0, len(bad))
            except ptzip.ZipDirError:
                pass
    assert cd > first_cd
    # and through verify: a truncated archive that no structural rule covers is named, not crashed on
    (trainer / "extra.pt").write_bytes(bytes(raw[:len(raw) - 30]))
    rep = api.verify(str(trainer), deep=True)
    assert not [f for f in rep.findings if f.rule == "CKD900"]
    assert any("extra.pt" in f.path and f.rule in ("CKD132", "CKD117") for f in rep.findings)


def test_deep_on_a_single_file_reads_only_that_file(trainer):
    f = trainer / "optimizer.pt"
    start, _ = _member(f, "/data/1")
    _patch(trainer / "scheduler.pt", 0, b"\0")  # a broken neighbour is not this file's business
    _patch(f, start, struct.pack("<I", 0x7FC00000))
    rep = api.verify(str(f), deep=True)
    assert {x.rule for x in rep.findings} >= {"CKD130"} and all("optimizer.pt" in x.path for x in rep.findings)


@pytest.mark.parametrize("dtype, torch_dtype", [("F16", "float16"), ("BF16", "bfloat16"), ("F8_E5M2", "float8_e5m2"),
                                                 ("F8_E4M3", "float8_e4m3fn")])
def test_window_test_agrees_with_torch_on_every_bit_pattern(dtype, torch_dtype):
    """The whole-window test (two integer maxima, no mask) against torch's isfinite, for every 8- and 16-bit
    pattern at the window's start, middle and end: a window it calls finite must be finite to torch."""
    np = pytest.importorskip("numpy")
    from ckptdoctor.checks import deep_scan as ds
    width, expo, _ = ds.FLOATS[dtype]
    n = 1 << (8 * width)
    pats = torch.arange(n, dtype=torch.int32).to(torch.uint8 if width == 1 else torch.int16)
    ref = torch.isfinite(pats.view(getattr(torch, torch_dtype)).float()).tolist()
    assert not all(ref)
    ones = {"F16": 0x3C00, "BF16": 0x3F80, "F8_E5M2": 0x3C, "F8_E4M3": 0x38}[dtype]  # 1.0: finite
    win = np.full(257, ones, dtype=ds.UINT[width])
    for v in range(n):
        for at in (0, 128, 256):
            win[at] = v
            assert ds._all_finite(np, win.tobytes(), dtype, win.size, expo) == ref[v], (dtype, hex(v), at)
            win[at] = ones


@pytest.mark.parametrize("dtype, pattern, nan, inf", [("float16", 0xFC00, 0, 1), ("float16", 0x7E01, 1, 0),
                                                      ("float8_e4m3fn", 0xFF, 1, 0), ("float8_e5m2", 0x7C, 0, 1)])
def test_half_and_fp8_nonfinite_named_as_torch_loads_them(tmp_path, dtype, pattern, nan, inf):
    from safetensors.torch import load_file, save_file
    d = tmp_path / "hf"
    d.mkdir()
    t = torch.randn(64, 64, generator=torch.Generator().manual_seed(2)).clamp(-8, 8).to(getattr(torch, dtype))
    save_file({"w": t, "b": torch.zeros(64, dtype=getattr(torch, dtype))}, str(d / "model.safetensors"))
    assert not api.verify(str(d), deep=True).findings
    width = t.element_size()
    _poke(d / "model.safetensors", "w", 1000, pattern.to_bytes(width, "little"))
    hit = assert_fires(api.verify(str(d), deep=True), "CKD130", path_contains="model.safetensors")[0]
    assert hit.details["tensor"] == "w" and (hit.details["nan"], hit.details["inf"]) == (nan, inf)
    got = load_file(str(d / "model.safetensors"))["w"].float()   # what the real loader hands the model
    assert int(torch.isnan(got).sum()) == nan and int(torch.isinf(got).sum()) == inf


# ---- the forked mmap workers (large scans from a single-threaded process, i.e. the CLI) ------------
_WORKERS = r"""
import json, os, signal, sys
import ckptdoctor.checks.deep_scan as ds
from ckptdoctor import api
path, mode = sys.argv[1], sys.argv[2]
seen = {"forked": 0, "signals": [], "records": 0, "reported": 0}
inner = ds._scan_in_workers
def spy(*a):
    got = inner(*a)
    seen["forked"] += 1
    seen["signals"] += got[2]
    seen["records"] += len(a[1])      # the records handed to the workers
    seen["reported"] += len(got[0])   # those whose result came back through the pipes
    return got
ds._scan_in_workers = spy
if mode != "natural":   # natural: the shipped threshold decides (every other mode forks, but "threads")
    ds.FORK_MIN = 0 if mode != "threads" else 1 << 62
if mode == "empty":  # the shard is emptied after it was listed and sized, before a worker reads it
    def empty_then_scan(*a):
        os.truncate(sys.argv[3], 0)
        return spy(*a)
    ds._scan_in_workers = empty_then_scan
if mode in ("maps", "maps-shipped"):  # every mapping a worker makes, as (offset, length), with a 1 MiB
    import mmap                          # bound per mapping ("maps") or the shipped one
    if mode == "maps":
        ds.MAP_CHUNK = 1 << 20
    real_mmap = mmap.mmap
    def logged_mmap(fd, length, *a, offset=0, **k):
        if fd >= 0:  # a file's pages, not an anonymous buffer
            with open(sys.argv[3], "a") as fh:
                fh.write(f"{offset} {length}\n")
        return real_mmap(fd, length, *a, offset=offset, **k)
    mmap.mmap = logged_mmap
if mode == "truncate":  # the shard shrinks to 128 KiB under a worker's mapping, after its first window
    window = ds._window
    def window_then_cut(np, chunk, *a):
        window(np, chunk, *a)
        if len(chunk) == ds.WINDOW and os.path.getsize(sys.argv[3]) > 1 << 17:
            os.truncate(sys.argv[3], 1 << 17)
    ds._window = window_then_cut
if mode == "slow":  # each window of a worker takes a while; the worker says who it is
    window = ds._window
    def slow_window(np, chunk, *a):
        with open(sys.argv[3], "a") as fh:
            fh.write(f"{os.getpid()}\n")
        import time
        time.sleep(0.5)
        window(np, chunk, *a)
    ds._window = slow_window
    try:
        api.verify(path, deep=True)
    except KeyboardInterrupt:
        print(json.dumps({"interrupted": True}))
        raise SystemExit(130)
progress = []
class Sink:   # what a progress bar is told: the bytes scanned, against the total it was promised
    def __init__(self, total, label):
        progress.append([total, 0])
    def __call__(self, n):
        progress[-1][1] += n
    def close(self):
        pass
from ckptdoctor.commands import verify as flow
eng = api.make_engine("verify", path, progress=Sink, deep=True)
flow.run(path, eng)
rep = eng.report
print(json.dumps({"seen": seen, "progress": progress[-1] if progress else None,
                  "findings": [[f.rule, f.path, f.message] for f in rep.findings]}))
"""


def _in_fresh_process(*args):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _WORKERS, *map(str, args)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_forked_workers_find_exactly_what_threads_find(real):
    ck = real("dcp_4rank")
    assert not _in_fresh_process(ck, "workers")["findings"]  # healthy: nothing
    path, start, _ = _dcp_item(ck, "dense.weight")
    _patch(path, start + 4, struct.pack("<I", 0x7FC00000))  # a NaN (and so a CRC change) in one record
    forked, threads = _in_fresh_process(ck, "workers"), _in_fresh_process(ck, "threads")
    assert forked["seen"]["forked"] == 1 and threads["seen"]["forked"] == 0
    assert forked["findings"] == threads["findings"]
    assert {r for r, _p, _m in forked["findings"]} == {"CKD130", "CKD132"}
    # every record's result came back from the workers: none was read a second time in-process
    assert forked["seen"]["reported"] == forked["seen"]["records"] > 0, forked["seen"]
    assert forked["progress"] == threads["progress"], (forked["progress"], threads["progress"])  # every byte once


def test_a_deep_scan_forks_workers_only_for_64_mib_of_records_or_more(tmp_path):
    """Forking costs more than it saves on a small scan: under FORK_MIN (64 MiB of record bytes,
    however the records lie in their shards) threads scan; from 64 MiB, forked workers."""
    import torch.distributed.checkpoint as dcp
    g = torch.Generator().manual_seed(5)
    small = tmp_path / "small"
    dcp.save({f"t{i}": torch.randn(8192, generator=g) for i in range(6)}, checkpoint_id=str(small), no_dist=True)
    assert _in_fresh_process(small, "natural")["seen"]["forked"] == 0
    big = tmp_path / "big"
    dcp.save({"w": torch.zeros(16 << 20)}, checkpoint_id=str(big), no_dist=True)   # one 64 MiB record at 0
    assert _in_fresh_process(big, "natural")["seen"]["forked"] == 1


def test_files_scanned_a_group_at_a_time_find_what_one_pass_finds(real, monkeypatch):
    """Memory stays bounded by scanning GROUP_RECORDS records at a time (whole files per group): a
    group per file finds exactly what one pass over all of them finds."""
    import ckptdoctor.checks.deep_scan as ds
    ck = real("dcp_4rank")
    path, start, _ = _dcp_item(ck, "dense.weight")
    _patch(path, start + 4, struct.pack("<I", 0x7FC00000))  # a NaN (and a CRC change) in one shard
    seen = []
    run = ds._run
    monkeypatch.setattr(ds, "_run", lambda ck, plan, *a: (seen.append(len(plan)), run(ck, plan, *a))[1])

    def deep():
        rep = api.verify(str(ck), deep=True)
        return sorted((f.rule, f.path, f.message) for f in rep.findings)
    whole = deep()
    assert seen == [len(list(ck.glob("*.distcp")))] and {r for r, _p, _m in whole} == {"CKD130", "CKD132"}
    monkeypatch.setattr(ds, "GROUP_RECORDS", 1)
    seen.clear()
    assert deep() == whole
    assert seen == [1] * len(list(ck.glob("*.distcp")))


def test_a_shard_truncated_under_a_worker_is_reported_not_a_crash(tmp_path):
    import signal
    import torch.distributed.checkpoint as dcp
    ck = tmp_path / "step"
    g = torch.Generator().manual_seed(3)
    dcp.save({"w": torch.randn(512, 1024, generator=g)}, checkpoint_id=str(ck), no_dist=True)  # 2 MiB record
    shard = next(ck.glob("*.distcp"))
    got = _in_fresh_process(ck, "truncate", shard)
    assert got["seen"]["signals"] == [signal.SIGBUS]  # the worker touching the vanished pages died of it...
    rules = [r for r, _p, _m in got["findings"]]
    assert rules == ["CKD901"], got["findings"]          # ...and this process read the rest and said so
    assert "ended at byte" in got["findings"][0][2] and shard.name in got["findings"][0][2]


@pytest.mark.parametrize("to", ["group", "parent"])
def test_ctrl_c_during_the_workers_stops_them_all(tmp_path, to):
    """SIGINT while forked workers scan, as a terminal sends it (the whole process group) or to the
    command alone (kill -INT): it ends at once with its interrupt path, and no worker is left."""
    import signal
    import subprocess
    import sys
    import time
    import torch.distributed.checkpoint as dcp
    from helpers import terminal_sigint
    ck = tmp_path / "step"
    g = torch.Generator().manual_seed(4)
    dcp.save({f"w{i}": torch.randn(256, 1024, generator=g) for i in range(8)}, checkpoint_id=str(ck), no_dist=True)
    marks = tmp_path / "workers"
    p = subprocess.Popen([sys.executable, "-c", _WORKERS, str(ck), "slow", str(marks)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=terminal_sigint)
    deadline = time.monotonic() + 60
    while not (marks.exists() and len(set(marks.read_text().split())) >= 2) and time.monotonic() < deadline:
        time.sleep(0.02)
    pids = {int(x) for x in marks.read_text().split()}
    assert len(pids) >= 2 and p.pid not in pids  # two forked workers are scanning
    before = len(marks.read_text().split())
    if to == "group":
        os.killpg(p.pid, signal.SIGINT)
    else:
        os.kill(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and json.loads(out) == {"interrupted": True}, err
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")]  # all gone, none a zombie
    # ...and stopped, not waited for: a window takes 0.5 s and each worker had dozens left
    assert len(marks.read_text().split()) - before <= 6


def test_a_deep_scan_hands_its_pool_batches_of_records_not_one_task_per_record():
    """Speed of --deep on archives of many tiny members (a torch.save per tensor: 1.4M records) rests
    on batching: a pool task per record cost ~15 us each, 20 s in all.  Counted, not timed: tiny
    records go BATCH_RECORDS to a task, large ones until a task holds BATCH_BYTES."""
    from types import SimpleNamespace as NS
    from ckptdoctor.checks import deep_scan as ds

    class Inline:
        def map(self, fn, items):
            return list(map(fn, items))
    tiny = [(None, None, NS(start=i * 8, end=i * 8 + 8)) for i in range(10_000)]
    batches, results = ds._batched(Inline(), len, list(range(len(tiny))), tiny)
    assert [len(b) for b in batches] == [4096, 4096, 1808] and results == [4096, 4096, 1808]
    assert [i for b in batches for i in b] == list(range(10_000))   # every record once, in order
    mib = 1 << 20
    big = [(None, None, NS(start=i * 3 * mib, end=(i + 1) * 3 * mib)) for i in range(5)]
    batches, _ = ds._batched(Inline(), len, list(range(5)), big)
    assert [len(b) for b in batches] == [2, 2, 1]   # 6 MiB reaches the 4 MiB mark: the task closes


def test_forked_workers_map_a_large_record_that_starts_past_1_mib_window_by_window(tmp_path):
    """A record larger than a window is scanned by a forked worker through mmap, whose mappings start
    on a page boundary below the record: each window must be read at its own place in the file.  A
    tensor starting just past 1 MiB into the file, with a NaN in its second and third windows: the
    workers name the same NaNs at the same elements as the threads (and as the real loader), and
    their progress counts every byte of it once."""
    from safetensors.torch import load_file, save_file
    d = tmp_path / "ck"
    d.mkdir()
    a = torch.zeros((1 << 18) + 5)                     # 1 MiB and 20 bytes: "b" starts past 1 MiB
    b = torch.zeros(3 << 18)                           # 3 MiB: three windows
    b[(1 << 18) + 7] = float("nan")                    # in its second window
    b[(2 << 18) + 11] = float("nan")                   # in its third
    save_file({"a": a, "b": b}, str(d / "model.safetensors"))
    got = load_file(str(d / "model.safetensors"))["b"]
    assert int(torch.isnan(got).sum()) == 2            # what the real loader hands the model
    forked, threads = _in_fresh_process(d, "workers"), _in_fresh_process(d, "threads")
    assert forked["seen"]["forked"] == 1 and threads["seen"]["forked"] == 0
    assert forked["findings"] == threads["findings"]
    (hit,) = [m for r, _, m in forked["findings"] if r == "CKD130"]
    assert "holds 2 NaN" in hit and hit.endswith(f"the first at b[{(1 << 18) + 7}]"), hit
    assert forked["progress"] == threads["progress"] and forked["progress"][1] == a.nbytes + b.nbytes
    # and it was the workers that found it: no record was left to the in-process fallback
    assert forked["seen"]["reported"] == forked["seen"]["records"] == 2, forked["seen"]


def _one_record_pt(d, seed: int) -> tuple[int, int]:
    """d/model.pt holding one 3 MiB float32 record (seeded): its (absolute start, size)."""
    d.mkdir()
    g = torch.Generator().manual_seed(seed)
    torch.save({"w": torch.randn(3 << 18, generator=g)}, d / "model.pt")
    start, size = _member(d / "model.pt", "/data/0")
    assert size == 3 << 20
    return start, size


def _deep_only(found: dict) -> list:
    """A fresh process's findings but CKD155 (a lone .pt is no known family: info)."""
    return [f for f in found["findings"] if f[0] != "CKD155"]


def _mappings(log) -> list[tuple[int, int]]:
    """The (offset, length) of every mapping a "maps" run of _WORKERS logged, in order."""
    return [tuple(map(int, ln.split())) for ln in log.read_text().splitlines() if ln]


def test_forked_workers_check_the_crc_of_a_large_archive_record_like_the_threads(tmp_path):
    """A torch archive's record larger than a window is scanned by a forked worker through mmap: a
    byte changed after the write is a CRC mismatch there exactly as in the threads (torch.load
    itself never checks it)."""
    d = tmp_path / "ck"
    start, _size = _one_record_pt(d, 5)
    assert not _deep_only(_in_fresh_process(d, "workers"))
    _patch(d / "model.pt", start + (2 << 20) + 3, b"\x5a")               # in its third window
    forked, threads = _in_fresh_process(d, "workers"), _in_fresh_process(d, "threads")
    assert forked["seen"]["forked"] == 1 and threads["seen"]["forked"] == 0
    assert _deep_only(forked) == _deep_only(threads)
    assert [r for r, _, _ in _deep_only(forked)] == ["CKD132"], forked["findings"]
    assert "model.pt" in _deep_only(forked)[0][1]


def _bytes_making_crc_zero(data: bytes, at: int) -> bytes:
    """The 4 bytes that, written at `at`, make the CRC-32 of `data` exactly 0 (CRC-32 is affine in
    the data's bits over GF(2): solve for those 32 bits)."""
    import zlib
    head = zlib.crc32(data[:at])
    g = lambda x: zlib.crc32(data[at + 4:], zlib.crc32(x, head))  # noqa: E731
    base = g(bytes(4))
    rows = [(g((1 << i).to_bytes(4, "little")) ^ base, 1 << i) for i in range(32)]  # (column, which bit)
    x, want = 0, base
    for bit in range(32):   # Gaussian elimination: pick a column with this bit, clear it from the rest
        k = next(k for k, (c, _) in enumerate(rows) if c >> bit & 1)
        piv = rows.pop(k)
        rows = [(c ^ piv[0], m ^ piv[1]) if c >> bit & 1 else (c, m) for c, m in rows]
        if want >> bit & 1:
            want ^= piv[0]
            x ^= piv[1]
    assert want == 0
    return x.to_bytes(4, "little")


def test_a_damaged_record_whose_bytes_have_crc_zero_is_reported_as_crc_00000000_forked_like_threads(tmp_path):
    """CKD132 names the CRC-32 the bytes on disk have, whatever it is: a record damaged so that its
    CRC is exactly 0 says 00000000, from a forked worker as from the threads (0 is a CRC like any
    other, not "none": a worker's result must not turn it into something else)."""
    import zlib
    d = tmp_path / "ck"
    start, size = _one_record_pt(d, 6)
    data = bytearray(open(d / "model.pt", "rb").read()[start:start + size])
    at = (2 << 20) + 4096
    data[at:at + 4] = _bytes_making_crc_zero(bytes(data), at)
    assert zlib.crc32(bytes(data)) == 0
    _patch(d / "model.pt", start + at, bytes(data[at:at + 4]))
    forked, threads = _in_fresh_process(d, "workers"), _in_fresh_process(d, "threads")
    assert forked["seen"]["forked"] == 1 and threads["seen"]["forked"] == 0
    assert _deep_only(forked) == _deep_only(threads)
    assert [r for r, _, _ in _deep_only(forked)] == ["CKD132"], forked["findings"]
    assert "has CRC-32 00000000, its archive recorded" in _deep_only(forked)[0][2], _deep_only(forked)


def test_a_forked_worker_never_maps_more_than_64_mib_of_a_record_at_once(tmp_path):
    """The memory a forked worker holds mapped is bounded (the module's promise: at most MAP_CHUNK,
    64 MiB, per worker): a 96 MiB tensor is mapped as 64 MiB, then the 32 MiB left."""
    import mmap
    d = tmp_path / "ck"
    d.mkdir()
    n = 24 << 20     # float32 elements: 96 MiB, zeros (a sparse file)
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(d / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        fh.truncate(8 + len(header) + 4 * n)
    log = tmp_path / "maps.log"
    found = _in_fresh_process(d, "maps-shipped", log)
    assert found["seen"]["forked"] == 1
    maps = _mappings(log)
    start = 8 + len(header)
    base = start - start % mmap.ALLOCATIONGRANULARITY
    assert maps == [(base, 64 << 20), (base + (64 << 20), start + 4 * n - base - (64 << 20))], maps


def test_a_forked_worker_reads_records_smaller_than_a_window_without_mapping_them(tmp_path):
    """Records of a window or less are read with pread and their results sent in batches (a mapping
    per record of a few bytes dominated a 1M-record scan): the workers map none of them, and find
    what the threads find, a NaN at the first element of a tensor included."""
    from safetensors.torch import save_file
    d = tmp_path / "ck"
    d.mkdir()
    ts = {f"t{i}": torch.ones(1 << 14) for i in range(6)}     # 64 KiB each
    ts["t3"][0] = float("nan")
    save_file(ts, str(d / "model.safetensors"))
    log = tmp_path / "maps.log"
    forked = _in_fresh_process(d, "maps-shipped", log)
    threads = _in_fresh_process(d, "threads")
    assert forked["seen"]["forked"] == 1 and not log.exists(), log.read_text() if log.exists() else ""
    assert forked["findings"] == threads["findings"]
    (nan,) = [f for f in forked["findings"] if f[0] == "CKD130"]
    assert "t3" in nan[2] and "the first at t3[0]" in nan[2], nan


def test_a_forked_workers_mappings_start_on_the_page_below_each_window_and_stay_bounded(tmp_path):
    """A worker maps a large record MAP_CHUNK bytes at a time (its mapped pages stay bounded): the
    first mapping starts on the allocation boundary just below the record, each next one where the
    last ended, none longer than MAP_CHUNK, and nothing before the record is counted: a NaN in the
    last element of the tensor just before it belongs to that tensor alone."""
    import mmap
    from safetensors.torch import save_file
    d = tmp_path / "ck"
    d.mkdir()
    a, b = torch.zeros((1 << 18) + 5), torch.zeros(3 << 18)
    a[-1] = float("nan")
    b[5] = float("nan")
    save_file({"a": a, "b": b}, str(d / "model.safetensors"))
    with open(d / "model.safetensors", "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        spans = [tuple(8 + n + o for o in t["data_offsets"]) for k, t in sorted(json.loads(fh.read(n)).items())
                 if k != "__metadata__"]
    g, want = mmap.ALLOCATIONGRANULARITY, set()
    for start, end in spans:
        pos = start
        while pos < end:
            base = pos - pos % g
            stop = min(end, base + (1 << 20))
            want.add((base, stop - base))
            pos = stop
    log = tmp_path / "maps"
    got = _in_fresh_process(d, "maps", log)
    assert got["seen"]["forked"] == 1
    assert set(_mappings(log)) == want
    nan = sorted(m for r, _, m in got["findings"] if r == "CKD130")
    assert len(nan) == 2 and "holds 1 NaN" in nan[0] and nan[0].endswith(f"the first at a[{(1 << 18) + 4}]"), nan
    assert "holds 1 NaN" in nan[1] and nan[1].endswith("the first at b[5]"), nan


def test_a_shard_emptied_before_a_worker_reads_it_is_named_where_it_ended_not_a_checksum_mismatch(tmp_path):
    """A shard truncated to nothing after it was listed (a copy restarted over it) is named by the
    forked workers as ended at its first record's first byte (64: the payload after the zip member's
    local header), the one finding: its CRC is not compared with nothing."""
    import torch.distributed.checkpoint as dcp
    ck = tmp_path / "step"
    dcp.save({"w": torch.ones(256, 1024)}, checkpoint_id=str(ck), no_dist=True)  # one 1 MiB record at 0
    shard = next(ck.glob("*.distcp"))
    got = _in_fresh_process(ck, "empty", shard)
    assert got["seen"]["forked"] == 1 and [r for r, _p, _m in got["findings"]] == ["CKD901"], got["findings"]
    assert f"{shard.name} ended at byte 64 while it was scanned" in got["findings"][0][2], got["findings"]


def test_deep_slices_take_whole_files_largest_first_so_no_slice_runs_long():
    """`--deep --slice K/N` deals whole files, the largest first, each to the least-loaded slice (ties
    to the lower slice): every file in exactly one slice, the same deal on every node, and the
    slowest slice no longer than it must be (6,5,4,3,2 over 2 slices: 11 and 9, not 12 and 8)."""
    from ckptdoctor.checks.deep_scan import _partition
    files = {"e": 2, "c": 4, "a": 6, "d": 3, "b": 5}
    deal = [_partition(files, k, 2) for k in range(2)]
    assert sorted(n for s in deal for n in s) == sorted(files)
    assert [sorted(s) for s in deal] == [["a", "d", "e"], ["b", "c"]]
    assert [sum(files[n] for n in s) for s in deal] == [11, 9]


def test_deep_slices_are_the_same_whatever_order_each_process_listed_the_files_in():
    """`--deep --slice k/n` runs as n independent processes (often on n nodes), each listing the
    checkpoint itself: the files of equal size must go to the same slice whatever order a listing
    gave, so the slices cover every file exactly once."""
    from ckptdoctor.checks.deep_scan import _partition
    files = {**{f"__{i}_0.distcp": 100 for i in range(7)}, "model.safetensors": 500, ".metadata": 7}
    backwards = dict(reversed(list(files.items())))
    for n in (2, 3):
        slices = [_partition(files, k, n) for k in range(n)]
        assert slices == [_partition(backwards, k, n) for k in range(n)], n
        assert sorted(f for s in slices for f in s) == sorted(files)


def test_a_deep_scan_closes_every_file_it_opened(tmp_path):
    """--deep opens each shard once for all its records; every one is closed again, so a scan of a
    checkpoint of thousands of shards cannot run out of file descriptors (counted in /proc)."""
    from ckptdoctor.layouts import dcp_writer as W
    d = tmp_path / "ck"
    W.write(str(d), [W.Item(f"w{i}", (64, 4), (0, 0), (64, 4), [1.0] * 256, rank=i) for i in range(12)])
    before = len(os.listdir("/proc/self/fd"))
    rep = api.verify(str(d), deep=True)
    assert not [f for f in rep.findings if f.severity != "info"], [(f.rule, f.message) for f in rep.findings]
    assert len(os.listdir("/proc/self/fd")) == before


def test_deep_on_a_save_holding_integer_tensors_and_objects_judges_the_floats_only(tmp_path):
    """An integer tensor (a step counter, token ids) or a pickled object has no NaN to look for: a
    deep scan of a real DCP save holding them beside a float tensor finds nothing on a healthy save
    and never fails on them (no CKD900)."""
    import torch.distributed.checkpoint as dcp
    d = tmp_path / "ck"
    dcp.save({"w": torch.ones(64), "ids": torch.arange(64), "step": torch.tensor(7), "meta": {"lr": 0.1}},
             checkpoint_id=str(d), no_dist=True)
    rep = api.verify(str(d), deep=True)
    assert not [f for f in rep.findings if f.severity != "info"], [(f.rule, f.message) for f in rep.findings]


def test_deep_workers_get_the_records_largest_first_to_the_least_loaded():
    """Forked workers share a scan by bytes, not by count: each record, largest first, goes to the
    worker with the fewest bytes so far (counted, not timed)."""
    from ckptdoctor.checks.deep_scan import _assign
    assert _assign([100, 60, 50, 40, 10], 2) == [[0, 3], [1, 2, 4]]
    assert _assign([5, 5, 5], 4) == [[0], [1], [2], []]
    mine = _assign([1 << 30] + [1 << 20] * 1024, 2)
    assert mine[0] == [0] and len(mine[1]) == 1024      # one 1 GiB record balances 1024 of 1 MiB


@pytest.mark.parametrize("lead_zeros", [0, 4096 + 3])
def test_a_zero_tail_is_judged_by_every_byte_of_the_tensor_before_it(tmp_path, lead_zeros):
    """A zero-filled tail inside a tensor is reported when the tensor holds data before it: every
    byte before the tail is looked at, not only each window's first, so a tensor whose first
    elements are zero (a bias, a padded row) is still seen to hold data."""
    from safetensors.torch import save_file
    d = tmp_path / "hf"
    d.mkdir()
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(2))
    w.view(-1)[:lead_zeros // 4 + 1] = 0.0
    save_file({"w": w}, str(d / "model.safetensors"))
    f = d / "model.safetensors"
    size = f.stat().st_size
    start = (size - 3 * 4096) // 4096 * 4096
    with open(f, "r+b") as fh:
        fh.seek(start)
        fh.write(b"\0" * (size - start))
    hit = assert_fires(api.verify(str(d), deep=True), "CKD131", severity="warning")[0]
    assert (hit.details["tensor"], hit.details["start"], hit.details["end"]) == ("w", start, size)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_nan_and_inf_are_counted_in_every_float_width(tmp_path, dtype):
    """A NaN and an Inf in a tensor of each float width (F64 and F32 through numpy's isfinite, F16
    and BF16 through the exponent masks) are counted exactly and the first is named; the counts are
    what the real loader hands the model."""
    from safetensors.torch import load_file, save_file
    d = tmp_path / "hf"
    d.mkdir()
    w = torch.zeros(4, 300, dtype=dtype)
    w[1, 7], w[2, 9], w[3, 11] = float("nan"), float("inf"), float("-inf")
    save_file({"w": w}, str(d / "model.safetensors"))
    got = load_file(str(d / "model.safetensors"))["w"]
    assert (int(torch.isnan(got).sum()), int(torch.isinf(got).sum())) == (1, 2)
    (hit,) = assert_fires(api.verify(str(d), deep=True), "CKD130", severity="error")
    assert (hit.details["nan"], hit.details["inf"], hit.details["first"]) == (1, 2, "w[1, 7]"), hit.details


@pytest.mark.parametrize("cores, records, threads", [(32, 12, 8), (32, 3, 3), (2, 12, 2)])
def test_a_deep_scan_runs_one_thread_per_core_up_to_eight_and_no_more_than_its_records(tmp_path, monkeypatch,
                                                                                         cores, records, threads):
    """The pread threads of --deep: one per core the process may run on, at most 8 (the bound on its
    buffers and open reads), never more than there are records to scan."""
    import ckptdoctor.checks.deep_scan as ds
    from safetensors.torch import save_file
    d = tmp_path / "ck"
    d.mkdir()
    save_file({f"t{i}": torch.ones(256) for i in range(records)}, str(d / "model.safetensors"))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    sizes = []
    real_pool = ds.ThreadPoolExecutor

    def pool(n, *a, **k):
        sizes.append(n)
        return real_pool(n, *a, **k)
    monkeypatch.setattr(ds, "ThreadPoolExecutor", pool)
    assert not [f for f in api.verify(str(d), deep=True).findings if f.severity != "info"]
    assert sizes == [threads], sizes
