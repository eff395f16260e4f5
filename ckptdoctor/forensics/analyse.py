"""From a failed job's logs to its first checkpoint-related failure.

The last message of a multi-rank failure is rarely its cause: the rank that could not read its shard
raises, the others die later in a collective (a timeout, a closed connection) or are stopped by the
launcher, and DCP copies every failed rank's traceback into every rank's CheckpointException.  So:

1. Every log is read line by line (logs.py) and split into streams by who wrote each line (the
   `[rankN]:` / `[defaultN]:` / `srun -l` prefix, else the rank the file is named for).
2. Per stream, tracebacks are parsed: frames, the exception line, the chain ("The above exception
   was the direct cause"), and inside a DCP `CheckpointException` each `(RANK N)` traceback as that
   rank's own failure.  Launcher lines are events too: torchrun's failure summary (rank, host, pid,
   exit code, signal), `srun: error: ... task N: Killed`, Slurm's oom_kill notice, the kernel's
   "Out of memory: Killed process PID" (mapped to its rank through the summary's pids).
3. Each event is matched against rules/forensics.yaml: a cause (file / memory / derived-state /
   launcher) or collateral (timeouts, lost peers, SIGTERM from the launcher), never blamed.
   A traceback that the process survived (logged, then it went on) is evidence, not the failure:
   torch prefixes an uncaught rank traceback with `[rankN]:`, so in a log that has such prefixes an
   unprefixed traceback was logged; otherwise a traceback followed by another one in its stream
   was handled.
4. Causes that are the same failure (the same exception and message, copied by DCP into every rank)
   are one failure with the ranks that raised it; the first failure is the earliest by time when
   every candidate has a time, else the first in log order.

Memory is bounded: per stream only the state of the traceback being read, per rank the last
checkpoint path mentioned, and at most MAX_EVENTS distinct failures.
"""
from __future__ import annotations

import datetime as _dt
import errno as _errno
import functools
import re

from ..values import field, value
from . import logs as L

MAX_EVENTS = 2000
MAX_MSG = 2000
_TB = re.compile(r"^Traceback \(most recent call last\):\s*(?:\(RANK (?P<rank>\d+)\))?\s*$")
_CHAINED = ("The above exception was the direct cause of the following exception:",
            "During handling of the above exception, another exception occurred:")
_EXC = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure|Mismatch|Proof|Timeout|"
                  r"Warning)|[A-Za-z_][\w.]*\.[A-Z]\w*|EOFError|KeyError|AssertionError|StopIteration)"
                  r"(?::\s?(?P<msg>.*))?$")
_CKE = re.compile(r"CheckpointException ranks:dict_keys\(\[(?P<ranks>[\d, ]*)\]\)")
_ERRNO = re.compile(r"\[Errno (?P<n>\d+)\]")
_QUOTED_PATH = re.compile(r"""['"](?P<p>(?:/|[a-z][a-z0-9+]*://)[^'"\n]{1,4000})['"]""")
_BARE_PATH = re.compile(r"(?<![\w.\-/~])(?P<p>(?:/|[a-z][a-z0-9+]*://)[\w.\-/+=:@%]{2,4000})")
_MENTION = re.compile(r"(?i)checkpoint|ckpt|\bload|\bsav(?:e|ing)|resum|restor")
_CKPT_FRAME = re.compile(r"checkpoint|serialization\.py|safetensors|load_state_dict|state_dict|deepspeed/runtime|"
                         r"dist_checkpointing|trainer\.py")
# torchrun's failure summary, one field per line under "[N]:"
_SUMMARY = re.compile(r"^\s{2}(?P<k>time|host|rank|exitcode|error_file|traceback)\s*:\s?(?P<v>.*)$")
_SRUN_TASK = re.compile(r"^srun: error: (?P<host>[\w.\-]+): tasks? (?P<tasks>[\d,\-]+): (?P<what>.*)$")
_STAMPISH = re.compile(r"\[?\d{4}-\d\d-\d\d[ T_]\d\d:|[IWEF]\d{4} \d\d:|\s{2}time\s*: \d{4}-")


