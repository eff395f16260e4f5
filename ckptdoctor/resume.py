"""Prove a resume, not just a save: per-rank state digests recorded at save time and checked in
the new process after the restore (seed 003 §6: a correct save digest is not a restore test).

    # at save time, on every rank, after the checkpoint's data is written
    ckptdoctor.resume.record({"model": model, "optim": optimizer, "sched": scheduler,
                              "step": step, "data": dataloader_state}, ckpt_dir)
    # in the relaunched job, on every rank, after everything was restored
    ckptdoctor.resume.check({...the same names...}, ckpt_dir)   # raises ResumeMismatch

Each item is digested where it lives: a tensor by its bytes (xxh3-128, with dtype and shape), a
DTensor by its local shard (with its placements and global shape), a ShardedTensor by its local
shards; objects with `state_dict()` (modules, optimizers, schedulers, dataloaders) through it;
scalars and nested Python values by a canonical encoding (floats exactly, via float.hex).  The RNG
streams (torch CPU, CUDA when present, Python `random`, NumPy) are captured by `record` itself.
The result is `ckpt_dir/ckptdoctor.digests/rank_{r:05d}.json`, written atomically, with the identity
of the process that wrote it: `check` refuses to count as proof in that same process.

torch is imported only here, only when these functions run.
"""
from __future__ import annotations

import json
import os
import random
import socket
import time
from .values import value, field
TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import Any

import xxhash

DIR = "ckptdoctor.digests"
FORMAT = "ckptdoctor.digests/v1"
MAX_DIGEST_FILE = 256 << 20
MAX_DEPTH = 64


class ResumeMismatch(AssertionError):
    """The restored state differs from what was saved; `.differing`, `.missing`, `.unexpected`
    list the items (paths like "optim/state/0/exp_avg")."""

    def __init__(self, rank: int, differing: list[str], missing: list[str], unexpected: list[str],
                 detail: dict[str, str] | None = None):
        self.rank, self.differing, self.missing, self.unexpected = rank, differing, missing, unexpected
        self.detail = detail or {}
        parts = []
        for what, items in (("differ", differing), ("are missing after the restore", missing),
                            ("were not saved", unexpected)):
            if items:
                shown = ", ".join(f"{i}{' (' + self.detail[i] + ')' if i in self.detail else ''}" for i in items[:20])
                parts.append(f"{len(items)} item(s) {what}: {shown}{' ...' if len(items) > 20 else ''}")
        super().__init__(f"rank {rank}: resumed state does not match the saved state: " + "; ".join(parts))


class NotAProof(RuntimeError):
    """`check` ran in the process that saved: it would compare the state with itself."""


@value(frozen=True)
class Digest:
    kind: str                 # "tensor" | "dtensor" | "sharded" | "value"
    digest: str               # xxh3-128 hex
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    extra: str | None = None  # placements / shard offsets, global shape

    def to_json(self) -> dict:
        d = {"kind": self.kind, "xxh3_128": self.digest}
        if self.dtype is not None:
            d["dtype"] = self.dtype
        if self.shape is not None:
            d["shape"] = list(self.shape)
        if self.extra is not None:
            d["extra"] = self.extra
        return d

    @classmethod
    def from_json(cls, d: Any) -> "Digest":
        if not isinstance(d, dict) or not isinstance(d.get("kind"), str) or not isinstance(d.get("xxh3_128"), str):
            raise ValueError(f"not a digest record: {d!r:.80}")
        shape = d.get("shape")
        return cls(d["kind"], d["xxh3_128"], d.get("dtype"), tuple(shape) if isinstance(shape, list) else None,
                   d.get("extra"))

    def describe(self, other: "Digest") -> str:
        if self.kind != other.kind:
            return f"{other.kind} now, {self.kind} when saved"
        if self.dtype != other.dtype:
            return f"dtype {other.dtype} now, {self.dtype} when saved"
        if self.shape != other.shape:
            return f"shape {list(other.shape or ())} now, {list(self.shape or ())} when saved"
        if self.extra != other.extra:
            return f"layout {other.extra} now, {self.extra} when saved"
        return "bytes differ"


