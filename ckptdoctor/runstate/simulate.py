"""Deterministic resume simulator: gated in-order sampler, rollout pump, guard and trainer.

Pure Python, discrete ticks (notes reconcile.md section 6).  Dataloader batch k holds prompts
kN .. kN+N-1, so a prompt's identity is its stream position.  Each tick:
  1. pump: while C < T+L pull batch A (A+=1, C+=1), stamp it C, dispatch the first
     max(0, N - slots stamped C) prompts and drop the rest; a dropped prompt is `dedupe` when a
     restored group carries it, else `lost`;
  2. complete: in-flight groups finish after `latency` ticks;
  3. train: evict ready groups stamped below T; consume N ready groups stamped T (FIFO) or idle,
     and after `stall_ticks` idle ticks report a stall.
The answer to "is this resume safe" is: no lost prompts, no prompt trained twice, no stall.
"""
from __future__ import annotations

from ..values import value, field


@value
class Restored:
    target: int
    prompt: int | str
    ready: bool = True


@value
class SimInput:
    n: int                  # prompts per step (one dataloader batch)
    lookahead: int          # gate window L
    trainer: int            # T0
    cursor: int             # C0
    admitted: int           # A0: batches pulled from the dataloader (minus diverted ones)
    restored: list[Restored] = field(default_factory=list)
    steps: int = 4
    latency: int = 1
    stall_ticks: int = 20
    diverted: int = 0       # d0


@value
class StepRow:
    step: int
    batch: int
    dispatched: int
    dropped: int
    dedupe: int
    lost: int

    def to_json(self):
        return self.__dict__.copy()


@value
class SimResult:
    rows: list[StepRow]
    lost_prompts: list
    lost_at_save: list
    duplicate_prompts: list
    stalled_at: dict | None
    evicted_prompts: list
    final: dict
    trained: list = field(default_factory=list)  # per trained step: from restored groups / fresh

    def to_json(self) -> dict:
        return {"steps": [r.to_json() for r in self.rows], "lost_prompts": self.lost_prompts,
                "lost_at_save": self.lost_at_save, "duplicate_prompts": self.duplicate_prompts,
                "evicted_prompts": self.evicted_prompts, "stalled_at": self.stalled_at,
                "trained": self.trained, "final": self.final}


def restored_with_ids(groups: list[tuple[int, object]], n: int, diverted: int = 0) -> list[Restored]:
    """Give id-less restored groups the prompts of batch `target + d0` (in order within a step)."""
    seen: dict[int, int] = {}
    out = []
    for target, pid in sorted(groups, key=lambda g: g[0]):
        i = seen.get(target, 0)
        seen[target] = i + 1
        out.append(Restored(target, pid if pid is not None else (target + diverted) * n + i))
    return out


def simulate(inp: SimInput) -> SimResult:
    n, L = inp.n, inp.lookahead
    T, C, A = inp.trainer, inp.cursor, inp.admitted
    restored_ids = {r.prompt for r in inp.restored}
    # slots: [target, prompt, ready, done_at]
    slots = [[r.target, r.prompt, r.ready, 0 if r.ready else inp.latency] for r in inp.restored]
    trained: dict = {}
    before = range(0, (inp.trainer + inp.diverted) * n)  # prompts of batches < T0 + d0
    for p in before:
        trained[p] = 1
    rows: list[StepRow] = []
    trained_rows: list[dict] = []
    lost: list = []
    evicted: list = []
    stalled = None
    idle, tick = 0, 0
    end = inp.trainer + inp.steps
    while T < end:
        while C < T + L:  # 1. pump
            k = A
            A += 1
            C += 1
            s = C
            c = sum(1 for sl in slots if sl[0] == s)
            prompts = list(range(k * n, k * n + n))
            nd = max(0, n - c)
            dispatched, dropped = prompts[:nd], prompts[nd:]
            for p in dispatched:
                slots.append([s, p, False, tick + inp.latency])
            ded = [p for p in dropped if p in restored_ids]
            los = [p for p in dropped if p not in restored_ids]
            lost += los
            rows.append(StepRow(s, k, len(dispatched), len(dropped), len(ded), len(los)))
        for sl in slots:  # 2. complete
            if not sl[2] and sl[3] <= tick:
                sl[2] = True
        keep = []  # 3. train: evict stale ready groups first
        for sl in slots:
            if sl[2] and sl[0] < T:
                evicted.append(sl[1])
            else:
                keep.append(sl)
        slots = keep
        ready = [sl for sl in slots if sl[2] and sl[0] == T]
        if len(ready) >= n:
            took = ready[:n]
            trained_rows.append({"step": T, "restored": sum(1 for sl in took if sl[1] in restored_ids),
                                 "fresh": sum(1 for sl in took if sl[1] not in restored_ids)})
            for sl in took:
                trained[sl[1]] = trained.get(sl[1], 0) + 1
                slots.remove(sl)
            T += 1
            idle = 0
        else:
            idle += 1
            if idle >= inp.stall_ticks:
                stalled = {"step": T, "have": len([sl for sl in slots if sl[0] == T]), "need": n}
                break
        tick += 1
    trained_before = set(before)
    lost_at_save = [p for p in range(inp.admitted * n) if p not in trained_before and p not in restored_ids]
    dups = sorted(p for p, c in trained.items() if c > 1)
    return SimResult(rows, lost, lost_at_save, dups, stalled, evicted,
                     {"trainer": T, "cursor": C, "admitted": A}, trained_rows)

