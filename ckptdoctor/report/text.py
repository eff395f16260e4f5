"""Human output: findings grouped by checkpoint, a run-root table, one summary line."""
from __future__ import annotations

import os

from .styled import PlainConsole, RichConsole, Table, Text

STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
COLOR = "auto"   # --color: auto | always | never (set by the CLI)


def console(out, plain: bool | None = None):
    """On a terminal, rich with its own width; anywhere else (Slurm logs, pipes, files) nothing is
    ever wrapped or cut with an ellipsis, and without forced colour that is plain text, written
    without importing rich (see styled.py).  `plain` overrides the choice (tests)."""
    tty = hasattr(out, "isatty") and out.isatty()
    if plain is None:  # rich's own terminal test (rich.console.Console.is_terminal) says "no"
        env = os.environ
        plain = (COLOR != "always" and env.get("TTY_COMPATIBLE", "") != "1"
                 and (env.get("TTY_COMPATIBLE", "") == "0" or not (env.get("FORCE_COLOR") or tty)))
    if plain:
        return PlainConsole(out)
    no_color = COLOR == "never" or (COLOR == "auto" and os.environ.get("NO_COLOR", "") != "")
    return RichConsole(out, width=None if tty else 100_000, no_color=no_color,
                       force_terminal=True if COLOR == "always" else None)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def duration(s) -> str:
    """Seconds as a person says them: '45 s', '12 min 5 s', '10 h 1 min', '3 d 4 h'."""
    if s is None:
        return "?"
    s = int(round(s))
    for big, bs, small, ss in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if s >= bs:
            rest = (s % bs) // ss
            return f"{s // bs} {big}" + (f" {rest} {small}" if rest else "")
    return f"{s} s"


def _size(n) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _age(s) -> str:
    return duration(s)


def render(report, out, plain: bool | None = None) -> None:
    con = console(out, plain)
    facts = report.facts
    rows = facts.get("checkpoints") or []
    groups: dict[str, list] = {}
    names = sorted((r["name"] for r in rows), key=len, reverse=True)
    for f in report.findings:
        key = next((n for n in names if f"/{n}/" in f"{f.path}/"), "")
        groups.setdefault(key, []).append(f)
    for key in sorted(groups, key=lambda k: (k != "", k)):
        con.print(Text(key or report.target, style="bold"))
        for f in groups[key]:
            line = Text("  ")
            line.append(f"{f.severity:<7}", style=STYLE[f.severity])
            line.append(f" {f.rule} {f.name}: ", style="bold")
            line.append(f.message)
            con.print(line)
            con.print(Text(f"           {f.path}", style="dim"))
            ev = f.details.get("evidence") if isinstance(f.details, dict) else None
            if ev:
                con.print(Text("           evidence: " + "; ".join(f"{k} <- {w}" for k, w in ev.items()),
                               style="dim"))
            if f.hint:
                con.print(Text(f"           hint: {f.hint}", style="dim"))
    cmd = report.command
    if cmd == "verify" and facts.get("kind") == "run" and rows:
        t = Table(title=f"{report.target} ({facts.get('layout')})", title_justify="left")
        for col in ("checkpoint", "step", "complete", "size", "age", "findings"):
            t.add_column(col)
        for r in rows:
            ok = "yes" if r["complete"] else "NO: " + ", ".join(r["why"][:2])
            t.add_row(r["name"], "-" if r["step"] is None else str(r["step"]), Text(ok, style="green" if r["complete"] else "red"),
                      _size(r["bytes"]), _age(r["age_seconds"]), str(r["findings"]))
        con.print(t)
    if cmd == "verify" and facts.get("kind") == "run":
        rf, nc = facts.get("resume_from"), facts.get("newest_complete")
        con.print(Text(f"framework will resume from: {rf or 'nothing (starts from step 0)'}", style="bold"))
        con.print(Text(f"newest complete checkpoint: {nc or 'none'}", style="bold"))
        by = {r["name"]: r for r in rows}
        cur, new = by.get(rf), by.get(nc)
        if rf != nc and nc and not (cur and cur["complete"]):
            con.print(Text(f"hint: the framework resumes from {rf or 'nothing'}, not from {nc}, the newest complete "
                           f"checkpoint; `ckptdoctor verify --fix {report.target}` makes it resume from {nc} "
                           f"(--dry-run shows how)", style="yellow"))
        elif rf != nc and nc and cur["step"] is not None and new and new["step"] is not None:
            # a complete older target may be a deliberate rollback: --fix leaves it, --fix-to moves it
            con.print(Text(f"hint: the framework resumes from {rf}, older than {nc}; if that is not a deliberate "
                           f"rollback, `ckptdoctor verify --fix {report.target} --fix-to {new['step']}` moves it "
                           f"(--dry-run shows how)", style="yellow"))
    gate = facts.get("gate") if cmd == "verify" else None
    unread = [r["name"] for r in rows if r.get("data_read") is False] if cmd == "verify" else []
    if unread:
        con.print(Text(f"not read by the gate: the shard contents of {', '.join(unread[:4])}"
                       f"{f' and {len(unread) - 4} more' if len(unread) > 4 else ''} (listed and sized only; "
                       f"--target all reads them)", style="dim"))
    skipped = facts.get("not_judged") if cmd == "verify" else None
    if skipped:
        con.print(Text(f"not judged by the gate: {', '.join(skipped[:4])}"
                       f"{f' and {len(skipped) - 4} more' if len(skipped) > 4 else ''} (older than the "
                       f"resume target; --target all judges them)", style="dim"))
    if gate:
        con.print(Text(f"relaunch gate: {'pass' if gate['passed'] else 'FAIL'} - {gate['why']}",
                       style="bold green" if gate["passed"] else "bold red"))
    hidden = facts.get("hidden") if cmd in ("verify", "prune") else None
    if hidden:
        con.print(Text(f"{sum(hidden.values())} finding(s) hidden by --select/--ignore/config ("
                       + ", ".join(f"{r} x{n}" for r, n in hidden.items()) + "): they still count for "
                       "completeness and the gate", style="dim"))
    if cmd == "reconcile" and "positions" in facts:
        _reconcile(con, facts)
    if cmd == "publish" and "published" in facts:
        _publish(con, facts)
    if cmd == "forensics" and "logs" in facts:
        _forensics(con, facts)
    if cmd == "preflight" and "nodes" in facts:
        _preflight(con, facts)
    if cmd == "prune" and "pruned" in facts:
        pr = facts["pruned"]
        verb = "would remove" if pr["dry_run"] else "removed"
        for n in pr["removed"]:
            con.print(Text(f"{verb} {n}", style="yellow" if pr["dry_run"] else None))
        for n, why in pr["kept"].items():
            con.print(Text(f"kept {n}: {why}", style="dim"))
        if not pr["removed"]:
            con.print(Text("nothing to remove"))
        else:
            con.print(Text(f"{'would free' if pr['dry_run'] else 'freed'} {_size(pr.get('bytes') or 0)} "
                           f"({plural(len(pr['removed']), 'checkpoint')})"))
    for line in facts.get("notes") or []:
        con.print(Text(line))
    chk = facts.get("checked") if cmd in ("verify", "prune") else None
    if chk and chk.get("checkpoints"):
        lay = facts.get("layout")
        con.print(Text(f"checked {plural(chk['checkpoints'], 'checkpoint')}" + (f" ({lay})" if lay else "") +
                       f": {plural(chk['files'], 'file')}, {_size(chk['bytes'])} ({', '.join(chk['compared'])})"
                       + (f" in {chk['seconds']:.2f} s" if chk.get("seconds") else ""), style="dim"))
    s = report.summary
    verdict = "FAIL" if report.failed() else "ok"
    con.print(Text(f"{report.command}: {verdict} - {plural(s['error'], 'error')}, "
                   f"{plural(s['warning'], 'warning')}, {s['info']} info",
                   style="bold red" if report.failed() else "bold green"))


