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
    hit = assert_fires(api.verify(str(d), deep=True), "CKD131", severity="warning")[0]
    assert hit.details["tensor"] == "w" and hit.details["start"] == start and hit.details["end"] == size


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
