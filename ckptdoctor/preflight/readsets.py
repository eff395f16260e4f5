"""What each rank of a new allocation reads from a DCP checkpoint, from its `.metadata` (the load
plan torch builds from the same records), not from file names alone.

A DCP rank reads exactly the keys of its own load state dict (issue 36, measured with real
multi-rank loads over gloo, torch 2.13/2.14 and Megatron-Core 0.16):
  * a sharded tensor (several chunks) at the world size it was saved with is read chunk by chunk
    by the rank that wrote each chunk (the file's `__R_` rank); at another world size each new rank
    reads the saved chunks its new shard overlaps, under the default FSDP2/DTensor `Shard(0)` even
    split (torch.chunk: ceil(rows / world) rows per rank);
  * a key only one rank held at save time (per-rank RNG, torchtitan's `dataloader.dp_rank_{r}`,
    `model.rank{r}.w`, Megatron's per-rank `rng_state/shard_0.{tp}_1.2` ShardedObjects) is saved in
    that rank's file and read by that rank only; after resharding, by the new rank of the same
    index if it exists and by none otherwise;
  * a replicated item (held by several ranks: a plain tensor, a replicated DTensor, optimizer
    `param_groups`, counters) is saved once -- deduplication puts it in the file of the rank whose
    plan was smallest so far, or rank 0's with `dedup_save_to_lowest_rank` -- and read by every rank;
  * a file no record points at (a 0-byte `__R_0.distcp` of a rank whose items were all
    deduplicated away) is never read.

Which keys a rank held is exact when the save recorded it (`ManifestWriter` writes `read_plan` into
the manifest; `--read-plan FILE` gives the same record).  Without a record it is decided by
evidence: a key whose name carries a rank (`rank{r}`, `rank_{r}`, `dp_rank_{r}`) that is the rank of
the only file holding it, consistently for every instance of the name, is per-rank; a Megatron
ShardedObject whose shards number the saved world, one per file, is per-rank; anything else is
replicated.  Evidence that points both ways (a rank in the name that is not its file's, shards
fewer than ranks) is *undecided*: the ranks that might read the file are listed, and a node lacking
it is a warning naming the key (CKD411), never a silent pass or an error on a guess.
Other layouts (HSDP's replicated shards, 2-D meshes, Shard(1) splits at a changed world) are not
modelled: the facts say which model was used, and a rank map (`--rank-map`) places ranks on nodes.
"""
from __future__ import annotations

import json
import re
from ..values import value, field

from ..layouts.dcp import DcpMetadata

SHARD_RANK = re.compile(r"^__(\d+)_\d+\.distcp$")
# a global rank in a key's name: model.rank1.w, rng.rank_3, dataloader.dp_rank_2 (not `ranks`, `frank1`)
RANK_IN_NAME = re.compile(r"(?<![A-Za-z])rank_?(\d+)(?!\d)", re.IGNORECASE)
# Megatron-Core ShardedObject: `<key>/shard_<offset dims>_<global shape dims>`
SHARDED_OBJECT = re.compile(r"^(?P<key>.+)/shard_(?P<off>\d+(?:\.\d+)*)_(?P<shape>\d+(?:\.\d+)*)$")

READ_PLAN_SCHEMA = "ckptdoctor.read_plan/v1"
MAX_READ_PLAN_BYTES = 256 << 20


class ReadPlanError(ValueError):
    pass


@value
class ReadPlan:
    """Which ranks held each key in their local save plans, before deduplication (the save's record)."""
    world: int
    holders: dict[str, frozenset[int]]   # fqn -> ranks; every rank of `world` for "all"
    source: str = ""


def parse_read_plan(doc, source: str) -> ReadPlan:
    """`{"schema": "ckptdoctor.read_plan/v1", "world": W, "keys": {fqn: "all" | [ranks]}}`, bare or
    as the `read_plan` field of a ckptdoctor manifest.  Raises ReadPlanError naming what is wrong."""
    if isinstance(doc, dict) and isinstance(doc.get("read_plan"), dict):
        doc = doc["read_plan"]
    if not isinstance(doc, dict) or doc.get("schema") != READ_PLAN_SCHEMA:
        raise ReadPlanError(f"not a {READ_PLAN_SCHEMA} record (nor a manifest holding one)")
    world, keys = doc.get("world"), doc.get("keys")
    if type(world) is not int or not 0 < world <= 10_000_000:
        raise ReadPlanError("'world' must be a positive integer")
    if not isinstance(keys, dict):
        raise ReadPlanError("'keys' must be an object {fqn: \"all\" | [ranks]}")
    every = frozenset(range(world))
    holders: dict[str, frozenset[int]] = {}
    for fqn, ranks in keys.items():
        if ranks == "all":
            holders[fqn] = every
        elif isinstance(ranks, list) and ranks and all(type(r) is int and 0 <= r < world for r in ranks):
            holders[fqn] = frozenset(ranks)
        else:
            raise ReadPlanError(f"key {fqn!r:.80}: ranks must be \"all\" or a non-empty list of ranks < {world}")
    return ReadPlan(world, holders, source)