@value
class DigestSet:
    rank: int
    world_size: int
    items: dict[str, Digest]
    process: dict = field(default_factory=dict)
    created: str = ""


# ---- digesting -----------------------------------------------------------------------------------
def _tensor_bytes(t) -> memoryview:
    import torch
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def _tensor(t) -> Digest:
    h = xxhash.xxh3_128(_tensor_bytes(t)).hexdigest()
    return Digest("tensor", h, str(t.dtype), tuple(t.shape))


def _canonical(v: Any, path: str) -> bytes:
    """Scalars by type and exact value (floats via float.hex: -0.0, NaN and 1e-300 stay distinct)."""
    if v is None or isinstance(v, bool):
        return repr(v).encode()
    if isinstance(v, int):
        return b"i" + str(v).encode()
    if isinstance(v, float):
        return b"f" + v.hex().encode()
    if isinstance(v, str):
        return b"s" + v.encode("utf-8", "surrogatepass")
    if isinstance(v, (bytes, bytearray)):
        return b"b" + bytes(v)
    if isinstance(v, complex):
        return b"c" + v.real.hex().encode() + b"," + v.imag.hex().encode()
    raise TypeError(f"{path}: cannot digest a {type(v).__module__}.{type(v).__qualname__} "
                    f"(pass its state_dict(), or tensors and plain values)")


def _key(k: Any) -> str:
    """A dict key as a path segment, by type and value: int 0 is `0`, str "0" is `'0'` (an optimizer
    state restored with str keys leaves Adam's moments attached to no parameter; it must not digest
    like the int-keyed one).  Other str keys stay as they are; other types carry their type name."""
    if isinstance(k, bool) or not isinstance(k, (int, str)):
        seg = f"{type(k).__name__}:{k!r}"
    elif isinstance(k, int):
        seg = str(k)
    elif k.lstrip("-").isdigit() or k[:1] in ("'", "#") or ":" in k:
        seg = f"'{k}'"
    else:
        seg = k
    return seg.replace("%", "%25").replace("/", "%2F")


def digest_state(state: Any) -> dict[str, Digest]:
    """Every leaf of `state` -> its Digest, keyed by path ("optim/state/0/exp_avg")."""
    out: dict[str, Digest] = {}
    _walk(state, "", out, 0)
    return out


