"""Hostile and broken inputs: every parser fuzzed, pickles that try to run code, read-only
guarantees, and path oddities.  The only acceptable outcomes are a finding or a one-line error.

Fuzzing uses hypothesis with a bounded example count; `CKPTDOCTOR_FUZZ=1` (or --fuzz) runs the
long profile locally."""
import hashlib
import io
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import time
import zipfile

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ckptdoctor import api
from ckptdoctor.io import ptfile
from ckptdoctor.io.unpickle import RefusedGlobal
from ckptdoctor.layouts import dcp, dcp_writer as W, manifest as mf, safetensors as stf, trackers
from ckptdoctor.runstate import pathexpr
from ckptdoctor.runstate.schema import normalize
from ckptdoctor.slurm.hostlist import HostlistError, expand
from ckptdoctor.engine.errors import InputError
from helpers import assert_fires, cli

settings.register_profile("ci", max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz", max_examples=20000, deadline=5000, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("fuzz" if os.environ.get("CKPTDOCTOR_FUZZ") else "ci")


# Per example: every input here is under 1 KiB, so a parser that allocates what a forged length or
# count asks for (a header length of 2**40, a memo index of 10**9) is over this long before it is
# over the machine.  Measured with tracemalloc (Python's allocators, where bytes, lists and dicts
# live); the process-wide peak RSS is checked once per test as well.
EXAMPLE_BYTES = 32 << 20
PROCESS_RSS_KIB = 2 << 20


def within_budget(fn, limit=lambda data: EXAMPLE_BYTES):
    """fn(data), failing when one example's peak traced allocation passes limit(data)."""
    import tracemalloc

    def run(data):
        if not tracemalloc.is_tracing():
            tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        try:
            fn(data)
        finally:
            peak = tracemalloc.get_traced_memory()[1] - base
        assert peak < limit(data), f"{peak} bytes allocated for a {len(data)}-byte input {data[:64]!r}"
    return run


@pytest.fixture
def rss_budget():
    import resource
    import tracemalloc
    yield
    if tracemalloc.is_tracing():
        tracemalloc.stop()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < PROCESS_RSS_KIB, "peak RSS over 2 GiB"


def pickled(data) -> int:
    """A pickle parser's budget: what the unpickler's address-space cap allows for this input
    (io.unpickle.pickle_budget), plus 8 MiB of memory the process had freed before and reuses."""
    from ckptdoctor.io.unpickle import pickle_budget
    return pickle_budget(len(data)) + (8 << 20)


def test_the_fuzz_budget_catches_a_parser_that_allocates_what_the_input_asks(rss_budget):
    """The guard of the guard: an allocation sized by the input is reported, with the input."""
    greedy = within_budget(lambda data: bytearray(int.from_bytes(data[:4], "little")))
    greedy(b"\x00\x01\x00\x00")  # 256 bytes: fine
    with pytest.raises(AssertionError, match="allocated for a 4-byte input"):
        greedy(b"\x00\x00\x00\x04")  # 64 MiB


def _mutations(seed: bytes):
    """Truncations, bit flips, byte overwrites and random junk around a valid seed."""
    n = len(seed)
    return st.one_of(
        st.integers(0, n).map(lambda k: seed[:k]),
        st.tuples(st.integers(0, max(0, n - 1)), st.integers(0, 7)).map(
            lambda t: seed[:t[0]] + bytes([seed[t[0]] ^ (1 << t[1])]) + seed[t[0] + 1:] if n else seed),
        st.tuples(st.integers(0, n), st.binary(max_size=16)).map(lambda t: seed[:t[0]] + t[1] + seed[t[0]:]),
        st.binary(max_size=512),
    )


# ---- DCP .metadata -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def metadata_seed(tmp_path_factory):
    d = tmp_path_factory.mktemp("seed")
    W.write(str(d), [W.Item("w", (4, 4), (r * 2, 0), (2, 4), [1.0] * 8, rank=r) for r in range(2)])
    return (d / ".metadata").read_bytes()


def test_fuzz_dcp_metadata(metadata_seed, rss_budget):
    @given(_mutations(metadata_seed))
    @lambda fn: within_budget(fn, pickled)
    def run(data):
        try:
            dcp.parse(data)
        except (dcp.MetadataError, RefusedGlobal):
            pass
    run()


# ---- safetensors headers and index ------------------------------------------------------------------
def _st_file():
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                         "b": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]}}).encode()
    return struct.pack("<Q", len(header)) + header + bytes(24)


