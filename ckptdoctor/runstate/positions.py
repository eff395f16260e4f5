"""The three positions reconcile compares, computed once from a RunState (notes §5.3 notation).

N prompts per step, L lookahead, T trainer version, C sampler cursor, A batches admitted by the
dataloader (batches_total - diverted), cnt(t) groups stamped t (ready + persisted in-flight).
Unknown stays None; rules decide what an unknown means.
"""
from __future__ import annotations

from collections import Counter
from ..values import value, field

from .schema import RunState
from .simulate import Restored, SimInput, SimResult, restored_with_ids, simulate


@value
class Positions:
    rs: RunState
    n: int | None
    lookahead: int | None
    t: int | None
    c: int | None
    a: int | None
    cnt: Counter = field(default_factory=Counter)

    @classmethod
    def of(cls, rs: RunState) -> "Positions":
        groups = [g for g in rs.groups if g.get("target_step") is not None]
        groups += [g for g in rs.inflight_groups if g.get("target_step") is not None]
        cnt = Counter(g["target_step"] for g in groups)
        bt = rs.get("dataloader.batches_total")
        diverted = rs.get("dataloader.diverted_batches")
        if diverted is None and rs.get("config.on_dropped_prompt", "shrink") != "replace":
            diverted = 0  # only replace mode diverts batches to the reserve
        a = bt - diverted if bt is not None and diverted is not None else None
        return cls(rs, rs.get("config.num_prompts_per_step"), rs.get("config.max_lookahead_versions"),
                   rs.get("trainer.version"), rs.get("sampler.cursor"), a, cnt)

    @property
    def max_target(self) -> int | None:
        ts = [t for t, c in self.cnt.items() if c > 0]
        return max(ts) if ts else None

    def sim_input(self, cursor: int | None = None, steps: int = 4) -> SimInput | None:
        """None when a position the model needs is unknown."""
        c = self.c if cursor is None else cursor
        if None in (self.n, self.lookahead, self.t, c, self.a):   # n > 0: the schema refuses other counts
            return None
        pairs = [(g["target_step"], g.get("prompt_id")) for g in self.rs.groups
                 if g.get("target_step") is not None]
        restored = restored_with_ids(pairs, self.n, self.rs.get("dataloader.diverted_batches") or 0)
        pend = [Restored(g["target_step"], g.get("prompt_id") if g.get("prompt_id") is not None
                         else f"inflight-{i}", ready=False)
                for i, g in enumerate(self.rs.inflight_groups) if g.get("target_step") is not None]
        return SimInput(self.n, self.lookahead, self.t, c, self.a, restored + pend, steps=steps,
                        diverted=self.rs.get("dataloader.diverted_batches") or 0)

    def simulate(self, cursor: int | None = None, steps: int = 4) -> SimResult | None:
        inp = self.sim_input(cursor, steps)
        return simulate(inp) if inp else None


@value
class RepairPlan:
    new_cursor: int | None
    reason: str
    before: SimResult | None = None
    after: SimResult | None = None

    @property
    def safe(self) -> bool:
        return self.new_cursor is not None


def plan_repair(p: Positions, steps: int = 4) -> RepairPlan:
    """The one repair the notes prove safe: align the cursor to the dataloader (C := A-1) when the
    dataloader is ahead, every step in (C, A-1] is exactly full, A-1 stays in the gate window,
    and the simulator shows the loss gone with no duplicate or stall added."""
    if None in (p.n, p.lookahead, p.t, p.c, p.a):
        return RepairPlan(None, "a position is unknown (N, L, trainer version, cursor or dataloader)")
    if p.a == p.c + 1:
        return RepairPlan(None, "cursor and dataloader agree; raising the cursor would train a batch twice")
    if p.a < p.c + 1:
        return RepairPlan(None, "the dataloader is behind the cursor; that needs a dataloader rewind, "
                                "which is never automated")
    new = p.a - 1
    short = [t for t in range(p.c + 1, new + 1) if p.cnt.get(t, 0) != p.n]
    if short:
        return RepairPlan(None, f"step(s) {', '.join(map(str, short))} in ({p.c}, {new}] do not hold "
                                f"exactly {p.n} groups; raising the cursor would stall the trainer")
    if not p.t - 1 <= new <= p.t + p.lookahead:
        return RepairPlan(None, f"cursor {new} would leave the gate window [{p.t - 1}, {p.t + p.lookahead}]")
    before, after = p.simulate(steps=steps), p.simulate(new, steps)
    if after is None or before is None:
        return RepairPlan(None, "the simulator lacks a position")
    if after.lost_prompts or len(after.duplicate_prompts) > len(before.duplicate_prompts) \
            or (after.stalled_at and not before.stalled_at):
        return RepairPlan(None, "the simulator does not show the repair removing the loss without "
                                "adding duplicates or a stall", before, after)
    return RepairPlan(new, f"align the cursor to the dataloader: {p.c} -> {new}", before, after)