def _walk(obj: Any, path: str, out: dict[str, Digest], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise TypeError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    import sys
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        out[path or "<root>"] = _any_tensor(torch, obj)
        return
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        out[path or "<root>"] = Digest("tensor", xxhash.xxh3_128(a.view(np.uint8).reshape(-1)).hexdigest()
                                       if a.size else xxhash.xxh3_128(b"").hexdigest(), f"numpy.{a.dtype}", a.shape)
        return
    if np is not None and isinstance(obj, np.generic):
        obj = obj.item()
    sd = getattr(obj, "state_dict", None)
    if callable(sd) and not isinstance(obj, type):
        _walk(sd(), path, out, depth + 1)
        return
    if isinstance(obj, dict):
        if not obj:
            out[path or "<root>"] = Digest("value", xxhash.xxh3_128(b"{}").hexdigest())
        for k in obj:
            _walk(obj[k], f"{path}/{_key(k)}" if path else _key(k), out, depth + 1)
        return
    if isinstance(obj, Digest):  # already digested (the RNG streams)
        out[path or "<root>"] = obj
        return
    if isinstance(obj, (list, tuple)):
        if not obj:
            out[path or "<root>"] = Digest("value", xxhash.xxh3_128(b"[]").hexdigest())
        for i, v in enumerate(obj):
            _walk(v, f"{path}/{i}" if path else str(i), out, depth + 1)
        return
    out[path or "<root>"] = Digest("value", xxhash.xxh3_128(_canonical(obj, path or "<root>")).hexdigest())


def _any_tensor(torch, t) -> Digest:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        DTensor = ()
    if DTensor and isinstance(t, DTensor):
        local = _tensor(t.to_local())
        return Digest("dtensor", local.digest, local.dtype, local.shape,
                      f"global {list(t.shape)} {[str(p) for p in t.placements]}")
    try:
        from torch.distributed._shard.sharded_tensor import ShardedTensor
    except ImportError:  # pragma: no cover
        ShardedTensor = ()
    if ShardedTensor and isinstance(t, ShardedTensor):
        h = xxhash.xxh3_128()
        offs = []
        for s in sorted(t.local_shards(), key=lambda s: list(s.metadata.shard_offsets)):
            h.update(_tensor_bytes(s.tensor))
            offs.append(list(s.metadata.shard_offsets))
        return Digest("sharded", h.hexdigest(), str(t.dtype), tuple(t.size()), f"local shards at {offs}")
    return _tensor(t)


def whole(obj: Any) -> Digest:
    """One digest for a whole value (an RNG stream is one item, not its 625 words)."""
    h = xxhash.xxh3_128()
    for k, d in sorted(digest_state(obj).items()):
        h.update(f"{k}\0{d.kind}\0{d.digest}\0{d.dtype}\0{d.shape}\0{d.extra}\n".encode())
    return Digest("value", h.hexdigest())


RNG_STREAMS = ("python", "torch_cpu", "torch_cuda", "numpy")


def rng_state(streams=RNG_STREAMS) -> dict[str, Digest]:
    """The RNG streams (python, torch_cpu, torch_cuda, numpy), one digest each; `streams` picks some."""
    import sys
    out: dict[str, Any] = {}
    if "python" in streams:
        out["python"] = random.getstate()
    torch = sys.modules.get("torch")
    if torch is not None:
        if "torch_cpu" in streams:
            out["torch_cpu"] = torch.get_rng_state()
        if "torch_cuda" in streams and torch.cuda.is_available() and torch.cuda.is_initialized():
            out["torch_cuda"] = list(torch.cuda.get_rng_state_all())
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in streams:
        out["numpy"] = np.random.get_state()
    return {k: whole(v) for k, v in out.items()}


def _streams(rng) -> tuple[str, ...]:
    """rng=True: every stream; False: none; an iterable of names: those (checked)."""
    if rng is True:
        return RNG_STREAMS
    if rng is False or rng is None:
        return ()
    try:
        names = tuple(rng) if not isinstance(rng, str) else (rng,)
    except TypeError:   # rng=1 was a TypeError about an int not being iterable
        raise ValueError(f"rng={rng!r}: pass True, False or stream names ({', '.join(RNG_STREAMS)})") from None
    bad = [n for n in names if n not in RNG_STREAMS]
    if bad:
        raise ValueError(f"rng={names!r}: unknown stream(s) {bad}; use {', '.join(RNG_STREAMS)}")
    return names


# ---- identity --------------------------------------------------------------------------------------
def process_identity() -> dict:
    from .publishing.naming import start_time
    boot = None
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read(64).strip()
    except OSError:
        pass
    return {"host": socket.gethostname(), "pid": os.getpid(), "boot_id": boot, "start_time": start_time(os.getpid())}


def _rank(rank: int | None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world size): from the arguments, else the process group, else (0, 1)."""
    import sys
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        r, w = (dist.get_rank() if rank is None else rank), (world_size or dist.get_world_size())
    else:
        r, w = (0 if rank is None else rank), (world_size or 1)
    if not 0 <= r < w:
        raise ValueError(f"rank {r} is outside a world of {w} (pass world_size= without a process group)")
    return r, w


# ---- files ----------------------------------------------------------------------------------------
def path_for(ckpt_dir: str, rank: int) -> str:
    return os.path.join(os.fspath(ckpt_dir), DIR, f"rank_{rank:05d}.json")


def load(path: str) -> DigestSet:
    """One rank's digest file; ValueError (one line, naming the file) when it is not one."""
    from .io.fs import read_regular
    try:
        data = read_regular(path, MAX_DIGEST_FILE)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return parse(data, path)


def parse(data: bytes, path: str) -> DigestSet:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{path}: not JSON ({str(exc)[:80]})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file")
    r, w, items = doc.get("rank"), doc.get("world_size"), doc.get("items")
    if not (type(r) is int and type(w) is int and 0 <= r < w and isinstance(items, dict)):
        raise ValueError(f"{path}: rank, world_size or items missing or out of range")
    try:
        parsed = {str(k): Digest.from_json(v) for k, v in items.items()}
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    proc = doc.get("process") if isinstance(doc.get("process"), dict) else {}
    return DigestSet(r, w, parsed, proc, str(doc.get("created", "")))


def record(state: Any, ckpt_dir: str, rank: int | None = None, *, world_size: int | None = None,
           rng=True) -> str:
    """Digest `state` (plus the RNG streams: rng=True all, False none, or names such as
    {"torch_cpu", "numpy"}) and write this rank's digest file inside the checkpoint, atomically.
    Rank and world size come from the process group unless given.  Returns its path."""
    from .io.atomic import replace_file
    r, world = _rank(rank, world_size)
    streams = _streams(rng)
    items = digest_state({"state": state, **({"rng": rng_state(streams)} if streams else {})})
    doc = {"format": FORMAT, "rank": r, "world_size": world, "process": process_identity(),
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "items": {k: v.to_json() for k, v in sorted(items.items())}}
    path = path_for(ckpt_dir, r)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    replace_file(path, json.dumps(doc, indent=1).encode())
    return path


@value(frozen=True)
class CheckResult:
    rank: int
    items: int


def compare(saved: dict[str, Digest], now: dict[str, Digest]) -> tuple[list[str], list[str], list[str], dict]:
    differing = sorted(k for k in saved.keys() & now.keys() if saved[k] != now[k])
    detail = {k: saved[k].describe(now[k]) for k in differing}
    return differing, sorted(saved.keys() - now.keys()), sorted(now.keys() - saved.keys()), detail


def check(state: Any, ckpt_dir: str, rank: int | None = None, *, rng=True,
          allow_same_process: bool = False) -> CheckResult:
    """After the restore, in the new process: compare `state` (and the RNG streams: rng=True all that
    were recorded, False none, or names such as {"torch_cpu"}) item by item with what `record` wrote
    for this rank.  Raises ResumeMismatch listing every differing, missing and unexpected item.

    Run in the process that saved, the comparison would be of the state with itself, so it raises
    NotAProof -- unless allow_same_process=True: for a test that really builds fresh objects and
    restores into them in one process (it then proves the restore code, not the relaunch)."""
    r = rank if rank is not None else _rank(None)[0]
    saved = load(path_for(ckpt_dir, r))
    me = process_identity()
    if not allow_same_process and all(saved.process.get(k) == me[k] for k in ("host", "pid", "boot_id", "start_time")):
        raise NotAProof(f"rank {r}: check() runs in the process that saved this checkpoint "
                        f"(host {me['host']}, pid {me['pid']}): restore in a new process to prove a resume "
                        f"(a one-process test that builds fresh objects: allow_same_process=True)")
    streams = _streams(rng)
    now = digest_state({"state": state, **({"rng": rng_state(streams)} if streams else {})})
    wanted = {k for k in saved.items if not k.startswith("rng/") or k.split("/", 2)[1] in streams}
    differing, missing, unexpected, detail = compare({k: saved.items[k] for k in wanted}, now)
    if differing or missing or unexpected:
        raise ResumeMismatch(r, differing, missing, unexpected, detail)
    return CheckResult(r, len(now))