def test_fuzz_safetensors_header(rss_budget):
    seed = _st_file()

    @given(_mutations(seed))
    @within_budget
    def run(data):
        try:
            stf.read_header(lambda off, n: data[off:off + n], len(data))
        except stf.HeaderError:
            pass
    run()


def test_absurd_header_length_is_a_finding_not_an_allocation(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    rep = api.verify(str(d))
    assert_fires(rep, "CKD120")


def test_fuzz_index_and_manifest_and_tracker(rss_budget):
    from ckptdoctor.io.fs import Entry
    from ckptdoctor.layouts.spec import run_layouts
    trackers_under_test = [l for l in run_layouts() if l.tracker and l.tracker.parse != "symlink"]
    links_under_test = [l for l in run_layouts() if l.tracker and l.tracker.parse == "symlink"]
    assert {l.tracker.parse for l in trackers_under_test} == {"int", "int-or-release", "tag", "json:last_checkpoint_step"}
    assert links_under_test, "no symlink tracker (Composer's latest-rank0.pt) to fuzz"

    class Link:   # a storage whose tracker link points wherever the fuzzer says
        root = "/run"

        def __init__(self, text):
            self.text = text

        def readlink(self, rel):
            return self.text

    @given(st.binary(max_size=300) | st.text(max_size=200).map(str.encode))
    @within_budget
    def run(data):
        for fn, errs in ((stf.parse_index, (stf.HeaderError,)),
                         (lambda b: mf.parse(b, mf.NAME), (mf.ManifestError,)),
                         (lambda b: mf.parse(b, mf.INTEGRITY), (mf.ManifestError,))):
            try:
                fn(data)
            except errs:
                pass
        for lay in trackers_under_test:
            v = trackers.parse(lay, data)
            assert v.target is None or (isinstance(v.target, str) and v.problem is None)
        text = data.decode("utf-8", "surrogateescape")
        for lay in links_under_test:   # a link's target is a checkpoint name in the run root, or a problem
            v = trackers.parse_link(Link(text), lay.tracker.file, Entry(lay.tracker.file, 0, 1.0, False, True, False))
            assert (v.target is None) != (v.problem is None), v
            assert v.target is None or ("/" not in v.target and v.target not in ("", ".", "..")), v
    run()


# ---- .pt archives (torch-free reader) -----------------------------------------------------------------
def _pt(obj_pickle: bytes, extra=None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", obj_pickle)
        zf.writestr("archive/version", "3\n")
        for k, v in (extra or {}).items():
            zf.writestr(k, v)
    return buf.getvalue()


def test_fuzz_pt_reader(rss_budget):
    seed = _pt(pickle.dumps({"_num_yielded": 3, "groups": [{"target_step": 7}]}, protocol=2))

    @given(_mutations(seed))
    @lambda fn: within_budget(fn, pickled)
    def run(data):
        try:
            ptfile.read_pt(io.BytesIO(data))
        except (ptfile.PtError, RefusedGlobal):
            pass
    run()


def test_fuzz_pickles_naming_globals_off_the_allow_list_are_refused_by_name(tmp_path):
    """Pickles (protocols 2 and 4) that call a global outside the allow-lists: both restricted
    unpicklers refuse exactly that global, and the call never happens (a marker file never appears)."""
    from ckptdoctor.io.unpickle import DCP_ALLOW, loads_dcp
    marker = tmp_path / "pwned"
    modules = ["builtins", "__builtin__", "io", "os", "posix", "nt", "subprocess", "shutil", "sys", "importlib",
               "pickle", "marshal", "ctypes", "socket", "runpy", "code", "functools", "operator", "codecs",
               "torch", "torch._C", "torch.serialization", "torch.distributed.checkpoint.metadata"]
    names = ["open", "system", "getattr", "setattr", "__import__", "eval", "exec", "compile", "load", "loads",
             "Popen", "check_call", "rmtree", "remove", "unlink", "import_module", "call", "reduce",
             "_load_for_lite_interpreter", "save"]
    ident = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)

    @given(st.sampled_from(modules), st.sampled_from(names) | ident, st.sampled_from([2, 4]))
    def run(module, name, protocol):
        from test_bite import _global_call
        data = _global_call(module, name, str(marker), protocol)
        if (module, name) not in DCP_ALLOW:
            with pytest.raises(RefusedGlobal) as ei:
                loads_dcp(data)
            assert ei.value.qualname == f"{module}.{name}"
        if (module, name) not in ptfile.TORCH_ALLOW and not (module == "torch" and name in ptfile.DTYPES) \
                and not (module == "torch" and name in ptfile.STORAGE_NAMES):
            with pytest.raises(RefusedGlobal) as ei:
                ptfile.loads(data)
            assert ei.value.qualname == f"{module}.{name}"
        assert not marker.exists()
    run()


# ---- run-state files, path expressions, hostlists --------------------------------------------------------
def test_fuzz_run_state_and_paths_and_hostlists(rss_budget):
    json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                               lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                               max_leaves=12)

    @given(st.dictionaries(st.sampled_from(["schema", "config", "trainer", "sampler", "dataloader", "buffer",
                                            "inflight", "reserve", "capture", "provenance", "x"]),
                           json_values, max_size=6), st.text(max_size=40), st.text(max_size=40))
    def run(doc, expr, hl):
        doc.setdefault("schema", "ckptdoctor.run_state/v1")
        try:
            normalize(doc, "state.json")
        except InputError as exc:
            assert "state.json" in str(exc)
        try:
            pathexpr.evaluate({"a": {"b": [1, 2]}}, expr)
        except pathexpr.PathError:
            pass
        try:
            hosts = expand(hl)
            assert len(hosts) <= 100_000
        except HostlistError:
            pass
    run()


