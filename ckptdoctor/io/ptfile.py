"""Read a `torch.save` file as data, without torch and without running its pickle.

A `.pt` is a zip whose `<archive>/data.pkl` is a pickle; tensor bytes live in other members and
are never read.  The unpickler resolves:
  * tensor rebuild functions to a shape-only `TensorStub` (dtype from the storage class),
  * a few builtin containers (`OrderedDict`, `set`, ...) to real ones,
  * classes of known training frameworks (NeMo-RL, TransferQueue, torchdata, verl, numpy
    scalars...) to inert attribute bags that only record their fields,
and refuses everything else (`os.system`, `builtins.eval`, `subprocess.Popen`, torch globals
outside the list) with RefusedGlobal naming it.  Nothing from the file is ever called.
"""
from __future__ import annotations

import io
import pickle
import struct
import zipfile
import zlib
from ..values import value
TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import Any

from .unpickle import DTYPES, Bag, DType, RefusedGlobal, bag_class, memory_budget, pickle_budget

MAX_PICKLE_BYTES = 256 << 20   # a run-state `.pt` pickle is KBs to MBs; refuse absurd ones
MAX_INFLATE_RATIO = 100        # zlib's own maximum is ~1032x; torch.save stores data.pkl uncompressed
MAX_MEMBERS = 100_000


class PtError(ValueError):
    """Not a readable torch.save archive (one line, no traceback)."""


@value(frozen=True)
class TensorStub:
    """What a tensor looks like without its bytes."""
    shape: tuple
    dtype: str | None

    def __len__(self):
        return self.shape[0] if self.shape else 0

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@value(frozen=True)
class StorageStub:
    dtype: str | None
    key: str
    numel: int | None


def _rebuild_tensor(storage, storage_offset=0, size=(), stride=None, *rest):
    dtype = storage.dtype if isinstance(storage, StorageStub) else None
    try:
        shape = tuple(int(x) for x in size)
    except (TypeError, ValueError):
        raise pickle.UnpicklingError(f"tensor with a non-integer shape {size!r:.60}") from None
    return TensorStub(shape, dtype)


def _rebuild_parameter(data, *rest):
    return data


def _storage_type(name: str):
    base = name.replace("Storage", "")
    dtype = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
             "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
             "Bool": "bool", "Untyped": "uint8"}.get(base)
    return DType(dtype or name)


class AttrDict(dict):
    """collections.OrderedDict's stand-in: a dict that also takes the attributes a pickle BUILDs
    onto it (a module state_dict carries `_metadata`; Lightning .ckpt files pickle those)."""


TORCH_ALLOW = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch", "Size"): tuple,
    ("torch", "device"): str,
    ("collections", "OrderedDict"): AttrDict,
    ("collections", "defaultdict"): lambda *a: {},
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("builtins", "slice"): slice,
    ("datetime", "datetime"): lambda *a: a,
}
STORAGE_NAMES = {"FloatStorage", "DoubleStorage", "HalfStorage", "BFloat16Storage", "LongStorage",
                 "IntStorage", "ShortStorage", "CharStorage", "ByteStorage", "BoolStorage",
                 "UntypedStorage"}
# Classes from these packages become inert bags (their fields are the data we read).
DATA_MODULE_PREFIXES = ("nemo_rl.", "transfer_queue.", "torchdata.", "verl.", "openrlhf.", "trl.",
                        "numpy.")
# Never stand in for these, whatever the prefix list says: they are how pickles run code.
DANGEROUS_MODULES = ("builtins", "os", "posix", "nt", "subprocess", "sys", "importlib", "shutil",
                     "socket", "pickle", "marshal", "types", "runpy", "code", "ctypes", "pty",
                     "functools", "operator", "codecs", "io", "webbrowser", "pdb", "timeit",
                     "numpy.testing", "numpy.f2py", "numpy.distutils", "numpy.lib.npyio")


class PtUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        hit = TORCH_ALLOW.get((module, name))
        if hit is not None:
            return hit
        if module == "torch" and name in DTYPES:
            return DType(name)
        if module == "torch" and name in STORAGE_NAMES:
            return _storage_type(name)
        top = module.split(".", 1)[0]
        if module in DANGEROUS_MODULES or top in DANGEROUS_MODULES:
            raise RefusedGlobal(module, name)
        if module.startswith(DATA_MODULE_PREFIXES) or module == "__main__":
            if name.startswith("_") and not name[1:2].isupper():
                raise RefusedGlobal(module, name)  # private functions, not data classes
            return bag_class(f"{module}.{name}")
        raise RefusedGlobal(module, name)

    def persistent_load(self, pid):
        # ('storage', storage_type, key, location, numel)
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
            st = pid[1]
            return StorageStub(str(st) if isinstance(st, str) else None, str(pid[2]),
                               pid[4] if isinstance(pid[4], int) else None)
        raise pickle.UnpicklingError(f"unexpected persistent id {pid!r:.60}")


def loads(data: bytes) -> Any:
    with memory_budget(pickle_budget(len(data))):
        return PtUnpickler(io.BytesIO(data)).load()


def read_pt(fh) -> Any:
    """Load the object inside a torch.save zip as stubs.  Raises PtError or RefusedGlobal."""
    head = fh.read(4)
    fh.seek(0)
    if head[:2] == b"\x80\x02":
        raise PtError("legacy (pre-1.6) torch.save format: re-save with torch >= 1.6")
    if head != b"PK\x03\x04":
        raise PtError("not a torch.save archive (no zip header)")
    try:
        with zipfile.ZipFile(fh) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_MEMBERS:
                raise PtError(f"zip has {len(infos)} members (limit {MAX_MEMBERS})")
            from ..layouts.ptzip import pickle_name
            want = pickle_name([i.filename for i in infos])
            if want is None:
                raise PtError("zip has no data.pkl beside its first member: not a torch.save archive")
            info = next(i for i in infos if i.filename == want)
            if info.file_size > MAX_PICKLE_BYTES:
                raise PtError(f"data.pkl is {info.file_size} bytes (limit {MAX_PICKLE_BYTES})")
            # a deflated pickle that claims (or turns out) to inflate far beyond its stored size is a
            # bomb: torch.save stores data.pkl uncompressed, so any ratio past 100x is refused unread
            cap = min(MAX_PICKLE_BYTES, max(MAX_INFLATE_RATIO * info.compress_size, 1 << 20))
            if info.file_size > cap:
                raise PtError(f"data.pkl inflates to {info.file_size} bytes from {info.compress_size} "
                              f"(more than {MAX_INFLATE_RATIO}x): refused")
            with zf.open(info) as m:
                data = m.read(cap + 1)
            if len(data) > cap:
                raise PtError(f"data.pkl inflates past {cap} bytes from {info.compress_size}: refused")
    except zipfile.BadZipFile as exc:
        raise PtError(f"not a readable zip ({exc})") from None
    except (OSError, EOFError, NotImplementedError, ValueError, OverflowError, struct.error,
            zlib.error, RuntimeError) as exc:  # zipfile trusts the central directory's numbers
        raise PtError(f"unreadable zip ({type(exc).__name__}: {str(exc)[:80]})") from None
    try:
        return loads(data)
    except RefusedGlobal:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            KeyError, OverflowError, MemoryError, RecursionError, UnicodeDecodeError) as exc:
        raise PtError(f"data.pkl is not a readable pickle ({type(exc).__name__}: {str(exc)[:80]})") from None


