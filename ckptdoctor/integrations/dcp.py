"""ManifestWriter: a torch DCP storage writer that writes ckptdoctor.manifest.json while it saves.

    import torch.distributed.checkpoint as dcp
    from ckptdoctor.integrations.dcp import ManifestWriter
    dcp.save(state_dict, storage_writer=ManifestWriter("/nvme/run7/iter_0000300"))

Each rank hashes its files' bytes as DCP writes them (the stream DCP writes through is wrapped; no
file is read back), xxh3-128 per 64 MiB range, the manifest's rule.  The digests travel to the
coordinator with the rank's write results; in `finish()` the coordinator writes the manifest --
every rank's files plus the `.metadata` bytes it is about to write -- durably, *before* `.metadata`,
so the commit marker stays last.  `verify --checksums` and `publish` (one node or `--part`) then
check content without a second read pass at save time.

It also records which ranks held each key in their local save plans before deduplication
(`read_plan`, ckptdoctor.read_plan/v1): `preflight` then knows exactly which files each rank of a
same-size allocation reads, instead of telling per-rank keys from replicated ones by evidence.

If anything makes the in-flight digests untrustworthy (a stream that seeks backwards, a rank whose
digests are missing), no manifest is written and `verify --checksums` fails closed ("no manifest").
"""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
import threading
from ..values import value, field

from torch.distributed.checkpoint import FileSystemWriter

from .. import __version__
from ..io.atomic import replace_file
from ..io.hashing import CHUNK_BYTES
from ..layouts import manifest as mf
from ..publishing.copier import ChunkDigests

log = logging.getLogger("ckptdoctor.integrations.dcp")


@value
class RankDigests:
    """One rank's files as written: name -> (size, digests); `broken` names files whose stream
    was not written strictly sequentially (their digests are not trusted)."""
    rank: int | None
    files: dict[str, tuple[int, list[str]]] = field(default_factory=dict)
    broken: list[str] = field(default_factory=list)
    keys: list[str] | None = None   # the keys of this rank's local save plan, before deduplication


class _HashingStream:
    """Pass-through writer that hashes every byte in order."""

    def __init__(self, raw, name: str, sink):
        self._raw, self._name, self._sink = raw, name, sink
        self._cd = ChunkDigests(CHUNK_BYTES)
        self._pos = 0
        self._broken = False

    def write(self, data) -> int:
        mv = memoryview(data).cast("B")
        n = self._raw.write(mv)
        n = len(mv) if n is None else n
        self._cd.feed(mv[:n])
        self._pos += n
        return n

    def tell(self) -> int:
        return self._raw.tell()

    def seek(self, offset, whence=os.SEEK_SET):
        pos = self._raw.seek(offset, whence)
        if pos != self._pos:
            self._broken = True  # bytes overwritten or skipped: the running digest no longer describes the file
        return pos

    def flush(self):
        return self._raw.flush()

    def fileno(self):
        return self._raw.fileno()

    def writable(self) -> bool:
        return True

    def close(self):
        self._raw.close()

    @property
    def closed(self):
        return self._raw.closed

    def finish(self) -> None:
        self._sink(self._name, self._cd.total, self._cd.finish(), self._broken)

    def __getattr__(self, name):
        return getattr(self._raw, name)


class _HashingFS:
    """DCP's FileSystem with `create_stream(path, "wb")` hashing what is written under `root`."""

    def __init__(self, inner, root: str, sink):
        self._inner, self._root, self._sink = inner, os.path.abspath(str(root)), sink

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        p = os.path.abspath(str(path))
        if mode != "wb" or os.path.dirname(p) != self._root or not p.endswith(".distcp"):
            with self._inner.create_stream(path, mode) as s:
                yield s
            return
        with self._inner.create_stream(path, mode) as raw:
            hs = _HashingStream(raw, os.path.basename(p), self._sink)
            yield hs
        hs.finish()

    def __getattr__(self, name):
        return getattr(self._inner, name)