# Every line that can matter holds one of these, in lower case (found with bytes.find in the lowered
# block, logs.lines): a traceback's header and chain lines, an exception line (its type name ends so;
# the file-class signatures of rules/forensics.yaml are only looked for in exception lines), torchrun's
# summary fields, srun's and the kernel's messages, a checkpoint path mentioned, each plain-line
# signature (its `example` must hold one: tests/test_forensics.py), and the frame lines that mark a
# traceback as a checkpoint's.
KEYWORDS = (
    "traceback", "during handling", "rror", "xception", "exit", "interrupt", "mismatch", "failure", "proof",
    "timeout", "imed out", "warning", "  time", "  host", "  rank", "srun:", "slurmstepd", "kill", "sig",
    "terminated", "cancelled", "time limit", "memory", "onnection", "broken pipe", "heckpoint", "ckpt", "load",
    "sav", "resum", "restor", "serialization", "safetensors", "state_dict", "deepspeed", "trainer.py",
    "rendezvous", "address already", "unable to create step", "job step creation", "out of", "oom", "alloc")


@functools.lru_cache(maxsize=1)
def _keywords() -> tuple[bytes, ...]:
    return tuple(k.encode() for k in KEYWORDS)


_TORCHRUN_ELINE = re.compile(r"failed \(exitcode: -?\d+\) local_rank: \d+")
_OOM_PID = re.compile(r"Killed process (?P<pid>\d+)")


@functools.lru_cache(maxsize=1)
def signatures() -> list[dict]:
    from ..engine.catalog import data_dir, load_yaml
    doc = load_yaml(data_dir() / "forensics.yaml")
    out = []
    for s in doc["signatures"]:
        if s["kind"] not in ("cause", "collateral") or (s["kind"] == "cause" and s.get("class") not in
                                                        ("file", "memory", "derived-state", "launcher")):
            raise ValueError(f"forensics.yaml: signature {s.get('id')}: bad kind or class")
        out.append(dict(s, rx=re.compile(s["match"])))
    return out


def match(text: str, plain_line: bool = False) -> dict | None:
    """The first signature matching `text`.  A plain log line (not an exception) only counts for
    what launchers and the kernel print (memory, launcher, collateral): a file error in a log message
    is often a retry that worked."""
    for s in signatures():
        if plain_line and s.get("class") in ("file", "derived-state"):
            continue
        if s["rx"].search(text):
            return s
    return None


@value
class Event:
    kind: str                      # cause | collateral | exit
    rank: int | None
    log: str
    line: int
    order: tuple
    time: _dt.datetime | None
    exception: str | None = None
    message: str | None = None
    signature: str | None = None
    cls: str | None = None
    errno: str | None = None
    path: str | None = None
    path_source: str | None = None     # "message" or "log" (the last path the rank mentioned before)
    host: str | None = None
    chain: list[str] = field(default_factory=list)
    reported_by: set = field(default_factory=set)
    handled: bool = False
    prefixed: bool = True          # torch's [rankN]: prefix (uncaught) or a launcher line
    ckpt_frames: bool = False
    what: str | None = None
    fix: str | None = None


def _errno_name(text: str, sig: dict | None) -> str | None:
    m = _ERRNO.search(text)
    if m:
        return _errno.errorcode.get(int(m.group("n")), f"errno {m.group('n')}")
    return sig.get("errno") if sig else None


def _path_in(text: str) -> str | None:
    m = _QUOTED_PATH.search(text) or _BARE_PATH.search(text)
    return m.group("p").rstrip(".,;:)") if m else None


