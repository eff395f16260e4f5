#!/usr/bin/env python3
"""The population's mutation score estimated from uniform samples (MUTATION.md, session 32).

    python scripts/mutation_estimate.py benchmarks/mutation/session32.jsonl

Each line of the input is one judged mutant: its `group`, the group's `population` (how many
mutants cosmic-ray makes there) and `as_the_suite_stood`: killed, survived, equivalent (listed in
MUTATION.md) or annotation.  Within a group the judged mutants are a uniform sample, so the
population's share of non-equivalent mutants killed is a ratio of population-weighted group
counts (a stratified ratio estimate); its interval is a seeded bootstrap, resampling within groups.
"""
from __future__ import annotations

import argparse
import json
import random
import sys

KINDS = ("killed", "survived", "equivalent", "annotation")


def load(paths: list[str]) -> tuple[dict[str, list[str]], dict[str, int]]:
    by_group: dict[str, list[str]] = {}
    population: dict[str, int] = {}
    for path in paths:
        with open(path) as fh:
            for line in fh:
                if line.strip():
                    r = json.loads(line)
                    if r["as_the_suite_stood"] not in KINDS:
                        raise SystemExit(f"{path}: unknown verdict {r['as_the_suite_stood']!r}")
                    by_group.setdefault(r["group"], []).append(r["as_the_suite_stood"])
                    population[r["group"]] = int(r["population"])
    return by_group, population


def estimate(by_group: dict[str, list[str]], population: dict[str, int]) -> float | None:
    """Killed / non-equivalent over the whole population, each group weighted by its size."""
    killed = sum(population[g] * v.count("killed") / len(v) for g, v in by_group.items() if v)
    judged = sum(population[g] * (v.count("killed") + v.count("survived")) / len(v) for g, v in by_group.items() if v)
    return killed / judged if judged else None


def interval(by_group, population, *, rounds: int = 4000, seed: int = 32) -> tuple[float, float]:
    rng = random.Random(seed)
    got = sorted(e for e in (estimate({g: rng.choices(v, k=len(v)) for g, v in by_group.items()}, population)
                             for _ in range(rounds)) if e is not None)
    return got[int(0.025 * len(got))], got[int(0.975 * len(got)) - 1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("records", nargs="+", help="JSON lines of judged mutants")
    a = ap.parse_args()
    by_group, population = load(a.records)
    print(f"{'group':<12}{'population':>11}{'judged':>8}" + "".join(f"{k:>12}" for k in KINDS) + "   score")
    for g in sorted(by_group):
        v = by_group[g]
        ne = v.count("killed") + v.count("survived")
        print(f"{g:<12}{population[g]:>11}{len(v):>8}" + "".join(f"{v.count(k):>12}" for k in KINDS)
              + (f"   {v.count('killed') / ne:.1%}" if ne else "   -"))
    point = estimate(by_group, population)
    if point is None:
        print("no non-equivalent mutant judged: nothing to estimate")
        return 1
    lo, hi = interval(by_group, population)
    print(f"killed of non-equivalent, weighted by group population: {point:.1%} (95 % bootstrap {lo:.1%}-{hi:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