def _forensics(con, facts) -> None:
    lg, first = facts["logs"], facts.get("first_failure")
    order = "by time" if lg["timestamps"] else "in log order (the lines carry no timestamps)"
    con.print(Text(f"read {plural(lg['lines'], 'line')} of {plural(len(lg['files']), 'log')}; failures ordered {order}",
                   style="dim"))
    if first:
        con.print(Text(f"class: {facts['class']}" + (f"; errno {first['errno']}" if first.get("errno") else "")
                       + (f"; chain: {', then '.join(first['chain'])}" if first.get("chain") else ""), style="bold"))
    ck = facts.get("checkpoint")
    if ck:
        linked = "; ".join(f"{x['rule']} {x['message']}" for x in ck["linked"][:3])
        con.print(Text(f"checkpoint {ck['path']}: " + (f"BROKEN - {linked}" if ck["broken"] else
                                                       "verify finds it complete (the cause is elsewhere: "
                                                       "memory, the storage, or a state mismatch)"),
                       style="bold red" if ck["broken"] else "bold"))


def _unk(v) -> str:
    return "?" if v is None else str(v)


def _reconcile(con, facts) -> None:
    p = facts["positions"]
    targets = ", ".join(f"step {t}: {c}" for t, c in p["buffer_targets"].items()) or "empty"
    con.print(Text(f"positions: N={_unk(p['num_prompts_per_step'])} L={_unk(p['lookahead'])} "
                   f"trainer T={_unk(p['trainer_version'])} cursor C={_unk(p['cursor'])} "
                   f"dataloader A={_unk(p['dataloader_admitted'])}  buffer [{targets}]", style="bold"))
    rep = facts.get("repair") or {}
    if rep.get("available"):
        con.print(Text(f"safe repair: {rep['reason']} (reconcile --fix)", style="yellow"))
    for key, title in (("simulation", "simulated resume"), ("simulation_after_repair", "after the repair")):
        sim = facts.get(key)
        if not sim:
            continue
        t = Table(title=title, title_justify="left")
        for col in ("step", "batch", "dispatched", "dropped", "dedupe", "lost"):
            t.add_column(col, justify="right")
        for r in sim["steps"]:
            t.add_row(*(str(r[c]) for c in ("step", "batch", "dispatched", "dropped", "dedupe", "lost")),
                      style="red" if r["lost"] else None)
        con.print(t)
        restored = [r for r in sim.get("trained", []) if r["restored"]]
        if restored:
            con.print(Text("  trained from restored groups: " + ", ".join(
                f"step {r['step']} ({r['restored']} restored, {r['fresh']} fresh)" for r in restored)))
        st = sim.get("stalled_at")
        con.print(Text(f"  lost on resume: {_ids(sim['lost_prompts'])}; lost at save: "
                       f"{_ids(sim['lost_at_save'])}; trained twice: {_ids(sim['duplicate_prompts'])}; "
                       f"stall: {'step %s (%s of %s groups)' % (st['step'], st['have'], st['need']) if st else 'none'}"))
    if facts.get("fixed"):
        fx = facts["fixed"]
        con.print(Text(f"fixed: {fx['change']} in {fx['file']}" +
                       (f" (backup {fx['backup']})" if fx.get("backup") else ""), style="bold yellow"))