class _Stream:
    """One writer's traceback being read."""
    __slots__ = ("state", "ckpt", "sub_rank", "cke", "chain_next", "last_exc", "pending")

    def __init__(self):
        self.state = None          # None | "frames" | "cke"
        self.ckpt = False
        self.sub_rank = None       # inside a CheckpointException: the (RANK N) being read
        self.cke = None            # the CheckpointException event whose per-rank causes follow
        self.chain_next = False
        self.last_exc = None
        self.pending = []          # this stream's exceptions; all but the last were survived


@value
class Analysis:
    logs: list[str]
    lines: int = 0
    events: list[Event] = field(default_factory=list)
    first: dict | None = None
    failed_after: list[int] = field(default_factory=list)
    other: list[dict] = field(default_factory=list)
    timestamps: bool = True


def analyse(paths: list[str]) -> Analysis:
    a = Analysis(logs=list(paths))
    seen: dict[tuple, Event] = {}
    pid_rank: dict[int, int] = {}
    oom_pids: list[tuple[int, Event]] = []
    year = None
    for li, path in enumerate(paths):
        file_rank = L.rank_of_file(path)
        streams: dict = {}
        mention: dict = {}
        prefixed = False
        summary: dict = {}
        file_events: list[Event] = []

        def add(ev: Event) -> Event:
            key = (ev.kind, ev.rank, ev.exception, (ev.message or "")[:300], ev.signature)
            old = seen.get(key)
            if old is not None:
                old.reported_by |= ev.reported_by
                return old
            if len(seen) >= MAX_EVENTS:
                return ev
            seen[key] = ev
            a.events.append(ev)
            file_events.append(ev)
            return ev

        def finish_summary():
            if "rank" not in summary or "exitcode" not in summary:
                summary.clear()
                return
            m = re.match(r"(-?\d+)", summary["exitcode"])
            rank_m = re.match(r"(\d+)", summary["rank"])
            pid_m = re.search(r"pid: (\d+)", summary["exitcode"])
            if m and rank_m:
                code, rank = int(m.group(1)), int(rank_m.group(1))
                if pid_m:
                    pid_rank[int(pid_m.group(1))] = rank
                t = L.stamp(summary.get("time", ""), year)
                text = f"exitcode : {summary['exitcode']}"
                sig = match(text, plain_line=True) if code < 0 else None
                ev = Event(kind=sig["kind"] if sig else "exit", rank=rank, log=path, line=summary["_line"],
                           order=(li, summary["_line"]), time=t, exception=_signal_name(code),
                           message=f"exit code {code}" + (f" ({_signal_name(code)})" if code < 0 else ""),
                           signature=sig["id"] if sig else None, cls=sig.get("class") if sig else None,
                           host=summary.get("host"), reported_by={rank})
                _describe(ev, sig)
                add(ev)
            summary.clear()

        for n, prank, task, text, raw in L.lines(path, _keywords(), _STAMPISH.match):
            if text is None:
                a.lines += n
                break
            rank = prank if prank is not None else task if task is not None else file_rank
            prefixed = prefixed or prank is not None
            key = (prank, task)
            st = streams.get(key)
            if st is None:
                st = streams[key] = _Stream()
            when = L.stamp(raw, year) if raw else None
            if when is not None and when.year > 1900:
                year = when.year
            # torchrun's summary
            sm = _SUMMARY.match(text)
            if sm and st.state is None:
                summary.setdefault("_line", n)
                summary[sm.group("k")] = sm.group("v").strip()
                if sm.group("k") == "traceback":
                    finish_summary()
                continue
            if summary:
                finish_summary()
            tb = _TB.match(text)
            if tb:
                if st.state == "cke" and tb.group("rank") is not None:
                    st.sub_rank = int(tb.group("rank"))
                elif st.state == "cke":
                    st.cke, st.sub_rank = None, None
                st.state, st.ckpt = "frames", False
                continue
            if text in _CHAINED:
                st.chain_next = True
                continue
            if st.state == "frames":
                if text.startswith(" ") or not text.strip():
                    if text.startswith("  File ") and _CKPT_FRAME.search(text):
                        st.ckpt = True
                    continue
                em = _EXC.match(text)
                if not em:      # not an exception line after all: the traceback ended unreadably
                    st.state = None
                    continue
                etype, msg = em.group("type"), (em.group("msg") or "")[:MAX_MSG]
                short = etype.rsplit(".", 1)[-1]
                full = f"{short}: {msg}" if msg else short
                sig = match(full)
                r = st.sub_rank if st.sub_rank is not None else rank
                ev = Event(kind=sig["kind"] if sig else "cause", rank=r, log=path, line=n, order=(li, n), time=when,
                           exception=short, message=msg, signature=sig["id"] if sig else None,
                           cls=sig.get("class") if sig else None, errno=_errno_name(msg, sig),
                           reported_by={rank} if rank is not None else set(), ckpt_frames=st.ckpt)
                p = _path_in(msg)
                if p:
                    ev.path, ev.path_source = p, "message"
                else:
                    m_ = mention.get(r) or mention.get(None)
                    if m_:
                        ev.path, ev.path_source = m_, "log"
                _describe(ev, sig)
                cke = _CKE.search(text)
                if cke:   # DCP's gathered failures: the per-rank causes follow as (RANK N) tracebacks
                    st.state, st.cke, st.sub_rank = "cke", ev, None
                    continue
                if st.chain_next and st.last_exc is not None and st.last_exc.rank == r:
                    root = st.last_exc
                    root.chain.append(full)
                    root.handled = False
                    st.chain_next, st.state = False, None
                    continue
                ev.prefixed = prank is not None
                ev = add(ev)
                if st.sub_rank is None:
                    for prev in st.pending:
                        if prev is not ev:
                            prev.handled = True
                    st.pending = [ev]
                st.last_exc = ev
                st.chain_next = False
                st.state = "cke" if st.cke is not None else None
                continue
            if st.state == "cke" and text.strip() == "":
                st.state, st.cke, st.sub_rank = None, None, None
                continue
            # a plain line: launcher and kernel messages, and the paths a rank says it loads
            if _TORCHRUN_ELINE.search(text):   # its local rank and exit code are in the summary that follows
                continue
            sr = _SRUN_TASK.match(text)
            if _MENTION.search(text) and not text.startswith(" "):
                p = _path_in(text)
                if p:
                    mention[rank] = mention[None] = p
            sig = match(text, plain_line=True)
            if sig is None and not sr:
                continue
            ranks = _task_list(sr.group("tasks")) if sr else [rank]
            for r in ranks:
                if sig is None:   # srun: "Exited with exit code 1"
                    ev = Event(kind="exit", rank=r, log=path, line=n, order=(li, n), time=when,
                               message=sr.group("what"), host=sr.group("host"), reported_by={r})
                else:
                    ev = Event(kind=sig["kind"], rank=r, log=path, line=n, order=(li, n), time=when,
                               exception=sig["id"], message=text.strip()[:MAX_MSG], signature=sig["id"],
                               cls=sig.get("class"), errno=sig.get("errno"), host=sr.group("host") if sr else None,
                               reported_by={r} if r is not None else set())
                    _describe(ev, sig)
                ev = add(ev)
                om = _OOM_PID.search(text)
                if om:
                    oom_pids.append((int(om.group("pid")), ev))
        if summary:
            finish_summary()
        if prefixed:   # torch marks an uncaught rank traceback [rankN]: the unmarked ones were logged
            for ev in file_events:
                if not ev.prefixed:
                    ev.handled = True
    for pid, ev in oom_pids:   # the kernel names a pid; torchrun's summary says whose it was
        if ev.rank is None and pid in pid_rank:
            ev.rank = pid_rank[pid]
            ev.reported_by = {ev.rank}
    _decide(a)
    return a