def plain(obj: Any, depth: int = 0) -> Any:
    """Stubs and bags as JSON-friendly values (for --show-state and path lookups)."""
    if depth > 50:
        return "…"
    if isinstance(obj, Bag):
        return {k: plain(v, depth + 1) for k, v in obj.__dict__.items() if k != "_args"} | (
            {"_args": plain(obj.__dict__["_args"], depth + 1)} if obj.__dict__.get("_args") else {})
    if isinstance(obj, TensorStub):
        return {"tensor": list(obj.shape), "dtype": obj.dtype}
    if isinstance(obj, dict):
        return {str(k): plain(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [plain(v, depth + 1) for v in obj]
    if isinstance(obj, (bytes, bytearray)):
        return f"<{len(obj)} bytes>"
    return obj


@value(frozen=True)
class StorageInfo:
    """One storage of a torch.save archive: its element type and where the first tensor that
    uses it sits in the saved object (e.g. "state.0.exp_avg")."""
    dtype: str | None
    path: str | None


class _DtypeScan(PtUnpickler):
    """Reads a data.pkl only to learn each storage's element type and place (for `verify --deep`):
    classes the training code pickled (optimizers' and frameworks' own) become inert bags instead
    of refusals, since nothing here keeps or calls them; the modules pickles run code through stay
    refused."""

    def __init__(self, fh):
        super().__init__(fh)
        self.dtypes: dict[str, str] = {}
        self.stubs: dict[int, tuple[str, TensorStub]] = {}

    def find_class(self, module, name):
        if (module, name) in (("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor")):
            return self._rebuild
        if (module, name) == ("torch._utils", "_rebuild_tensor_v3"):
            return self._rebuild_v3
        try:
            return super().find_class(module, name)
        except RefusedGlobal:
            top = module.split(".", 1)[0]
            if module in DANGEROUS_MODULES or top in DANGEROUS_MODULES or name.startswith("__"):
                raise
            return bag_class(f"{module}.{name}")

    def _stub(self, storage, dtype, offset, size, stride):
        stub = _rebuild_tensor(storage, offset, size, stride)
        if isinstance(storage, StorageStub):
            if dtype:
                self.dtypes.setdefault(storage.key, str(dtype))
            self.stubs[id(stub)] = (storage.key, stub)  # keeps the stub alive: ids stay unique
        return stub

    def _rebuild(self, storage, offset=0, size=(), stride=None, *rest):
        return self._stub(storage, getattr(storage, "dtype", None), offset, size, stride)

    def _rebuild_v3(self, storage, offset=0, size=(), stride=None, grad=False, hooks=None, dtype=None, *rest):
        return self._stub(storage, dtype if isinstance(dtype, DType) else None, offset, size, stride)


def storages(data: bytes, max_nodes: int = 1_000_000) -> dict[str, StorageInfo]:
    """`storage key -> StorageInfo` for a torch.save data.pkl, without running it.  Raises
    RefusedGlobal or pickle errors like `loads`."""
    with memory_budget(pickle_budget(len(data))):
        u = _DtypeScan(io.BytesIO(data))
        obj = u.load()
    paths: dict[str, str] = {}
    stack: list[tuple[Any, str]] = [(obj, "")]
    seen = 0
    while stack and seen < max_nodes and len(paths) < len(u.stubs):  # bounded walk, no recursion
        o, p = stack.pop()
        seen += 1
        if isinstance(o, TensorStub):
            hit = u.stubs.get(id(o))
            if hit:
                paths.setdefault(hit[0], p or "<root>")
            continue
        if isinstance(o, Bag):
            o = {k: v for k, v in o.__dict__.items() if k != "_args"}
        if isinstance(o, dict):
            stack += [(v, f"{p}.{k}" if p else str(k)) for k, v in reversed(list(o.items()))]
        elif isinstance(o, (list, tuple)):
            stack += [(v, f"{p}.{i}" if p else str(i)) for i, v in reversed(list(enumerate(o)))]
    keys = set(u.dtypes) | {k for k, _ in u.stubs.values()}
    return {k: StorageInfo(u.dtypes.get(k), paths.get(k)) for k in keys}