def _ids(ids) -> str:
    if not ids:
        return "none"
    shown = ", ".join(f"p{i}" if isinstance(i, int) else str(i) for i in ids[:8])
    return f"{len(ids)} ({shown}{', ...' if len(ids) > 8 else ''})"


def _publish(con, facts) -> None:
    res = facts.get("published")
    if res is None:
        con.print(Text(f"not published: {facts.get('refused', 'refused')}", style="bold red"))
        return
    dest = res["dest"].rstrip("/") + "/" + res["name"]
    verb = {"published": "published", "replaced": "replaced", "unchanged": "unchanged (already published)",
            "committed": "published (this part committed)", "part-done": "published (part done; committed by "
            f"part {res.get('committer')})", "already-committed": "already published under this publish id"}
    rate = res["bytes"] / res["seconds"] / 1e6 if res["seconds"] else 0
    part = (f"part {res['part']}/{res['parts']} of publish {res['publish_id']}: " if "part" in res else "")
    con.print(Text(f"{part}{verb.get(res['status'], res['status'])}: {dest}  ({res['files']} files, "
                   f"{_size(res['bytes'])}, {res['seconds']:.2f} s, {rate:.0f} MB/s)", style="bold green"))
    if "part" in res and res["status"] != "already-committed":
        con.print(Text(f"this node: {res['copied']} copied, {res['compared']} already placed by another node "
                       f"and compared equal, {res['resumed']} kept from an earlier run", style="dim"))
    tr = res.get("tracker")
    if tr:
        if tr["written"]:
            old = (tr["old"] or "").strip()
            con.print(Text(f"tracker {tr['file']}: " + (f"{old} -> {tr['new']}" if old else f"now {tr['new']}")))
        else:
            con.print(Text(f"tracker {tr['file']} unchanged: {tr['note']}", style="yellow"))
    for n in res.get("pruned") or []:
        con.print(Text(f"pruned {n}"))
    for n, why in (res.get("kept") or {}).items():
        con.print(Text(f"kept {n}: {why}", style="dim"))
    for n in res.get("cleaned") or []:
        con.print(Text(f"removed own stale leftover {n}", style="dim"))
    for n in res.get("notes") or []:
        con.print(Text(n, style="dim"))


def _preflight(con, facts) -> None:
    n_nodes = facts.get("allocation_nodes", len(facts["nodes"]))  # --local: the table has this node's row only
    t = Table(title=f"allocation: {plural(n_nodes, 'node')}, {plural(facts['world'], 'rank')}"
              + (f" (checked on this node only: {facts['local']})" if facts.get("local") else ""), title_justify="left")
    for col in ("node", "ranks", "gaps (resume target)", "gaps (all)", "location"):
        t.add_column(col)
    for r in facts["nodes"]:
        a, b = r["ranks"] if r["ranks"] else (None, None)
        ranks = "-" if a is None else str(a) if a == b else f"{a}-{b}"
        bad = r["problem"] or r["gaps_in_resume_target"]
        t.add_row(r["node"], ranks, Text(str(r["gaps_in_resume_target"]) if not r["problem"] else "unreadable",
                                         style="red" if bad else "green"), str(r["gaps"]), r["location"])
    con.print(t)
    rf = facts.get("resume_from")
    con.print(Text(f"framework will resume from: {rf if rf else ('this checkpoint' if rf == '' else 'nothing')}",
                   style="bold"))
    who = "this node's ranks" if facts.get("local") else "every rank"
    nr = facts.get("newest_reachable")
    con.print(Text(f"newest checkpoint {who} can read: {nr if nr else ('this checkpoint' if nr == '' else 'none')}",
                   style="bold"))
