"""Slurm hostlist expressions, expanded and compressed like `scontrol show hostnames/hostlist`.

    gpu[001-004,010]        -> gpu001 gpu002 gpu003 gpu004 gpu010   (zero padding kept)
    rack[1-2]-gpu[01-02]    -> rack1-gpu01 rack1-gpu02 rack2-gpu01 rack2-gpu02
    a,b[1-2]                -> a b1 b2

Written here (the maintained PyPI library is GPL) and tested against scontrol on a real cluster.
Expansion is capped (MAX_HOSTS) so a hostile expression cannot allocate without bound.
"""
from __future__ import annotations

import re

MAX_HOSTS = 100_000
MAX_TASKS_PER_NODE = 65_536   # ranks on one node; every count is checked before anything is expanded


class HostlistError(ValueError):
    pass


def _split_top(expr: str) -> list[str]:
    """Split on commas outside brackets."""
    out, depth, cur = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' in {expr!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in {expr!r}")
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise HostlistError(f"unbalanced '[' in {expr!r}")
    out.append("".join(cur))
    return out


def _range(body: str, expr: str) -> list[str]:
    vals: list[str] = []
    for part in body.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise HostlistError(f"bad range {part!r} in {expr!r}")
        lo_s, hi_s = m.group(1), m.group(2)
        if hi_s is None:
            vals.append(lo_s)
            continue
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise HostlistError(f"range {part!r} runs backwards in {expr!r}")
        if len(vals) + hi - lo + 1 > MAX_HOSTS:  # counted before expanding: many ranges add up
            raise HostlistError(f"{expr!r} expands to more than {MAX_HOSTS} hosts")
        width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
        vals.extend(str(i).zfill(width) for i in range(lo, hi + 1))
    return vals


def expand(expr: str) -> list[str]:
    expr = (expr or "").strip()
    if not expr:
        raise HostlistError("empty hostlist")
    hosts: list[str] = []
    for item in _split_top(expr):
        item = item.strip()
        if not item:
            raise HostlistError(f"empty host name in {expr!r}")
        pieces = re.split(r"(\[[^\]]*\])", item)
        if len(pieces) > 1 and pieces[-1]:
            raise HostlistError(f"text after the last ']' in {item!r} (Slurm rejects it)")
        combos = [""]
        for p in pieces:
            if p.startswith("["):
                vals = _range(p[1:-1], expr)
                if len(combos) * len(vals) > MAX_HOSTS:
                    raise HostlistError(f"{expr!r} expands to more than {MAX_HOSTS} hosts")
                combos = [c + v for c in combos for v in vals]
            else:
                if re.search(r"[\s\[\]]", p):
                    raise HostlistError(f"bad character in {p!r} of {expr!r}")
                combos = [c + p for c in combos]
        hosts += combos
        if len(hosts) > MAX_HOSTS:
            raise HostlistError(f"{expr!r} expands to more than {MAX_HOSTS} hosts")
    return hosts


_TAIL = re.compile(r"^(.*?)(\d+)$")


def _next(prev: str, n: str) -> bool:
    if int(n) != int(prev) + 1:
        return False
    padded = (len(prev) > 1 and prev.startswith("0")) or (len(n) > 1 and n.startswith("0"))
    return len(n) == len(prev) or not padded


def compress(hosts: list[str]) -> str:
    """Inverse of expand, as `scontrol show hostlist` does it: neighbours sharing the prefix before
    their trailing number fold into one bracket, in the given order (n3,n1,n2 -> n[3,1-2])."""
    out: list[str] = []
    i = 0
    while i < len(hosts):
        m = _TAIL.match(hosts[i])
        if not m:
            out.append(hosts[i])
            i += 1
            continue
        prefix, nums = m.group(1), []
        while i < len(hosts):
            mm = _TAIL.match(hosts[i])
            if not mm or mm.group(1) != prefix:
                break
            nums.append(mm.group(2))
            i += 1
        if len(nums) == 1:
            out.append(prefix + nums[0])
            continue
        runs = [[nums[0], nums[0]]]
        for n in nums[1:]:
            if _next(runs[-1][1], n):
                runs[-1][1] = n
            else:
                runs.append([n, n])
        out.append(prefix + "[" + ",".join(a if a == b else f"{a}-{b}" for a, b in runs) + "]")
    return ",".join(out)


def tasks_per_node(spec: str, nodes: int | None = None) -> list[int]:
    """SLURM_TASKS_PER_NODE ('2(x3),1' -> [2, 2, 2, 1]) or SLURM_NTASKS_PER_NODE ('4')."""
    out: list[int] = []
    for part in (spec or "").split(","):
        m = re.fullmatch(r"\s*([0-9]+)(?:\(x([0-9]+)\))?\s*", part)
        if not m:
            raise HostlistError(f"bad tasks-per-node {spec!r}")
        k, times = int(m.group(1)), int(m.group(2) or 1)
        if not 1 <= k <= MAX_TASKS_PER_NODE:
            raise HostlistError(f"{k} ranks per node in {spec!r}: need 1 to {MAX_TASKS_PER_NODE}")
        if times < 1 or len(out) + times > MAX_HOSTS:  # counted before repeating
            raise HostlistError(f"tasks-per-node {spec!r} names more than {MAX_HOSTS} nodes")
        out += [k] * times
    if nodes is not None and len(out) == 1 and nodes > 1:
        out = out * nodes
    return out