def test_fuzz_decoded_values_stay_within_budget():
    """Random YAML with anchors and aliases (bomb seeds included): parsed within the alias, node and
    depth budgets, or refused as ValueError; never a hang, a crash, or gigabytes."""
    import resource
    from hypothesis import example
    from ckptdoctor.runstate.profiles import parse_text
    laughs = "a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + q] * 10)}]\n" for q, c in zip("abcdefgh", "bcdefghi"))

    @example(laughs)
    @example("l: &l [*l]\n")
    @example("[" * 5000 + "]" * 5000)
    @given(st.lists(st.sampled_from(["a: &a [1, 2]", "b: &b [*a, *a]", "c: &c {k: *b}", "d: [*c, *c, *b]",
                                     "e: &e [*d, *d, *d]", "f: [*e, *e, *e, *e]", "x: 1", "- y"]),
                    max_size=12).map("\n".join))
    def run(text):
        t0 = time.monotonic()
        try:
            parse_text("state.yaml", text.encode())
        except ValueError:
            pass
        assert time.monotonic() - t0 < 5
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < (2 << 20)
    run()


# ---- pickles that try to run code --------------------------------------------------------------------------
class _Reduce:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def _evil_pickles(marker):
    cmd = f"touch {marker}"
    return {
        "os.system": pickle.dumps(_Reduce(os.system, cmd), protocol=2),
        "subprocess.Popen": pickle.dumps(_Reduce(subprocess.Popen, ["touch", str(marker)]), protocol=2),
        "builtins.eval": pickle.dumps(_Reduce(eval, f"__import__('os').system({cmd!r})"), protocol=2),
        "builtins.exec": pickle.dumps(_Reduce(exec, f"open({str(marker)!r}, 'w')"), protocol=2),
        "builtins.getattr": b"\x80\x02cbuiltins\ngetattr\ncos\nsystem\n\x86R" + pickle.dumps(cmd, 2)[2:-1] + b"\x85R.",
        "torch.load": b"\x80\x02ctorch\nload\nX\x03\x00\x00\x00/x/\x85R.",
        "posix.system": b"\x80\x02cposix\nsystem\nX" + struct.pack("<I", len(cmd)) + cmd.encode() + b"\x85R.",
    }


@pytest.mark.parametrize("name", list(_evil_pickles("/x").keys()))
def test_evil_metadata_is_refused_and_runs_nothing(tmp_path, name):
    marker = tmp_path / "pwned"
    ck = tmp_path / "ck"
    W.write(str(ck), [W.Item("w", (2, 2), (0, 0), (2, 2), [1.0] * 4)])
    (ck / ".metadata").write_bytes(_evil_pickles(marker)[name])
    rep = api.verify(str(ck))
    hits = assert_fires(rep, "CKD110")
    # refused exactly as the pickle names it (protocol 2 writes Python 2 names: __builtin__.eval)
    named = _first_global(_evil_pickles(marker)[name])
    assert named.split(".")[-1] == name.split(".")[-1]
    assert hits[0].details["refused_global"] == named
    assert f"refused to unpickle global {named}" in hits[0].message
    assert not marker.exists()


