"""Host-memory budget per node (seed 003, "Memory budget"; "Load: enough capacity does not mean
enough for the transient peak").

The model, documented and configurable ([preflight] memory-copy-factor, memory-pinned):
  peak = copy_factor x bytes the node's ranks load       (the load's copy in anonymous memory)
       + each loaded record rounded up to a power of two  (pinned host buffers: the CUDA caching
                                                           host allocator's blocks; seed 003 measured
                                                           146.9 GiB pinned for 88.2 GiB of state)
The bytes come from the read sets (preflight/readsets.py).  The node's memory comes from
--mem-per-node, $SLURM_MEM_PER_NODE, `scontrol show node` RealMemory, or in --local mode
/proc/meminfo MemTotal and the cgroup's memory.max (the smaller).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from ..values import value

from ..engine.errors import UsageError

UNITS = {"": 1 << 20, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}  # Slurm: bare = MiB


@value(frozen=True)
class Model:
    copy_factor: float = 1.0
    pinned: bool = True

    def peak(self, load: int, pinned: int) -> int:
        return int(load * self.copy_factor) + (pinned if self.pinned else 0)


@value(frozen=True)
class NodeMemory:
    bytes: int
    source: str


def parse_size(text: str, what: str) -> int:
    """512G, 1.5T, 4096K, 1000000B; a bare number is MiB, as Slurm's --mem."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(?:([KMGT])i?B?|(B))?\s*", str(text), re.I)
    if not m:
        raise UsageError(f"{what} {text!r}: expected a size like 512G, 2T or 262144 (MiB, as Slurm)")
    unit = 1 if m.group(3) else UNITS[(m.group(2) or "").upper()]
    return int(float(m.group(1)) * unit)


def _local_memory(proc: str = "/proc", cgroups: str = "/sys/fs/cgroup") -> NodeMemory | None:
    """This node's memory: MemTotal, or the job's cgroup v2 limit where that is smaller (a Slurm job
    confined by cgroups cannot use the rest). The roots are parameters for the tests."""
    total = None
    try:
        with open(os.path.join(proc, "meminfo")) as fh:
            for line in fh.read(65536).splitlines():
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    src = "/proc/meminfo MemTotal"
    try:
        with open(os.path.join(proc, "self", "cgroup")) as fh:
            rel = next((ln.split(":", 2)[2] for ln in fh.read(65536).splitlines() if ln.startswith("0::")), None)
        if rel is not None:
            with open(os.path.join(cgroups, rel.strip().lstrip("/"), "memory.max")) as fh:
                v = fh.read(64).strip()
            if v.isdigit() and (total is None or int(v) < total):
                total, src = int(v), "cgroup memory.max"
    except (OSError, StopIteration, ValueError):
        pass
    return NodeMemory(total, src) if total else None


def _scontrol(nodes: list[str]) -> dict[str, NodeMemory]:
    exe = shutil.which("scontrol")
    if not exe or not os.environ.get("SLURM_JOB_ID"):
        return {}
    try:
        p = subprocess.run([exe, "show", "node", ",".join(nodes), "-o"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for line in p.stdout.splitlines():
        n = re.search(r"NodeName=(\S+)", line)
        m = re.search(r"RealMemory=(\d+)", line)
        if n and m:
            out[n.group(1)] = NodeMemory(int(m.group(1)) << 20, "scontrol RealMemory")
    return out


def node_memory(nodes: list[str], mem_per_node: str | None, local: str | None) -> dict[str, NodeMemory]:
    # a size of 0 is Slurm's `--mem=0`: all of each node's memory, so it is looked up below (it
    # used to count as 0 bytes, which CKD410 reads as "unknown": the budget was silently off)
    if mem_per_node and (size := parse_size(mem_per_node, "--mem-per-node")):
        return {n: NodeMemory(size, "--mem-per-node") for n in nodes}
    env = os.environ.get("SLURM_MEM_PER_NODE")
    if env and (size := parse_size(env, "$SLURM_MEM_PER_NODE")):
        return {n: NodeMemory(size, "$SLURM_MEM_PER_NODE") for n in nodes}
    if local:
        m = _local_memory()
        return {local: m} if m else {}
    return _scontrol(nodes)
