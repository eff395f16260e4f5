"""Write DCP checkpoints without torch: for `ckptdoctor demo`, benchmarks and hostile fixtures.

The `.metadata` pickle is emitted opcode by opcode with the same globals torch writes (so
torch's own reader loads it), and each record is a torch.save-format zip archive.  Only float32
tensors and small byte items are supported: enough to build realistic layouts at any scale.
"""
from __future__ import annotations

import io
import os
import pickle
import struct
import uuid
import zipfile
from array import array
from ..values import value, field

M = "torch.distributed.checkpoint.metadata"


class _P:
    """Minimal pickle protocol-2 emitter."""

    def __init__(self):
        self.b = io.BytesIO()
        self.b.write(pickle.PROTO + b"\x02")
        self._globals: dict[tuple[str, str], int] = {}
        self._memo = 0

    def op(self, code: bytes):
        self.b.write(code)

    def glob(self, module: str, name: str):
        key = (module, name)
        if key in self._globals:
            self.op(pickle.BINGET + bytes([self._globals[key]]) if self._globals[key] < 256 else
                    pickle.LONG_BINGET + struct.pack("<I", self._globals[key]))
            return
        self.op(pickle.GLOBAL + f"{module}\n{name}\n".encode())
        idx = self._memo
        self._memo += 1
        self._globals[key] = idx
        self.op(pickle.LONG_BINPUT + struct.pack("<I", idx))

    def str(self, s: str):
        e = s.encode()
        self.op(pickle.BINUNICODE + struct.pack("<I", len(e)) + e)

    def int(self, v: int):
        if 0 <= v < 2 ** 31:
            self.op(pickle.BININT + struct.pack("<i", v))
        else:
            enc = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
            self.op(pickle.LONG1 + bytes([len(enc)]) + enc)

    def none(self):
        self.op(pickle.NONE)

    def bool(self, v: bool):
        self.op(pickle.NEWTRUE if v else pickle.NEWFALSE)

    def tuple_of_ints(self, vals):
        self.op(pickle.MARK)
        for v in vals:
            self.int(v)
        self.op(pickle.TUPLE)

    def size(self, vals):  # torch.Size((..)) via REDUCE
        self.glob("torch", "Size")
        self.op(pickle.MARK)
        self.tuple_of_ints(vals)
        self.op(pickle.TUPLE)
        self.op(pickle.REDUCE)

    def newobj(self, module: str, name: str):
        self.glob(module, name)
        self.op(pickle.EMPTY_TUPLE + pickle.NEWOBJ)

    def build_dict(self, items):
        """items: list of (key, emit_fn); emits EMPTY_DICT MARK k v ... SETITEMS BUILD."""
        self.op(pickle.EMPTY_DICT + pickle.MARK)
        for k, fn in items:
            self.str(k)
            fn()
        self.op(pickle.SETITEMS + pickle.BUILD)

    def getvalue(self) -> bytes:
        return self.b.getvalue() + pickle.STOP


@value
class Item:
    """One storage record: a tensor chunk (float32 values) or a bytes item."""
    fqn: str
    global_shape: tuple[int, ...] | None  # None for a bytes item
    offsets: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()
    values: list[float] | None = None
    payload: bytes = b""  # for bytes items: a pickled python object (torch.save of an int etc.)
    rank: int = 0


def _align_extra(offset_of_data: int, align: int = 64) -> bytes:
    pad = (-offset_of_data) % align
    if pad == 0:
        return b""
    if pad < 4:
        pad += align
    return b"FB" + struct.pack("<H", pad - 4) + b"Z" * (pad - 4)


