"""Torch-free reader for PyTorch DCP `.metadata` (a pickle), via the restricted unpickler.

Produces compact plain-Python records; nothing here imports torch or runs pickle code.
"""
from __future__ import annotations

import operator
import pickle
import re
from dataclasses import dataclass, field

from ..io.unpickle import Bag, MetadataIndex, RefusedGlobal, TensorProperties, loads_dcp

SHARD_RE = re.compile(r"^__(?P<rank>\d+)_(?P<n>\d+)\.distcp$")
RANK_METADATA_RE = re.compile(r"^__(?P<rank>\d+)\.metadata$")


class MetadataError(ValueError):
    """`.metadata` is not a DCP metadata pickle (truncated, corrupt, wrong shape)."""


@dataclass(slots=True)
class TensorInfo:
    fqn: str
    size: tuple[int, ...]
    dtype: str | None
    chunks: list[tuple[tuple[int, ...], tuple[int, ...]]]


@dataclass(slots=True)
class StorageEntry:
    fqn: str
    offset: tuple[int, ...] | None
    relative_path: str
    file_offset: int
    length: int


@dataclass
class DcpMetadata:
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    byte_keys: set[str] = field(default_factory=set)
    storage: list[StorageEntry] = field(default_factory=list)
    version: str | None = None


def _ints(v, what: str) -> tuple[int, ...]:
    try:
        t = tuple(map(operator.index, v))  # C-level: rejects floats, strings, None
        if t and min(t) < 0:
            raise ValueError
    except (TypeError, ValueError):
        raise MetadataError(f"{what} is not a tuple of non-negative ints: {v!r:.80}") from None
    return t


def parse(data: bytes, into: DcpMetadata | None = None) -> DcpMetadata:
    """Parse one metadata pickle; merge into `into` (per-rank `__r.metadata` files)."""
    try:
        obj = loads_dcp(data)
    except RefusedGlobal:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            KeyError, OverflowError, MemoryError, RecursionError, UnicodeDecodeError) as exc:
        raise MetadataError(f"not a readable pickle ({type(exc).__name__}: {str(exc)[:80]})") from None
    if not isinstance(obj, Bag) or not obj._cls.endswith(".Metadata"):
        raise MetadataError(f"pickle holds {type(obj).__name__}, not DCP Metadata")
    md = into or DcpMetadata()
    od = obj.__dict__
    md.version = od.get("version") or md.version
    sdm = od.get("state_dict_metadata")
    sd = od.get("storage_data")
    if not isinstance(sdm, dict) or not isinstance(sd, dict):
        raise MetadataError("Metadata lacks state_dict_metadata or storage_data")
    for fqn, meta in sdm.items():
        if not isinstance(fqn, str) or not isinstance(meta, Bag):
            raise MetadataError(f"bad state_dict_metadata entry {fqn!r:.60}")
        if meta._cls.endswith("BytesStorageMetadata"):
            md.byte_keys.add(fqn)
            continue
        chunks = []
        md_ = meta.__dict__
        for ch in md_.get("chunks") or []:
            if not isinstance(ch, Bag):
                raise MetadataError(f"{fqn}: bad chunk record")
            cd = ch.__dict__
            chunks.append((_ints(cd.get("offsets"), f"{fqn} chunk offsets"),
                           _ints(cd.get("sizes"), f"{fqn} chunk sizes")))
        props = md_.get("properties")
        dtype = props.dtype() if isinstance(props, TensorProperties) else None
        size = _ints(md_.get("size"), f"{fqn} size")
        if fqn in md.tensors:  # per-rank metadata files each describe part of a tensor;
            have = set(md.tensors[fqn].chunks)  # an identical chunk is a replica, not an overlap
            md.tensors[fqn].chunks.extend(c for c in chunks if c not in have)
        else:
            md.tensors[fqn] = TensorInfo(fqn, size, str(dtype) if dtype else None, chunks)
    for idx, info in sd.items():
        if not isinstance(idx, MetadataIndex) or not isinstance(info, Bag):
            raise MetadataError("bad storage_data entry")
        idd, ind = idx.__dict__, info.__dict__
        rel, off, length = ind.get("relative_path"), ind.get("offset"), ind.get("length")
        if not isinstance(rel, str) or not isinstance(off, int) or not isinstance(length, int) \
                or off < 0 or length < 0 or "/" in rel or rel in ("", ".", ".."):
            raise MetadataError(f"bad storage record for {idx.get('fqn')!r:.60}: {rel!r:.40} @{off!r}+{length!r}")
        fqn = idd.get("fqn")
        ioff = idd.get("offset")
        if not isinstance(fqn, str):
            raise MetadataError("storage record without an fqn")
        md.storage.append(StorageEntry(fqn, tuple(ioff) if ioff is not None else None, rel, off, length))
    return md
