"""Save-time guards for training loops (need torch.distributed; imported only by callers).

`check_unique_shards(state_dict)` is the reliable defence against the expert-parallel collision:
DCP dedups write items by (fqn, offset) across ranks without comparing data, so when EP groups
hold *different* experts under the same key and offset, one group's copy silently wins.  Call it
right before `dcp.save`; it all-gathers `(fqn, offset) -> digest` and raises on every rank when
one key carries different data on different ranks.
"""
from __future__ import annotations

from collections import defaultdict


class ShardCollisionError(RuntimeError):
    def __init__(self, collisions: dict):
        self.collisions = collisions
        lines = []
        for (fqn, off), by_digest in sorted(collisions.items())[:10]:
            groups = "; ".join(f"ranks {sorted(r)}" for r in by_digest.values())
            lines.append(f"{fqn} at offset {list(off)}: different data on {groups}")
        more = f" (+{len(collisions) - 10} more)" if len(collisions) > 10 else ""
        super().__init__("DCP would keep one copy of these keys and drop the others: "
                         + " | ".join(lines) + more)


def _flatten(sd, prefix=""):
    for k, v in sd.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _flatten(v, key + ".")
        else:
            yield key, v


def local_table(state_dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(fqn, global offset, xxh3-128 of the local data) for every tensor this rank would write."""
    import torch
    import xxhash
    from torch.distributed.tensor import DTensor
    rows = []
    for fqn, v in _flatten(state_dict):
        if isinstance(v, DTensor):
            local = v.to_local()
            chunks = v.__create_chunk_list__()
            offset = tuple(int(x) for x in chunks[0].offsets) if chunks else (0,) * v.dim()
        elif isinstance(v, torch.Tensor):
            local, offset = v, (0,) * v.dim()
        else:
            continue
        data = local.detach().contiguous().cpu()
        h = xxhash.xxh3_128(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest()
        rows.append((fqn, offset, h))
    return rows


def check_unique_shards(state_dict, group=None) -> None:
    """Raise ShardCollisionError (on every rank) if any (fqn, offset) differs across ranks."""
    import torch.distributed as dist
    rows = local_table(state_dict)
    world = dist.get_world_size(group)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, rows, group=group)
    table: dict = defaultdict(lambda: defaultdict(set))
    for rank, rrows in enumerate(gathered):
        for fqn, off, h in rrows:
            table[(fqn, tuple(off))][h].add(rank)
    collisions = {k: dict(v) for k, v in table.items() if len(v) > 1}
    if collisions:
        raise ShardCollisionError(collisions)