@pytest.mark.parametrize("name", list(_evil_pickles("/x").keys()))
def test_evil_pt_is_refused_and_runs_nothing(tmp_path, name):
    marker = tmp_path / "pwned"
    data = _pt(_evil_pickles(marker)[name])
    with pytest.raises(RefusedGlobal) as ei:
        ptfile.read_pt(io.BytesIO(data))
    assert ei.value.qualname == _first_global(_evil_pickles(marker)[name])
    assert not marker.exists()


def _first_global(data: bytes) -> str:
    import pickletools
    for op, arg, _ in pickletools.genops(data):
        if op.name == "GLOBAL":
            return arg.replace(" ", ".")
    raise AssertionError("no GLOBAL opcode")


def test_nested_zip_member_is_not_followed(tmp_path):
    inner = _pt(pickle.dumps({"x": 1}, 2))
    outer = _pt(pickle.dumps({"_num_yielded": 2}, 2), extra={"archive/data/0": inner,
                                                             "archive/nested.pt": inner})
    assert ptfile.read_pt(io.BytesIO(outer)) == {"_num_yielded": 2}


# ---- read-only guarantee -----------------------------------------------------------------------------------
def _snapshot(root):
    out = {}
    for dp, dn, fn in os.walk(root):
        for n in sorted(dn + fn):
            p = os.path.join(dp, n)
            s = os.lstat(p)
            digest = hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.isfile(p) else None
            out[p] = (s.st_size, s.st_mtime_ns, s.st_mode, digest)
    return out


