"""Do a tensor's chunks tile its global shape exactly?  O(n * 2^d), no tensor data.

The verdict comes from signed corner counts: a box's indicator is the signed sum of the orthant
indicators at its 2^d corners (sign -1 per upper coordinate), and orthant indicators at distinct
points are linearly independent, so the chunks cover every element exactly once if and only if,
at every corner point, the signed counts of the chunks minus those of the whole tensor cancel.
That is one dict update per corner: 8,000 column chunks or 100,000 chunks take well under a
second, where pairwise overlap tests took 24 s and more (DCP's own validator was O(n^2) and took
minutes at FSDP=1024).  Only when the verdict is "not exact" does a bounded sweep look for the
first overlaps and the first hole, to name them.
"""
from __future__ import annotations

import heapq
from itertools import product
from math import prod

Chunk = tuple[tuple[int, ...], tuple[int, ...]]
MAX_GRID_CELLS = 2_000_000
MAX_PAIR_TESTS = 2_000_000   # the diagnosis sweep's budget; the verdict never depends on it
MAX_DIMS = 16                # 2^16 corners per chunk at most


def tiles_exactly(size: tuple[int, ...], chunks: list[Chunk]) -> bool:
    """In-bounds chunks cover `size` exactly once (signed corner counts cancel)."""
    nd = len(size)
    counts: dict[tuple[int, ...], int] = {}
    get = counts.get
    # a box's corners from itertools.product over (low, high) per dimension, in C: the sign of a
    # corner is -1 per high coordinate, in the same order.  A tuple built per corner by a generator
    # took 12 ms for 4,096 two-dimensional chunks, 22 ms for three dimensions; this 5 and 8 ms
    # (the relaunch gate parses and checks every checkpoint of a run root)
    signs = [-1 if sum(c) & 1 else 1 for c in product((0, 1), repeat=nd)]
    for off, sz in chunks:
        for v, sign in zip(product(*[(o, o + s) for o, s in zip(off, sz)]), signs):
            counts[v] = get(v, 0) + sign
    for v, sign in zip(product(*[(0, g) for g in size]), signs):   # minus the tensor itself
        counts[v] = get(v, 0) - sign
    return not any(counts.values())


def _overlap(a: Chunk, b: Chunk) -> bool:
    (ao, asz), (bo, bsz) = a, b
    return all(x < y + ys and y < x + xs for x, xs, y, ys in zip(ao, asz, bo, bsz))


def problems(size: tuple[int, ...], chunks: list[Chunk]) -> list[tuple[str, dict]]:
    """List of (message, details); empty when the chunks cover `size` exactly once."""
    nd = len(size)
    if len(chunks) == 1 and chunks[0][1] == size and not any(chunks[0][0]):
        return []  # the common unsharded case: one chunk that is the whole tensor
    out: list[tuple[str, dict]] = []
    good: list[Chunk] = []
    for off, sz in chunks:
        if len(off) != nd or len(sz) != nd:
            out.append((f"chunk at {list(off)} has rank {len(off)}, tensor has rank {nd}",
                        {"offsets": list(off), "sizes": list(sz), "global_shape": list(size)}))
        elif any(o + s > g for o, s, g in zip(off, sz, size)):
            out.append((f"chunk {list(off)}+{list(sz)} lies outside global shape {list(size)}",
                        {"offsets": list(off), "sizes": list(sz), "global_shape": list(size)}))
        else:
            good.append((off, sz))
    if nd == 0:  # a scalar: one chunk of size ()
        if len(good) != 1:
            out.append((f"scalar tensor has {len(good)} chunks, expected 1", {"chunks": len(good)}))
        return out
    if nd > MAX_DIMS:
        out.append((f"tensor has {nd} dimensions; coverage is checked up to {MAX_DIMS}", {"dims": nd}))
        return out
    if not out and tiles_exactly(size, good):
        return out
    good.sort(key=lambda c: c[0])
    budget = MAX_PAIR_TESTS
    active: list[tuple[int, int, Chunk]] = []  # heap of (end on dim 0, seq, chunk)
    overlaps = 0
    for i, ch in enumerate(good):
        start = ch[0][0]
        while active and active[0][0] <= start:
            heapq.heappop(active)
        budget -= len(active)
        if budget < 0:
            break  # named the first ones already, or the hole search below names the gap
        for _, _, other in active:
            if _overlap(ch, other):
                overlaps += 1
                if overlaps <= 3:
                    out.append((f"chunks {list(other[0])}+{list(other[1])} and {list(ch[0])}+{list(ch[1])} "
                                f"overlap", {"a": [list(other[0]), list(other[1])],
                                             "b": [list(ch[0]), list(ch[1])]}))
        heapq.heappush(active, (start + ch[1][0], i, ch))
    if overlaps:
        return out
    covered = sum(prod(sz) for _, sz in good)
    total = prod(size)
    if covered > total and not out:
        out.append((f"chunks cover {covered} elements of a {total}-element tensor: some overlap",
                    {"covered": covered, "expected": total, "global_shape": list(size)}))
    elif not out:  # fewer elements than the tensor (or equal, with overlaps the sweep did not reach)
        hole = first_hole(size, good)
        msg = f"chunks cover {covered} of {total} elements"
        det = {"covered": covered, "expected": total, "global_shape": list(size)}
        if hole:
            msg += f"; first hole at offsets {hole}"
            det["hole_at"] = hole
        out.append((msg, det))
    return out


def first_hole(size: tuple[int, ...], chunks: list[Chunk]) -> list[int] | None:
    """Coordinate-compress chunk boundaries and find the first uncovered cell."""
    bounds = []
    for d in range(len(size)):
        b = {0, size[d]}
        for off, sz in chunks:
            b.add(off[d])
            b.add(off[d] + sz[d])
        bounds.append(sorted(b))
    cells = prod(len(b) - 1 for b in bounds)
    if cells > MAX_GRID_CELLS:
        return None
    index = [{v: i for i, v in enumerate(b)} for b in bounds]
    covered = set()
    for off, sz in chunks:
        ranges = [range(index[d][off[d]], index[d][off[d] + sz[d]]) for d in range(len(size))]
        stack = [()]
        for r in ranges:
            stack = [p + (i,) for p in stack for i in r]
        covered.update(stack)
    it = [()]
    for b in bounds:
        it = [p + (i,) for p in it for i in range(len(b) - 1)]
        if len(it) > MAX_GRID_CELLS:
            return None
    for cell in it:
        if cell not in covered:
            return [bounds[d][cell[d]] for d in range(len(size))]
    return None