class ManifestWriter(FileSystemWriter):
    """`FileSystemWriter` that also writes ckptdoctor.manifest.json (before `.metadata`)."""

    def __init__(self, path, *args, **kwargs):
        super().__init__(path, *args, **kwargs)
        self._lock = threading.Lock()
        self._mine = RankDigests(None)
        self._keys: list[str] | None = None
        self.fs = _HashingFS(self.fs, self.path, self._record)

    def reset(self, checkpoint_id=None) -> None:
        super().reset(checkpoint_id)
        self._mine = RankDigests(None)
        if isinstance(self.fs, _HashingFS):
            self.fs = _HashingFS(self.fs._inner, self.path, self._record)
        else:
            self.fs = _HashingFS(self.fs, self.path, self._record)

    def _record(self, name: str, size: int, digests: list[str], broken: bool) -> None:
        with self._lock:
            self._mine.files[name] = (size, digests)
            if broken:
                self._mine.broken.append(name)

    def prepare_local_plan(self, plan):
        """The rank's own plan, before the coordinator deduplicates replicated items: the keys this
        rank holds, which are the keys it will ask for on a load at the same world (preflight's
        read plan).  A cached plan (`usable=False`) repeats the previous save's keys."""
        if getattr(plan, "usable", True):
            self._keys = list(dict.fromkeys(item.index.fqn for item in plan.items))
        return super().prepare_local_plan(plan)

    def write_data(self, plan, planner):
        self._mine = RankDigests(getattr(self, "rank", None), keys=self._keys)
        fut = super().write_data(plan, planner)
        results = fut.value()
        from torch.futures import Future
        out: Future = Future()
        out.set_result([*results, self._mine])  # travels to the coordinator with the write results
        return out

    def finish(self, metadata, results) -> None:
        ranks = [r for wr_list in results for r in wr_list if isinstance(r, RankDigests)]
        clean = [[wr for wr in wr_list if not isinstance(wr, RankDigests)] for wr_list in results]
        if getattr(self, "use_collectives", True) is False:
            log.warning("ManifestWriter: use_collectives=False saves have no coordinator; no manifest written")
        else:
            try:
                self._write_manifest(metadata, clean, ranks, len(results))
            except Exception as exc:  # noqa: BLE001 - never fail the user's save over the manifest
                log.warning("ManifestWriter: no manifest written (%s); verify --checksums will say so", exc)
                self._remove_stale_manifest()
        super().finish(metadata, clean)

    def _write_manifest(self, metadata, results, ranks: list[RankDigests], world: int) -> None:
        if len(ranks) != world:
            raise ValueError(f"digests from {len(ranks)} of {world} ranks")
        files: dict[str, int] = {}
        digests: dict[tuple[str, int], str] = {}
        for rd in ranks:
            if rd.broken:
                raise ValueError(f"{rd.broken[0]} was not written sequentially")
            for name, (size, ds) in rd.files.items():
                files[name] = size
                digests.update({(name, i): d for i, d in enumerate(ds)})
        written = {wr.storage_data.relative_path for wr_list in results for wr in wr_list}
        if not written <= set(files):
            raise ValueError(f"no digest for {sorted(written - set(files))[:3]}")
        # The exact bytes FileSystemWriter.finish pickles next: the same fields set the same way
        # (pickle of one object graph is deterministic); tests check the digest against the file.
        import torch.distributed.checkpoint.filesystem as tfs
        metadata.version = tfs.CURRENT_DCP_VERSION
        storage_md = {}
        for wr_list in results:
            storage_md.update({wr.index: wr.storage_data for wr in wr_list})
        metadata.storage_data = storage_md
        metadata.storage_meta = self.storage_meta()
        md = pickle.dumps(metadata)
        cd = ChunkDigests(CHUNK_BYTES)
        cd.feed(md)
        files[".metadata"] = len(md)
        digests.update({(".metadata", i): d for i, d in enumerate(cd.finish())})
        extra = None
        if all(rd.keys is not None for rd in ranks):  # which ranks held each key: preflight's exact read sets
            from ..preflight.readsets import read_plan_record
            extra = {"read_plan": read_plan_record(world, [rd.keys for rd in ranks])}
        doc = mf.build(files, digests, chunk_bytes=CHUNK_BYTES, layout="dcp",
                       tool=f"ckptdoctor {__version__} ManifestWriter", nodes=mf.writer_nodes(), extra=extra)
        replace_file(os.path.join(str(self.path), mf.NAME), doc)  # durable, and before .metadata

    def _remove_stale_manifest(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(str(self.path), mf.NAME))  # a previous save's manifest must not vouch for this one