def read_plan_record(world: int, keys_by_rank: list[list[str]]) -> dict:
    """The record a save writes: each rank's keys (its local plan before deduplication) -> holders."""
    held: dict[str, list[int]] = {}
    for r, keys in enumerate(keys_by_rank):
        for k in dict.fromkeys(keys):
            held.setdefault(k, []).append(r)
    return {"schema": READ_PLAN_SCHEMA, "world": world,
            "keys": {k: "all" if len(rs) == world else rs for k, rs in sorted(held.items())}}


def load_read_plan(data: bytes, source: str) -> ReadPlan:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReadPlanError(f"not valid JSON ({str(exc)[:80]})") from None
    return parse_read_plan(doc, source)


@value
class Undecided:
    """A file some ranks may read: the evidence did not decide whether they do."""
    ranks: set[int]
    keys: list[str]
    why: str


@value
class ReadSets:
    """rank -> files it reads; file -> bytes it must hold (max offset+length of its records)."""
    every_rank: set[str] = field(default_factory=set)
    by_rank: dict[int, set[str]] = field(default_factory=dict)
    need: dict[str, int] = field(default_factory=dict)
    resharded: bool = False
    saved_world: int | None = None
    model: str = "evidence"          # recorded | evidence: how per-rank keys were told from replicated
    undecided: dict[str, Undecided] = field(default_factory=dict)   # file -> who may read it, and why
    # bytes each rank loads (records it reads, a resharded chunk by the fraction its rows overlap)
    # and the same rounded up per record to a power of two (the pinned host buffers' allocator)
    every_rank_bytes: int = 0
    every_rank_pinned: int = 0
    bytes_by_rank: dict[int, int] = field(default_factory=dict)
    pinned_by_rank: dict[int, int] = field(default_factory=dict)

    def files(self, rank: int) -> set[str]:
        return self.every_rank | self.by_rank.get(rank, set())

    def maybe(self, rank: int) -> dict[str, Undecided]:
        """Files rank `rank` may read (and does not certainly read)."""
        mine = self.files(rank)
        return {f: u for f, u in self.undecided.items() if rank in u.ranks and f not in mine}

    def load_bytes(self, rank: int) -> tuple[int, int]:
        """(bytes, pinned bytes) rank `rank` loads."""
        return (self.every_rank_bytes + self.bytes_by_rank.get(rank, 0),
                self.every_rank_pinned + self.pinned_by_rank.get(rank, 0))

    def _add(self, rank: int, nbytes: int) -> None:
        self.bytes_by_rank[rank] = self.bytes_by_rank.get(rank, 0) + nbytes
        self.pinned_by_rank[rank] = self.pinned_by_rank.get(rank, 0) + pow2(nbytes)

    def _every(self, s) -> None:
        self.every_rank.add(s.relative_path)
        self.every_rank_bytes += s.length
        self.every_rank_pinned += pow2(s.length)

    def _one(self, rank: int, s, nbytes: int | None = None) -> None:
        self.by_rank.setdefault(rank, set()).add(s.relative_path)
        self._add(rank, s.length if nbytes is None else nbytes)

    def _undecided(self, s, ranks: set[int], why: str) -> None:
        u = self.undecided.setdefault(s.relative_path, Undecided(set(), [], why))
        u.ranks |= ranks
        if len(u.keys) < 20:
            u.keys.append(s.fqn)