def test_inspections_change_nothing_on_a_writable_tree(real, tmp_path):
    """verify, verify --checksums, preflight and reconcile on a tree they *could* write to: each one
    runs and judges (exit 0 or 1, a JSON report), and afterwards every name, size, mode, mtime and
    digest is as before, and no file was added."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fixtures"))
    import nemo_rl_ckpt
    run = real("megatron_run")
    os.truncate(next((run / "iter_0000200").glob("__0_*.distcp")), 9)  # something to report
    (run / "iter_0000100" / "ckptdoctor.manifest.json").write_text("{}")
    rl = tmp_path / "rl"
    step = nemo_rl_ckpt.write_step(rl, step=7, cursor=6, batches=8)  # the dataloader ran a batch ahead
    before = {**_snapshot(run), **_snapshot(rl)}
    expect = {"verify": "CKD104", "verify --checksums": "CKD154", "preflight": "CKD402", "reconcile": "CKD303"}
    for what, args in (("verify", ["verify", str(run)]), ("verify --checksums", ["verify", "--checksums", str(run)]),
                       ("preflight", ["preflight", str(run), "--nodelist", "n[1-2]", "--ranks-per-node", "1"]),
                       ("reconcile", ["reconcile", step])):
        rc, out, err = cli(*args, "-f", "json")
        assert rc in (0, 1) and "Traceback" not in err, (what, rc, err)
        rules = {f["rule"] for f in json.loads(out)["findings"]}
        assert expect[what] in rules, (what, rules)
    after = {**_snapshot(run), **_snapshot(rl)}
    assert set(after) == set(before)
    for p, v in before.items():
        assert after[p] == v, p  # size, mtime, mode, digest


# ---- paths ---------------------------------------------------------------------------------------------------
def test_symlinks_loops_odd_names_and_unreadable_dirs(real, tmp_path):
    run = real("megatron_run")
    ck = run / "iter_0000200"
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"x" * 10)
    os.symlink(outside, ck / "extra.bin")
    os.symlink(ck / "loop_a", ck / "loop_b")
    os.symlink(ck / "loop_b", ck / "loop_a")
    os.symlink(tmp_path / "gone", ck / "dangling.bin")
    (ck / "name with spaces.txt").write_text("hi")
    with open(os.path.join(os.fsencode(ck), b"bad\xffname.bin"), "wb") as fh:
        fh.write(b"x")
    for fmt in ("text", "json", "sarif"):
        rc, out, err = cli("verify", "--format", fmt, str(run))
        assert rc in (0, 1) and "Traceback" not in err, err
    rep = api.verify(str(run))
    hits = assert_fires(rep, "CKD125")
    msgs = " ".join(h.message for h in hits)
    assert "outside" in msgs and "loop" in msgs and "dangling" in msgs


def test_a_shard_disappearing_while_read(real):
    """List the checkpoint, then the shard vanishes before its bytes are read: a finding."""
    from ckptdoctor.commands import verify as flow
    from ckptdoctor.io.fs import open_location
    ck_dir = real("megatron_run") / "iter_0000200"
    from ckptdoctor.layouts.locate import locate
    ck = locate(open_location(str(ck_dir))).checkpoint
    ck.entries  # the listing happens now ...
    gone = next(ck_dir.glob("__0_*.distcp"))
    gone.unlink()  # ... and the file disappears before the checks read it
    eng = api.make_engine("verify", str(ck_dir))
    flow.check_checkpoint(eng, ck)
    rules = {f.rule for f in eng.report.findings}
    assert "CKD900" not in rules, [(f.rule, f.message) for f in eng.report.findings]
    hits = assert_fires(eng.report, "CKD901", path_contains=gone.name)
    assert "listed" in hits[0].message


def test_forged_memo_index_is_refused_fast_and_the_limit_is_restored(metadata_seed, tmp_path):
    """Found by the fuzzer: one flipped bit in a LONG_BINPUT index made the C unpickler allocate
    and zero gigabytes for a 1 KB file.  Now an address-space budget turns that into a finding."""
    import resource
    import time
    i = metadata_seed.index(b"r\x04\x00\x00\x00")  # a LONG_BINPUT with index 4
    forged = metadata_seed[:i + 4] + b"\x10" + metadata_seed[i + 5:]  # index 0x10000004
    before = resource.getrlimit(resource.RLIMIT_AS)
    t = time.perf_counter()
    with pytest.raises(dcp.MetadataError, match="needs more than"):
        dcp.parse(forged)
    assert time.perf_counter() - t < 1.0
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    ck = tmp_path / "ck"
    W.write(str(ck), [W.Item("w", (4, 4), (r * 2, 0), (2, 4), [1.0] * 8, rank=r) for r in range(2)])
    (ck / ".metadata").write_bytes(forged)
    rep = api.verify(str(ck))
    assert_fires(rep, "CKD110")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    from ckptdoctor.demo import build_run
    root = tmp_path_factory.mktemp("demo") / "run"
    build_run(str(root))
    return root


def test_fuzz_whole_checkpoints_end_to_end(demo_run, tmp_path_factory):
    """Random truncations, bit flips and deletions anywhere in a run root, then the full verify
    (with checksums): findings only, never an internal error (CKD900) or an exception."""
    files = sorted(p.relative_to(demo_run) for p in demo_run.rglob("*") if p.is_file())

    import resource

    @settings(max_examples=40 if not os.environ.get("CKPTDOCTOR_FUZZ") else 2000, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from(files), st.sampled_from(["truncate", "flip", "delete", "junk", "fifo",
                                                                        "devzero", "dir"]),
                              st.integers(0, 1 << 16)), min_size=1, max_size=3))
    def run(ops):
        t0 = time.monotonic()
        d = tmp_path_factory.mktemp("fz") / "run"
        shutil.copytree(demo_run, d)
        for rel, op, k in ops:
            p = d / rel
            if not p.is_file() or p.is_symlink():  # gone, or already replaced by a FIFO, device or dir
                continue
            data = p.read_bytes()
            if op == "truncate":
                p.write_bytes(data[:k % (len(data) + 1)])
            elif op == "flip" and data:
                i = k % len(data)
                p.write_bytes(data[:i] + bytes([data[i] ^ (1 << (k % 8))]) + data[i + 1:])
            elif op == "delete":
                p.unlink()
            elif op == "fifo":  # hostile types in place of a file: never opened, never a hang
                p.unlink()
                os.mkfifo(p)
            elif op == "devzero":
                p.unlink()
                os.symlink("/dev/zero", p)
            elif op == "dir":
                p.unlink()
                (p / "x").mkdir(parents=True)
            else:
                p.write_bytes(data + bytes([k & 0xFF]) * (k % 64))
        for checksums in (False, True):
            rep = api.verify(str(d), checksums=checksums, quiet=True)
            assert not [f for f in rep.findings if f.rule == "CKD900"], \
                [(f.rule, f.message) for f in rep.findings]
        # a resource budget per example: seconds, and the process's peak RSS (a high-water mark)
        assert time.monotonic() - t0 < 20
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < (2 << 20), "peak RSS over 2 GiB"
        shutil.rmtree(d.parent)
    run()


def test_storage_index_offset_of_the_wrong_type(metadata_seed):
    """Found by the long fuzz profile (falsifying example: bit 0 of byte 976 of this seed): a
    MetadataIndex whose offset is another object raised TypeError out of the parser."""
    forged = metadata_seed[:976] + bytes([metadata_seed[976] ^ 1]) + metadata_seed[977:]
    with pytest.raises(dcp.MetadataError):
        dcp.parse(forged)


def _u(s: str) -> bytes:
    return pickle.BINUNICODE + struct.pack("<I", len(s.encode())) + s.encode()


def _obj(qualname: str, *states: bytes) -> bytes:
    """NEWOBJ of a global, then one BUILD per state (raw opcodes, as a forged file would hold)."""
    mod, name = qualname.rsplit(".", 1)
    return pickle.GLOBAL + f"{mod}\n{name}\n".encode() + pickle.EMPTY_TUPLE + pickle.NEWOBJ + \
        b"".join(st + pickle.BUILD for st in states)


def _dict(*items: bytes) -> bytes:
    return pickle.EMPTY_DICT + (pickle.MARK + b"".join(items) + pickle.SETITEMS if items else b"")


MD = "torch.distributed.checkpoint.metadata"


def test_dcp_dtype_that_is_no_dtype_is_refused_not_a_crash():
    """TensorProperties' state is read inline for its dtype: an unhashable object there (a list) is
    a MetadataError naming the tensor, never a crashed check."""
    ints = lambda *v: pickle.MARK + b"".join(pickle.BININT1 + bytes([x]) for x in v) + pickle.TUPLE
    chunk = _obj(f"{MD}.ChunkStorageMetadata", _dict(_u("offsets"), ints(0), _u("sizes"), ints(4)))
    for dtype, ok in ((pickle.GLOBAL + b"torch\nfloat32\n", True), (pickle.EMPTY_LIST + pickle.BININT1 + b"\x01"
                                                                     + pickle.APPEND, False)):
        props = _obj(f"{MD}.TensorProperties", pickle.MARK + dtype + pickle.TUPLE)
        tsm = _obj(f"{MD}.TensorStorageMetadata", _dict(_u("size"), ints(4), _u("chunks"),
                                                        pickle.EMPTY_LIST + chunk + pickle.APPEND,
                                                        _u("properties"), props))
        data = pickle.PROTO + b"\x02" + _obj(f"{MD}.Metadata", _dict(
            _u("state_dict_metadata"), _dict(_u("w"), tsm), _u("storage_data"), _dict())) + pickle.STOP
        if ok:
            assert dcp.parse(data).tensors["w"].dtype == "float32"
        else:
            with pytest.raises(dcp.MetadataError, match="w: dtype is list"):
                dcp.parse(data)


def test_dcp_records_built_twice_or_from_an_iterable_are_refused():
    """The DCP stand-ins take their fields from the state BUILD hands them (io.unpickle.Record): a
    record BUILT a second time, or REDUCEd on an iterable instead, is malformed, never read by
    either state."""
    empty_md = _dict(_u("state_dict_metadata"), _dict(), _u("storage_data"), _dict())
    ok = pickle.PROTO + b"\x02" + _obj(f"{MD}.Metadata", empty_md) + pickle.STOP
    assert dcp.parse(ok).tensors == {}
    twice = pickle.PROTO + b"\x02" + _obj(f"{MD}.Metadata", empty_md, _dict()) + pickle.STOP
    with pytest.raises(dcp.MetadataError):
        dcp.parse(twice)
    size = _u("size") + pickle.MARK + pickle.BININT1 + b"\x04" + pickle.TUPLE
    tsm = _obj(f"{MD}.TensorStorageMetadata", _dict(size, _u("chunks"), pickle.EMPTY_LIST), _dict())
    per_tensor = pickle.PROTO + b"\x02" + _obj(f"{MD}.Metadata", _dict(
        _u("state_dict_metadata"), _dict(_u("w"), tsm), _u("storage_data"), _dict())) + pickle.STOP
    with pytest.raises(dcp.MetadataError, match="w size is not a tuple"):
        dcp.parse(per_tensor)   # the second, empty state is what is read, never the first
    reduced = pickle.PROTO + b"\x02" + pickle.GLOBAL + f"{MD}\nMetadata\n".encode() + pickle.MARK + \
        pickle.MARK + empty_md + pickle.TUPLE + pickle.TUPLE + pickle.REDUCE + pickle.STOP
    with pytest.raises(dcp.MetadataError):
        dcp.parse(reduced)   # Metadata(({...},)): a list holding one dict, but no BUILD made it


# ---- the address-space budget a pickle loads under (io.unpickle.memory_budget) -------------------
_BUDGET_PROBE = r'''
import json, resource, sys
from ckptdoctor.io.unpickle import PickleTooBig, memory_budget
case = sys.argv[1]
if case == "no-resource":
    sys.modules["resource"] = None          # a platform without it (Windows): no cap, the load still runs
    with memory_budget(64 << 20):
        print(json.dumps({"allocated": len(bytearray(16 << 20))}))
    sys.exit(0)
if case == "no-statm":                      # no /proc (macOS): no cap, the load still runs
    import builtins
    real_open = builtins.open
    def no_proc(path, *a, **k):
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(2, "No such file or directory", path)
        return real_open(path, *a, **k)
    builtins.open = no_proc
    with memory_budget(64 << 20):
        print(json.dumps({"allocated": len(bytearray(16 << 20))}))
    sys.exit(0)
def vm():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * resource.getpagesize()
import mmap
ballast = mmap.mmap(-1, 320 << 20)          # address space held but never touched: the budget counts the
                                            # address space (what RLIMIT_AS limits), not the resident pages
if case == "site-loose":                    # a site limit looser than the budget
    resource.setrlimit(resource.RLIMIT_AS, (vm() + (8 << 30), resource.RLIM_INFINITY))
elif case == "site-tight":                  # a site limit tighter than the budget
    resource.setrlimit(resource.RLIMIT_AS, (vm() + (512 << 20), resource.RLIM_INFINITY))
before = resource.getrlimit(resource.RLIMIT_AS)
out = {}
with memory_budget(1 << 30 if case == "site-tight" else 64 << 20):
    out["inside"] = resource.getrlimit(resource.RLIMIT_AS)[0]
    out["small"] = len(bytearray(16 << 20))    # well inside what the pickle may add
try:
    with memory_budget(64 << 20):
        bytearray(1 << 30)
    out["big"] = "allocated"
except PickleTooBig as exc:
    out["big"] = str(exc)
except MemoryError:
    out["big"] = "MemoryError"
out["restored"] = resource.getrlimit(resource.RLIMIT_AS) == before
out["before"] = before[0]
print(json.dumps(out))
'''


def _budget(case: str) -> dict:
    p = subprocess.run([sys.executable, "-c", _BUDGET_PROBE, case], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_a_pickle_may_add_its_budget_to_the_address_space_and_no_more_and_the_limit_is_restored():
    """The budget is what loading may add to the process as it stands (here one already holding
    320 MiB), not a total: 16 MiB fits in 64 MiB, 1 GiB is refused as PickleTooBig naming the budget in MiB, and the process's own
    limit is back afterwards."""
    r = _budget("none")
    assert r["small"] == 16 << 20
    assert r["big"] == "needs more than 64 MiB to unpickle"
    assert r["restored"]


def test_a_site_address_space_limit_looser_than_the_budget_does_not_switch_the_budget_off():
    """A Slurm job often runs under a finite RLIMIT_AS; the pickle budget is still enforced inside
    it, and the site's limit is restored."""
    r = _budget("site-loose")
    assert r["big"] == "needs more than 64 MiB to unpickle"
    assert r["restored"] and r["inside"] < r["before"]


def test_a_site_address_space_limit_tighter_than_the_budget_is_never_loosened():
    r = _budget("site-tight")
    assert r["inside"] == r["before"], "the budget raised a limit the site had set lower"
    assert r["small"] == 16 << 20 and r["restored"]


@pytest.mark.parametrize("case", ["no-resource", "no-statm"])
def test_without_the_resource_module_or_proc_a_pickle_loads_without_a_cap(case):
    assert _budget(case) == {"allocated": 16 << 20}


def test_a_pickle_is_granted_sixteen_bytes_of_objects_per_pickled_byte_over_a_64_mib_floor():
    """Real DCP metadata grows ~8x when unpickled (1M records measured): the budget's documented
    shape, so a large real .metadata is never refused for memory."""
    from ckptdoctor.io.unpickle import pickle_budget
    for size in (0, 1, 4 << 20, 300 << 20):
        assert pickle_budget(size) == 16 * size + (64 << 20)
