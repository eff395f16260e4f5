"""Torch-free reader for PyTorch DCP `.metadata` (a pickle), via the restricted unpickler.

Produces compact plain-Python records; nothing here imports torch or runs pickle code.
"""
from __future__ import annotations

import pickle
import re
from dataclasses import dataclass, field

from ..io.unpickle import Bag, MetadataIndex, RefusedGlobal, loads_dcp

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
    if not isinstance(v, (tuple, list)) or not all(isinstance(x, int) and x >= 0 for x in v):
        raise MetadataError(f"{what} is not a tuple of non-negative ints: {v!r:.80}")
    return tuple(v)


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
    md.version = obj.get("version") or md.version
    sdm = obj.get("state_dict_metadata")
    sd = obj.get("storage_data")
    if not isinstance(sdm, dict) or not isinstance(sd, dict):
        raise MetadataError("Metadata lacks state_dict_metadata or storage_data")
    for fqn, meta in sdm.items():
        if not isinstance(fqn, str) or not isinstance(meta, Bag):
            raise MetadataError(f"bad state_dict_metadata entry {fqn!r:.60}")
        if meta._cls.endswith("BytesStorageMetadata"):
            md.byte_keys.add(fqn)
            continue
        chunks = []
        for ch in meta.get("chunks") or []:
            if not isinstance(ch, Bag):
                raise MetadataError(f"{fqn}: bad chunk record")
            chunks.append((_ints(ch.get("offsets"), f"{fqn} chunk offsets"),
                           _ints(ch.get("sizes"), f"{fqn} chunk sizes")))
        props = meta.get("properties")
        dtype = props.get("dtype") if isinstance(props, Bag) else None
        size = _ints(meta.get("size"), f"{fqn} size")
        if fqn in md.tensors:  # per-rank metadata files each describe part of a tensor;
            have = set(md.tensors[fqn].chunks)  # an identical chunk is a replica, not an overlap
            md.tensors[fqn].chunks.extend(c for c in chunks if c not in have)
        else:
            md.tensors[fqn] = TensorInfo(fqn, size, str(dtype) if dtype else None, chunks)
    for idx, info in sd.items():
        if not isinstance(idx, MetadataIndex) or not isinstance(info, Bag):
            raise MetadataError("bad storage_data entry")
        rel, off, length = info.get("relative_path"), info.get("offset"), info.get("length")
        if not isinstance(rel, str) or not isinstance(off, int) or not isinstance(length, int) \
                or off < 0 or length < 0 or "/" in rel or rel in ("", ".", ".."):
            raise MetadataError(f"bad storage record for {idx.fqn!r:.60}: {rel!r:.40} @{off!r}+{length!r}")
        md.storage.append(StorageEntry(idx.fqn, idx.offset, rel, off, length))
    return md