def torch_save_bytes(name: str, data_pkl: bytes, storages: dict[str, bytes]) -> bytes:
    """A torch.save-format zip archive (ZIP_STORED, 64-byte aligned data records)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        members = [(f"{name}/data.pkl", data_pkl), (f"{name}/.format_version", b"1"),
                   (f"{name}/.storage_alignment", b"64"), (f"{name}/byteorder", b"little")]
        members += [(f"{name}/data/{k}", v) for k, v in storages.items()]
        members += [(f"{name}/version", b"3\n"), (f"{name}/.data/serialization_id",
                                                  uuid.uuid4().hex.encode()[:40].ljust(40, b"0"))]
        for mname, data in members:
            info = zipfile.ZipInfo(mname, date_time=(1980, 1, 1, 0, 0, 0))
            header_len = 30 + len(mname.encode())
            info.extra = _align_extra(buf.tell() + header_len)
            zf.writestr(info, data)
    return buf.getvalue()


def tensor_archive(values: list[float], shape: tuple[int, ...]) -> bytes:
    p = _P()
    p.glob("torch._utils", "_rebuild_tensor_v2")
    p.op(pickle.MARK)
    # persistent id ('storage', torch.FloatStorage, '0', 'cpu', numel)
    p.op(pickle.MARK)
    p.str("storage")
    p.glob("torch", "FloatStorage")
    p.str("0")
    p.str("cpu")
    p.int(len(values))
    p.op(pickle.TUPLE + pickle.BINPERSID)
    p.int(0)
    p.tuple_of_ints(shape)
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    p.tuple_of_ints(tuple(reversed(strides)))
    p.bool(False)
    p.glob("collections", "OrderedDict")
    p.op(pickle.EMPTY_TUPLE + pickle.REDUCE)
    p.op(pickle.TUPLE + pickle.REDUCE)
    return torch_save_bytes("archive", p.getvalue(), {"0": array("f", values).tobytes()})


def object_archive(obj_pickle_body: bytes) -> bytes:
    return torch_save_bytes("archive", obj_pickle_body, {})


@value
class Checkpoint:
    items: list[Item] = field(default_factory=list)


def write(directory: str, items: list[Item], *, write_metadata: bool = True) -> dict[str, int]:
    """Write `__{rank}_0.distcp` files and `.metadata`; returns file -> size."""
    os.makedirs(directory, exist_ok=True)
    by_rank: dict[int, list[Item]] = {}
    for it in items:
        by_rank.setdefault(it.rank, []).append(it)
    records = []  # (item, file, offset, length)
    sizes = {}
    for rank, its in sorted(by_rank.items()):
        fname = f"__{rank}_0.distcp"
        with open(os.path.join(directory, fname), "wb") as fh:
            for it in sorted(its, key=lambda i: i.global_shape is not None):  # bytes first, like torch
                blob = object_archive(it.payload) if it.global_shape is None else \
                    tensor_archive(it.values if it.values is not None else [0.0] * _prod(it.sizes), it.sizes)
                off = fh.tell()
                fh.write(blob)
                records.append((it, fname, off, len(blob)))
            sizes[fname] = fh.tell()
    if write_metadata:
        data = metadata_bytes(records, directory)
        with open(os.path.join(directory, ".metadata.tmp"), "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(os.path.join(directory, ".metadata.tmp"), os.path.join(directory, ".metadata"))
        sizes[".metadata"] = len(data)
    return sizes


def _prod(t) -> int:
    n = 1
    for x in t:
        n *= x
    return n


def metadata_bytes(records, checkpoint_id: str = "/ckpt") -> bytes:
    p = _P()
    tensors: dict[str, tuple[tuple[int, ...], list[Item]]] = {}
    byte_keys: list[str] = []
    for it, *_ in records:
        if it.global_shape is None:
            byte_keys.append(it.fqn)
        else:
            tensors.setdefault(it.fqn, (it.global_shape, []))[1].append(it)
    p.newobj(M, "Metadata")

    def sdm():
        p.op(pickle.EMPTY_DICT)
        for fqn, (shape, chunks) in tensors.items():
            p.op(pickle.MARK)
            p.str(fqn)
            p.newobj(M, "TensorStorageMetadata")

            def props():
                p.newobj(M, "TensorProperties")
                p.op(pickle.MARK)
                p.glob("torch", "float32")
                p.glob("torch.serialization", "_get_layout")
                p.str("torch.strided")
                p.op(pickle.TUPLE1 + pickle.REDUCE)
                p.bool(False)
                p.glob(M, "_MEM_FORMAT_ENCODING")
                p.int(0)
                p.op(pickle.TUPLE1 + pickle.REDUCE)
                p.bool(False)
                p.op(pickle.TUPLE + pickle.BUILD)

            def chunk_list():
                p.op(pickle.EMPTY_LIST + pickle.MARK)
                for c in chunks:
                    p.newobj(M, "ChunkStorageMetadata")
                    p.build_dict([("offsets", lambda c=c: p.size(c.offsets)),
                                  ("sizes", lambda c=c: p.size(c.sizes))])
                p.op(pickle.APPENDS)
            p.build_dict([("properties", props), ("size", lambda: p.size(shape)), ("chunks", chunk_list)])
            p.op(pickle.SETITEMS)
        for fqn in byte_keys:
            p.str(fqn)
            p.newobj(M, "BytesStorageMetadata")
            p.op(pickle.SETITEM)

    def planner():
        p.op(pickle.EMPTY_DICT)
        for fqn in list(tensors) + byte_keys:
            p.str(fqn)
            p.op(pickle.MARK)
            for part in fqn.split("."):
                p.str(part)
            p.op(pickle.TUPLE + pickle.SETITEM)

    def storage():
        p.op(pickle.EMPTY_DICT)
        batch = 0
        p.op(pickle.MARK)
        for it, fname, off, length in records:
            p.newobj(M, "MetadataIndex")
            p.build_dict([("fqn", lambda it=it: p.str(it.fqn)),
                          ("offset", (lambda it=it: p.size(it.offsets)) if it.global_shape is not None
                           else p.none),
                          ("index", p.none)])
            p.newobj("torch.distributed.checkpoint.filesystem", "_StorageInfo")
            p.build_dict([("relative_path", lambda f=fname: p.str(f)), ("offset", lambda o=off: p.int(o)),
                          ("length", lambda n=length: p.int(n))])
            batch += 1
            if batch == 1000:
                p.op(pickle.SETITEMS + pickle.MARK)
                batch = 0
        p.op(pickle.SETITEMS)

    def storage_meta():
        p.newobj(M, "StorageMeta")
        p.build_dict([("checkpoint_id", lambda: p.str(checkpoint_id)),
                      ("save_id", lambda: p.str(uuid.uuid4().hex)), ("load_id", p.none),
                      ("modules", lambda: p.op(pickle.EMPTY_LIST))])

    p.build_dict([("state_dict_metadata", sdm), ("planner_data", planner), ("storage_data", storage),
                  ("storage_meta", storage_meta), ("version", lambda: p.str("1.0.0"))])
    return p.getvalue()


def int_payload(v: int) -> bytes:
    """Pickle body of a plain int (what torch.save(7) puts in data.pkl)."""
    return pickle.dumps(v, protocol=2)
