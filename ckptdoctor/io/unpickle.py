"""Restricted unpicklers: checkpoint pickles are data, never code.

Every global a pickle names goes through `find_class`.  Only names on an allow-list resolve, and
they resolve to inert stand-ins defined here (dataclass-like bags, a tuple for torch.Size, a
DType name for torch dtypes).  Anything else raises RefusedGlobal naming the module and name, so
a hostile `.metadata` or `.pt` becomes a finding instead of running `os.system`.
"""
from __future__ import annotations

import contextlib
import io
import pickle
TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import Any



class RefusedGlobal(pickle.UnpicklingError):
    def __init__(self, module: str, name: str):
        super().__init__(f"refused global {module}.{name}")
        self.module, self.name = module, name

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"


class Bag:
    """Inert attribute bag standing in for a foreign class; records its original name.

    No __setstate__: pickle's BUILD then updates __dict__ in C, which matters at a million
    storage records.  A non-dict state is kept under `_state`.
    """
    _cls = "?"

    def __init__(self, *args, **kwargs):
        self.__dict__["_args"] = args
        self.__dict__.update(kwargs)

    def get(self, key, default=None):
        return self.__dict__.get(key, default)

    def __repr__(self):
        return f"<{self._cls} {sorted(k for k in self.__dict__ if not k.startswith('_'))}>"


_BAGS: dict[str, type] = {}


def bag_class(qualname: str) -> type:
    cls = _BAGS.get(qualname)
    if cls is None:
        cls = type(qualname.rsplit(".", 1)[-1], (Bag,), {"_cls": qualname})
        _BAGS[qualname] = cls
    return cls


class DType(str):
    """torch dtypes pickle as GLOBAL torch.<name>: keep just the name."""


class Record:
    """Stand-in for the DCP dataclasses a `.metadata` holds per tensor and per storage record: one
    slot per field the reader uses, filled by BUILD from the pickle's state dict, which is then
    emptied.  torch's pickle memoizes every state dict, so the unpickler's memo keeps each one alive
    until the load returns, whatever became of it: emptied, a dict is its 64-byte shell instead of
    ~228 bytes of table (the bare load of 200k records of a file torch wrote: 575 -> 449 MiB peak,
    against `list` stand-ins that held the dicts).

    A field the state lacks is None and a record never built has no attributes: the reader turns
    both into MetadataError.  A record BUILT twice keeps only its second state, where torch merges
    the two: either the second holds every field read, and both see the same values, or a field is
    None and the file is refused; never a value torch would not see.  Identity hash and equality:
    MetadataIndex is a dict key, and keys of a pickled dict were unique."""
    __slots__ = ()
    _cls = "?"
    _fields: tuple[str, ...] = ()

    def __init__(self, *args, **kwargs):
        """Only REDUCE calls the class (NEWOBJ, how protocol >= 2 pickles a dataclass, does not;
        protocol 0/1 would go through copyreg, which is refused)."""
        raise pickle.UnpicklingError(f"{self._cls} is called with arguments, not how torch pickles it")

    def __repr__(self):
        return f"<{self._cls} {[f for f in self._fields if hasattr(self, f)]}>"


def _record(name: str, fields: tuple[str, ...]) -> type:
    """A Record class whose BUILD is one generated function: a slot store per field, then the
    state dict emptied (a dict shared with another object would be a pickle torch never writes)."""
    ns: dict = {"__slots__": fields, "_cls": f"{DCP}.{name}", "_fields": fields}
    body = "".join(f"\n        self.{f} = g({f!r})" for f in fields)
    exec(f"def __setstate__(self, st):\n    if type(st) is dict:\n        g = st.get{body}"
         f"\n        st.clear()\n    else:\n        raise _Err(self._cls + ' state is ' + type(st).__name__"
         f" + ', not a dict')", {"_Err": pickle.UnpicklingError}, ns)
    return type(name.rsplit(".", 1)[-1], (Record,), ns)


class TensorProperties(list):
    """torch >= 2.1 pickles a 5-tuple state (dtype, layout, requires_grad, memory_format,
    pin_memory), older torch a __dict__.  Kept raw, appended by a C method (one per tensor record,
    so no Python-level __setstate__); only `dtype` is ever read."""
    __slots__ = ()
    _cls = "torch.distributed.checkpoint.metadata.TensorProperties"
    __setstate__ = list.append

    def dtype(self):
        st = self[-1] if self else None
        if isinstance(st, tuple) and st:
            return st[0]
        return st.get("dtype") if isinstance(st, dict) else None


def _path(*parts):
    return "/".join(str(p) for p in parts)


def _enum_value(*a):
    return a[0] if a else None


DCP = "torch.distributed.checkpoint"
DTYPES = {
    "float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "uint16",
    "uint32", "uint64", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2",
    "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "qint8", "quint8",
    "qint32", "complex32", "half", "float", "double", "long", "int", "short",
}

