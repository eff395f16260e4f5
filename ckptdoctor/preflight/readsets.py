"""What each rank of a new allocation reads from a DCP checkpoint, from its `.metadata` (the load
plan torch builds from the same records), not from file names.

torch 2.13's default planners, measured (issue 14):
  * an item saved whole — a plain tensor, a replicated DTensor, or any tensor of a 1-rank save: one
    chunk covering the tensor — is read by every rank of the new job, from whichever file holds it.
    Deduplication puts replicated items in the file of the rank whose plan was smallest so far (rank
    1's file in a 2-rank FSDP2 + AdamW save), so rank 0 needs another rank's file;
  * bytes items (optimizer `param_groups`, counters, any non-tensor) are read by every rank;
  * a sharded tensor (several chunks) at the world size it was saved with is read chunk by chunk
    by the rank that wrote each chunk (the file's `__R_` rank); at another world size each new rank
    reads the saved chunks its new shard overlaps, under the default FSDP2/DTensor `Shard(0)` even
    split (torch.chunk: ceil(rows / world) rows per rank);
  * a file no record points at (a 0-byte `__R_0.distcp` of a rank whose items were all
    deduplicated away) is never read.
Other layouts (HSDP's replicated shards, 2-D meshes, Shard(1) splits) are not modelled: the
facts say which model was used, and a rank map (`--rank-map`) places ranks on nodes.
"""
from __future__ import annotations

import re
from ..values import value, field

from ..layouts.dcp import DcpMetadata

SHARD_RANK = re.compile(r"^__(\d+)_\d+\.distcp$")


@value
class ReadSets:
    """rank -> files it reads; file -> bytes it must hold (max offset+length of its records)."""
    every_rank: set[str] = field(default_factory=set)
    by_rank: dict[int, set[str]] = field(default_factory=dict)
    need: dict[str, int] = field(default_factory=dict)
    resharded: bool = False
    saved_world: int | None = None
    # bytes each rank loads (records it reads, a resharded chunk by the fraction its rows overlap)
    # and the same rounded up per record to a power of two (the pinned host buffers' allocator)
    every_rank_bytes: int = 0
    every_rank_pinned: int = 0
    bytes_by_rank: dict[int, int] = field(default_factory=dict)
    pinned_by_rank: dict[int, int] = field(default_factory=dict)

    def files(self, rank: int) -> set[str]:
        return self.every_rank | self.by_rank.get(rank, set())

    def load_bytes(self, rank: int) -> tuple[int, int]:
        """(bytes, pinned bytes) rank `rank` loads."""
        return (self.every_rank_bytes + self.bytes_by_rank.get(rank, 0),
                self.every_rank_pinned + self.pinned_by_rank.get(rank, 0))

    def _add(self, rank: int, nbytes: int) -> None:
        self.bytes_by_rank[rank] = self.bytes_by_rank.get(rank, 0) + nbytes
        self.pinned_by_rank[rank] = self.pinned_by_rank.get(rank, 0) + pow2(nbytes)


def pow2(n: int) -> int:
    """The power of two at or above n (the CUDA caching host allocator's block size)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0

    def ranks_reading(self, world: int) -> dict[int, set[str]]:
        return {r: self.files(r) for r in range(world)}


def saved_world(md: DcpMetadata, listed: set[str]) -> int | None:
    """Ranks of the save: the highest `__R_` in the records or the listing (0-byte files count)."""
    ranks = [int(m.group(1)) for f in {s.relative_path for s in md.storage} | listed
             if (m := SHARD_RANK.match(f))]
    return max(ranks) + 1 if ranks else None


def plan(md: DcpMetadata, world: int, listed: set[str], ranks: list[int] | None = None) -> ReadSets:
    """Read sets of `ranks` (default: every rank) of a `world`-rank job loading `md`."""
    out = ReadSets(saved_world=saved_world(md, listed))
    out.resharded = out.saved_world is not None and out.saved_world != world
    want = set(range(world)) if ranks is None else set(ranks)
    for s in md.storage:
        end = s.file_offset + s.length
        if end > out.need.get(s.relative_path, 0):
            out.need[s.relative_path] = end
    chunks_of: dict[str, list] = {}
    for s in md.storage:
        info = md.tensors.get(s.fqn)
        if info is None or _whole(info, s.offset):
            out.every_rank.add(s.relative_path)  # bytes item or an item saved whole
            out.every_rank_bytes += s.length
            out.every_rank_pinned += pow2(s.length)
            continue
        chunks_of.setdefault(s.fqn, []).append(s)
    for fqn, recs in chunks_of.items():
        info = md.tensors[fqn]
        if not out.resharded:
            for s in recs:
                m = SHARD_RANK.match(s.relative_path)
                if m is None:  # a file not named by rank (another writer): every rank may need it
                    out.every_rank.add(s.relative_path)
                    out.every_rank_bytes += s.length
                    out.every_rank_pinned += pow2(s.length)
                elif int(m.group(1)) in want:
                    out.by_rank.setdefault(int(m.group(1)), set()).add(s.relative_path)
                    out._add(int(m.group(1)), s.length)
            continue
        rows = info.size[0] if info.size else 1
        per = -(-rows // world) or 1
        sizes = {tuple(o): z for o, z in info.chunks}
        for s in recs:
            off = tuple(s.offset or ())
            z = sizes.get(off)
            if not off or z is None or not z:
                out.every_rank.add(s.relative_path)
                out.every_rank_bytes += s.length
                out.every_rank_pinned += pow2(s.length)
                continue
            lo, hi = off[0], off[0] + z[0]
            if hi <= lo:
                continue
            for r in range(lo // per, min(world, -(-hi // per))):
                if r in want:
                    out.by_rank.setdefault(r, set()).add(s.relative_path)
                    rows = min(hi, (r + 1) * per) - max(lo, r * per)
                    out._add(r, s.length * rows // (hi - lo))
    return out


def _whole(info, offset) -> bool:
    """One chunk at the origin covering the whole tensor: every rank reads it."""
    if len(info.chunks) != 1:
        return False
    off, size = info.chunks[0]
    return all(o == 0 for o in off) and tuple(size) == tuple(info.size)