def _task_list(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out += list(range(int(lo), int(hi or lo) + 1))[:4096]
    return out


def _signal_name(code: int) -> str | None:
    if code >= 0:
        return None
    import signal
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _describe(ev: Event, sig: dict | None) -> None:
    if sig:
        ev.what, ev.fix = sig.get("what"), sig.get("fix")


def _related(ev: Event) -> bool:
    return ev.signature is not None or ev.ckpt_frames or bool(ev.message and _MENTION.search(ev.message))


def _decide(a: Analysis) -> None:
    causes = [e for e in a.events if e.kind == "cause" and not e.handled and _related(e)]
    if not causes:
        causes = [e for e in a.events if e.kind == "cause" and _related(e)]
    if not causes:
        causes = [e for e in a.events if e.kind == "exit"]
    a.other = [_brief(e) for e in a.events if e.kind == "cause" and not _related(e)][:5]
    if not causes:
        return
    # one failure, several ranks: DCP copies each failed rank's traceback into every rank's report
    # (and one storage error seen differently by two ranks, e.g. ENOSPC as OSError on one and as torch's
    # "unexpected pos" on the other, is one failure: same errno, same path)
    groups: dict[tuple, list[Event]] = {}
    # (and a rank's SIGKILL with the kernel's oom-kill of its pid is one failure: memory, then certain)
    for e in causes:
        key = (("killed", e.rank) if e.signature in ("killed", "oom-kill") and e.rank is not None else
               (e.cls, e.errno, e.path) if e.errno and e.path else
               (e.signature, e.exception, re.sub(r"\d+", "N", (e.message or "")[:300]), e.path))
        groups.setdefault(key, []).append(e)

    def when(g):   # a group's earliest time (an oom-kill line from dmesg has none: its SIGKILL's counts)
        ts = [e.time for e in g if e.time is not None]
        return min(ts) if ts else None
    first_order = {k: min(e.order for e in g) for k, g in groups.items()}
    timed = all(when(g) is not None for g in groups.values())
    a.timestamps = timed
    best = min(groups, key=(lambda k: (when(groups[k]), first_order[k])) if timed else (lambda k: first_order[k]))
    g = groups[best]
    # the lead: the earliest; at the same time, the one whose message carries the errno itself
    lead = min(g, key=lambda e: (e.signature == "killed", e.time or _dt.datetime.max,
                                 not _ERRNO.search(e.message or ""), e.order))
    ranks = sorted({e.rank for e in g if e.rank is not None})
    chain = lead.chain
    a.first = {
        "rank": lead.rank, "ranks": ranks, "host": lead.host or next((e.host for e in a.events if e.rank == lead.rank
                                                                        and e.host), None),
        "path": lead.path, "path_source": lead.path_source, "errno": lead.errno, "exception": lead.exception,
        "message": lead.message, "time": lead.time.isoformat(sep=" ") if lead.time else None,
        "log": lead.log, "line": lead.line, "chain": ([f"{lead.exception}: {lead.message}"] + chain) if chain else [],
        "signature": lead.signature, "class": lead.cls or ("file" if lead.kind == "cause" else "launcher"),
        "what": lead.what or ("a rank exited with an error and left no traceback in these logs"
                              if lead.kind == "exit" else "an error while loading or saving a checkpoint"),
        "fix": lead.fix, "reported_by": sorted(set().union(*(e.reported_by for e in g))),
        "certain": lead.kind == "cause" and lead.signature != "killed",
    }
    blamed = set(ranks)
    after = {e.rank for e in a.events if e.rank is not None and e.rank not in blamed and
             (e.kind == "collateral" or (e.kind == "exit") or (e.kind == "cause" and e.handled))}
    own = {e.rank for e in a.events if e.kind == "cause" and not e.handled and e.rank is not None}
    # a rank with a failure of its own that is not the first is not "after": it is reported as is
    a.failed_after = sorted(after - (own - blamed))


def _brief(e: Event) -> dict:
    return {"rank": e.rank, "exception": e.exception, "message": (e.message or "")[:200], "log": e.log, "line": e.line}