DCP_ALLOW: dict[tuple[str, str], Any] = {
    (f"{DCP}.metadata", "TensorProperties"): TensorProperties,
    (f"{DCP}.metadata", "_MEM_FORMAT_ENCODING"): int,  # REDUCE enum(0): C-level, once per tensor
    ("torch", "Size"): tuple,  # REDUCE Size((3, 4)) -> (3, 4), in C
    ("torch.serialization", "_get_layout"): str,  # REDUCE _get_layout("torch.strided")
    ("torch", "strided"): "strided",
    ("pathlib", "PosixPath"): _path,
    ("pathlib", "PurePosixPath"): _path,
    ("pathlib", "WindowsPath"): _path,
    ("pathlib", "PureWindowsPath"): _path,
    ("collections", "OrderedDict"): dict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
}
TSM = _record("metadata.TensorStorageMetadata", ("properties", "size", "chunks"))
BSM = _record("metadata.BytesStorageMetadata", ())
CSM = _record("metadata.ChunkStorageMetadata", ("offsets", "sizes"))
MetadataIndex = _record("metadata.MetadataIndex", ("fqn", "offset", "index"))
SI = _record("filesystem._StorageInfo", ("relative_path", "offset", "length", "transform_descriptors"))
METADATA = _record("metadata.Metadata", ("state_dict_metadata", "planner_data", "storage_data", "storage_meta",
                                        "version"))
for _c in (METADATA, TSM, BSM, CSM, MetadataIndex):
    DCP_ALLOW[(f"{DCP}.metadata", _c.__name__)] = _c
DCP_ALLOW[(f"{DCP}.filesystem", "_StorageInfo")] = SI
DCP_ALLOW[(f"{DCP}.metadata", "StorageMeta")] = bag_class(f"{DCP}.metadata.StorageMeta")
for _n in ("SavePlan", "WriteItem", "TensorWriteData", "ReadItem", "LoadPlan"):
    DCP_ALLOW[(f"{DCP}.planner", _n)] = bag_class(f"{DCP}.planner.{_n}")
DCP_ALLOW[(f"{DCP}.planner", "WriteItemType")] = _enum_value
DCP_ALLOW[(f"{DCP}.planner", "LoadItemType")] = _enum_value


def resolve_global(allow: dict, module: str, name: str):
    """What a pickle's global resolves to: its stand-in on the allow-list, a DType for a torch
    dtype, else RefusedGlobal."""
    hit = allow.get((module, name))
    if hit is not None:
        return hit
    if module == "torch" and name in DTYPES:
        return DType(name)
    raise RefusedGlobal(module, name)


class RestrictedUnpickler(pickle.Unpickler):
    allow: dict[tuple[str, str], Any] = DCP_ALLOW
    seen: set | None = None   # when a set: every global the pickle names (which torch can load it)

    def find_class(self, module, name):
        if self.seen is not None:   # once per distinct global: the pickle memoizes what it found
            self.seen.add((module, name))
        return resolve_global(self.allow, module, name)

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("persistent ids are not allowed here")


class PickleTooBig(pickle.UnpicklingError):
    """The pickle asked for far more memory than its size can justify (e.g. a forged memo index)."""


@contextlib.contextmanager
def memory_budget(nbytes: int):
    """Cap the address space this process may add while a pickle loads (RLIMIT_AS, restored after).

    The C unpickler sizes its memo table from indices in the data: one flipped bit in a
    LONG_BINPUT argument asks for gigabytes from a 1 KB file.  Opcodes cannot be screened at C
    speed, so the kernel enforces the bound instead and the allocation fails as MemoryError.
    Single-threaded callers only (the limit is process-wide for its short duration)."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as fh:
            vm = int(fh.read().split()[0]) * resource.getpagesize()
    except (ImportError, OSError, ValueError):
        yield
        return
    cap = vm + nbytes   # (soft <= hard always, so a cap over a finite hard limit is a cap over soft too)
    if soft != resource.RLIM_INFINITY and soft <= cap:
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    except MemoryError:
        raise PickleTooBig(f"needs more than {nbytes >> 20} MiB to unpickle") from None
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def pickle_budget(size: int) -> int:
    """Generous for real DCP metadata (objects take ~8x the pickle), small for a forged one: the
    floor was 256 MiB until the fuzz budget showed a 1.3 KB `.metadata` with one flipped bit
    zeroing a 256 MiB memo table per example; a real small pickle grows the address space by
    well under 1 MiB (the 2-rank fixture's .metadata: measured with the floor at 64 MiB)."""
    return 16 * size + (64 << 20)


def loads_dcp(data: bytes, seen: set | None = None) -> Any:
    with memory_budget(pickle_budget(len(data))):
        u = RestrictedUnpickler(io.BytesIO(data))
        u.seen = seen
        return u.load()


def load_dcp_file(fh, size: int, seen: set | None = None) -> Any:
    """The same from an open file of `size` bytes, read as the unpickler goes: the pickle's bytes
    are never all in memory beside the objects they become (at 1M records, 0.4 GiB less peak)."""
    with memory_budget(pickle_budget(size)):
        u = RestrictedUnpickler(fh)
        u.seen = seen
        return u.load()