def pow2(n: int) -> int:
    """The power of two at or above n (the CUDA caching host allocator's block size)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def saved_world(md: DcpMetadata, listed: set[str]) -> int | None:
    """Ranks of the save: the highest `__R_` in the records or the listing (0-byte files count)."""
    ranks = [int(m.group(1)) for f in {s.relative_path for s in md.storage} | listed
             if (m := SHARD_RANK.match(f))]
    return max(ranks) + 1 if ranks else None


def _file_rank(rel: str) -> int | None:
    m = SHARD_RANK.match(rel)
    return int(m.group(1)) if m else None


def _owners_by_evidence(whole: list, world: int | None, resharded: bool) -> dict[str, tuple]:
    """fqn -> ("rank", r) | ("every",) | ("undecided", why) for items saved whole, from their names
    and the file that holds them.  A name pattern (the key with its rank number taken out) is
    per-rank only when every instance sits in the file of the rank it names and the instances
    number the saved world; a pattern that breaks this anywhere is undecided for all its keys."""
    out: dict[str, tuple] = {}
    patterns: dict[str, list] = {}
    objects: dict[str, list] = {}
    for s in whole:
        if s.fqn in out:
            continue
        out[s.fqn] = ("every",)
        nums = {m.group(1) for m in RANK_IN_NAME.finditer(s.fqn)}
        if len(nums) == 1:
            (n,) = nums
            pat = RANK_IN_NAME.sub(lambda m: m.group(0)[:-len(m.group(1))] + "{r}", s.fqn)
            patterns.setdefault(pat, []).append((int(n), s))
            continue
        m = SHARDED_OBJECT.match(s.fqn)
        if m:
            objects.setdefault(m.group("key"), []).append((m, s))
    for pat, inst in patterns.items():
        if world is None or any(n >= world for n, _ in inst):
            continue  # not a rank of this save (`lora_rank_16` in a 2-rank save): a replicated item
        ok = world is not None and all(_file_rank(s.relative_path) == n for n, s in inst) \
            and sorted(n for n, _ in inst) == list(range(world))
        for n, s in inst:
            out[s.fqn] = ("rank", n) if ok else \
                ("undecided", f"its name carries rank {n} but the pattern {pat!r:.60} is not one key per saved "
                              f"rank, each in that rank's file (a data-parallel rank, or a rank of another "
                              f"numbering)")
    for key, inst in objects.items():
        shape = [int(x) for x in inst[0][0].group("shape").split(".")]
        count = 1
        for x in shape:
            count *= x
        files = {_file_rank(s.relative_path) for _, s in inst}
        if count == 1:
            continue  # one shard: every rank reads it
        ok = world is not None and count == world == len(inst) == len(files) and None not in files
        for m, s in inst:
            out[s.fqn] = ("rank", _file_rank(s.relative_path)) if ok and not resharded else \
                ("undecided", f"a ShardedObject of {count} shard(s) saved by {world} rank(s)"
                              f"{', loaded at another world size' if resharded else ''}: which ranks read "
                              f"shard {m.group('off')} depends on the parallel layout, which the save did not record")
    return out


def plan(md: DcpMetadata, world: int, listed: set[str], ranks: list[int] | None = None,
         recorded: ReadPlan | None = None) -> ReadSets:
    """Read sets of `ranks` (default: every rank) of a `world`-rank job loading `md`."""
    out = ReadSets(saved_world=saved_world(md, listed))
    out.resharded = out.saved_world is not None and out.saved_world != world
    if recorded is not None and out.saved_world is not None and recorded.world != out.saved_world:
        recorded = None  # a record of another save (its world differs from the files'): not evidence
    out.model = "recorded" if recorded is not None else "evidence"
    want = set(range(world)) if ranks is None else set(ranks)
    every = set(range(world)) & want
    for s in md.storage:
        end = s.file_offset + s.length
        if end > out.need.get(s.relative_path, 0):
            out.need[s.relative_path] = end
    chunks_of: dict[str, list] = {}
    whole = []
    for s in md.storage:
        info = md.tensors.get(s.fqn)
        if info is None or _whole(info, s.offset):
            whole.append(s)  # bytes item or an item saved whole
        else:
            chunks_of.setdefault(s.fqn, []).append(s)
    evidence = _owners_by_evidence(whole, out.saved_world, out.resharded) if recorded is None else {}
    for s in whole:
        held = recorded.holders.get(s.fqn) if recorded is not None else None
        if held is not None:
            kind = ("rank", next(iter(held))) if len(held) == 1 else ("every",) if len(held) == recorded.world \
                else ("some", held)
        else:
            kind = evidence.get(s.fqn) or ("every",)
        if kind[0] == "every":
            out._every(s)
        elif kind[0] == "rank":
            if kind[1] < world and kind[1] in want:  # after resharding: the new rank of the same index
                out._one(kind[1], s)
        elif kind[0] == "some":  # held by a subset of the saved ranks
            readers = set(kind[1]) if not out.resharded else set(range(world))
            for r in readers & want:
                out._one(r, s)
        else:
            w = _file_rank(s.relative_path)
            if w is not None and w < world and w in want and not out.resharded:
                out._one(w, s)  # the writer reads its own key either way
            out._undecided(s, every - ({w} if not out.resharded else set()), kind[1])
    for fqn, recs in chunks_of.items():
        info = md.tensors[fqn]
        held = recorded.holders.get(fqn) if recorded is not None else None
        if not out.resharded:
            for s in recs:
                w = _file_rank(s.relative_path)
                if w is None:  # a file not named by rank (another writer): every rank may need it
                    out._every(s)
                elif w in want and (held is None or w in held):
                    out._one(w, s)
            continue
        rows = info.size[0] if info.size else 1
        per = -(-rows // world) or 1
        sizes = {tuple(o): z for o, z in info.chunks}
        for s in recs:
            off = tuple(s.offset or ())
            z = sizes.get(off)
            if not off or z is None or not z:
                out._every(s)
                continue
            lo, hi = off[0], off[0] + z[0]
            if hi <= lo:
                continue
            for r in range(lo // per, min(world, -(-hi // per))):
                if r in want:
                    rows = min(hi, (r + 1) * per) - max(lo, r * per)
                    out._one(r, s, s.length * rows // (hi - lo))
    return out


def _whole(info, offset) -> bool:
    """One chunk at the origin covering the whole tensor: every rank reads it."""
    if len(info.chunks) != 1:
        return False
    off, size = info.chunks[0]
    return all(o == 0 for o in off) and tuple(size) == tuple(info.size)
