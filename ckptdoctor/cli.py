"""Thin typer commands: parse options, call a flow in ckptdoctor.commands, render the Report."""
from __future__ import annotations

import gc
import os
import sys
from .values import value
from enum import Enum

from . import __version__
from . import clidecl as typer  # typer's API, recorded; typer itself is imported only when needed
from .engine.errors import EXIT_INTERNAL, CkptDoctorError, InputError, UsageError

app = typer.Typer(name="ckptdoctor", no_args_is_help=True, add_completion=False,
                  rich_markup_mode=None, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Find broken checkpoints before the relaunch; publish them whole or not at all.")

class Fmt(str, Enum):
    text = "text"
    json = "json"
    sarif = "sarif"
    concise = "concise"   # path:rule:severity: message, one line each (logs, grep)
    github = "github"     # GitHub Actions annotations
    gitlab = "gitlab"     # GitLab code quality JSON


class Target(str, Enum):
    all = "all"
    resume = "resume"


class Level(str, Enum):
    error = "error"
    warning = "warning"
    info = "info"


# ---- shared option declarations ------------------------------------------------------------
def _complete_rules(incomplete: str):
    from .engine.catalog import catalog
    inc = incomplete.rsplit(",", 1)[-1]
    head = incomplete[: len(incomplete) - len(inc)]
    return [head + k for r in catalog().values() for k in (r.id, r.name) if k.startswith(inc.upper() if
            inc[:3].upper() == "CKD" else inc)]


def _complete_layouts(incomplete: str):
    from .layouts.spec import layouts
    return [n for n in layouts() if n.startswith(incomplete)]


SelectOpt = typer.Option(None, "--select", autocompletion=_complete_rules,
                         help="Only these rules: ids or names, prefixes allowed "
                         "(CKD1, tracker-), comma-separated or repeated; ALL for every rule.")
IgnoreOpt = typer.Option(None, "--ignore", autocompletion=_complete_rules,
                         help="Skip these rules (ids or names, prefixes allowed).")
FailOnOpt = typer.Option(None, "--fail-on", help="Exit 1 when a finding is at or above this severity "
                         "[default: error].")
SeverityOpt = typer.Option(None, "--severity", help="Override a rule's severity: RULE=error|warning|info "
                           "(repeatable).")
ConfigOpt = typer.Option(None, "--config", help="Config file (ckptdoctor.toml or pyproject.toml "
                         "[tool.ckptdoctor]); default: $CKPTDOCTOR_CONFIG, else found upward from the "
                         "current directory.")
IsolatedOpt = typer.Option(False, "--isolated", help="Ignore every config file and $CKPTDOCTOR_CONFIG.")
FormatOpt = typer.Option(Fmt.text, "--format", "-f", help="Output format on stdout: text, json, sarif, concise "
                         "(path:rule:severity: message per line), github (Actions annotations), gitlab (code quality).")
OutputOpt = typer.Option(None, "--output", "-o", help="Write the report to FILE (atomically: a reader never sees "
                         "half a report) instead of stdout.")
ExitZeroOpt = typer.Option(False, "--exit-zero", help="Exit 0 even when findings reach --fail-on (or the relaunch "
                           "gate fails); usage errors and internal errors keep their codes.")
StatisticsOpt = typer.Option(False, "--statistics", help="After the report, a count of findings per rule "
                             "(on stderr, so the report's format stays what it is).")
DebugOpt = typer.Option(False, "--debug", help="Show tracebacks of internal errors.")
QuietOpt = typer.Option(False, "--quiet", "-q", help="No progress or log lines on stderr.")
VerboseOpt = typer.Option(False, "--verbose", "-v", help="Say which config file applied, and how long it took.")


class Color(str, Enum):
    auto = "auto"
    always = "always"
    never = "never"


ColorOpt = typer.Option(Color.auto, "--color", help="Colour in text output: auto (on a terminal, unless "
                        "NO_COLOR is set), always, never.")


def _split(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out += [x for x in v.replace(",", " ").split() if x]
    return out


def _engine(command: str, target: str, c: "Common", options: dict | None = None):
    from .api import make_engine
    from .report.progress import Progress
    sev: dict[str, str] = {}
    for item in c.severity or []:
        key, sep, val = item.partition("=")
        if not sep:
            raise UsageError(f"--severity {item!r}: expected RULE=error|warning|info")
        sev[key] = val
    import time
    from .report import text
    text.COLOR = c.color.value if c.color else "auto"
    eng = make_engine(command, target, select=_split(c.select), ignore=_split(c.ignore), severity=sev,
                      fail_on=c.fail_on.value if c.fail_on else None, config=c.config, isolated=c.isolated,
                      debug=c.debug, progress=lambda total, label: Progress(total, label, enabled=not c.quiet),
                      **(options or {}))
    eng.verbose, eng.t0 = c.verbose, time.monotonic()
    if c.verbose:
        _say(f"ckptdoctor: config: {eng.report.config or 'none (defaults)'}")
    return eng


@value
class Common:
    """The options every judging subcommand shares, declared once."""
    select: list[str] | None
    ignore: list[str] | None
    fail_on: Level | None
    severity: list[str] | None
    config: str | None
    isolated: bool
    format: "Fmt"
    debug: bool
    quiet: bool
    verbose: bool = False
    color: "Color" = None


def _finish(eng, fmt: Fmt, output: str | None = None, exit_zero: bool = False, statistics: bool = False) -> None:
    if output:
        _write_report(eng.report, fmt, output)
    else:
        emit(lambda: _render(eng.report, fmt))
    if statistics:
        _statistics(eng.report)
    if getattr(eng, "verbose", False):
        import time
        _say(f"ckptdoctor: {eng.report.command} took {time.monotonic() - eng.t0:.2f} s")
    if eng.internal_errors:
        raise typer.Exit(EXIT_INTERNAL)
    raise typer.Exit(1 if eng.report.failed() and not exit_zero else 0)


def _write_report(report, fmt: Fmt, path: str) -> None:
    from .report import render
    _write_out(lambda out: render(report, fmt.value, out), path)


def _write_out(write, path: str) -> None:
    """-o FILE: the whole report, written durably and renamed into place (never half a report)."""
    import io
    from .io.atomic import replace_file
    buf = io.StringIO()
    write(buf)
    try:
        replace_file(path, buf.getvalue().encode("utf-8", "surrogateescape"))
    except OSError as exc:
        raise UsageError(f"--output {path}: cannot write the report: {exc.strerror or exc}") from None


def _statistics(report) -> None:
    """--statistics: findings per rule, most first (as ruff prints them), on stderr."""
    from collections import Counter
    counts = Counter((f.rule, f.name, f.severity) for f in report.findings)
    for (rule, name, sev), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0][0])):
        print(f"{n:>6}  {rule}  {sev:<7}  {name}", file=sys.stderr)
    print(f"{sum(counts.values()):>6}  findings in all", file=sys.stderr)


def _text_or_json(fmt: Fmt, what: str) -> None:
    """Listings and tools that print no findings report have only text and json."""
    if fmt not in (Fmt.text, Fmt.json):
        raise UsageError(f"{what} prints text or json (--format {fmt.value} is for findings reports)")


def _render(report, fmt: Fmt) -> None:
    from .report import render
    render(report, fmt.value, sys.stdout)


def emit(write) -> None:
    """Run `write()` (which prints the report) and flush; a full disk, a closed pipe or an I/O error
    on standard output is one line and exit 2, never a traceback: the verdict was not delivered."""
    try:
        write()
        sys.stdout.flush()
    except OSError as exc:
        _quiet_stdout()
        if isinstance(exc, BrokenPipeError):  # `| head`: the reader chose to stop; no message
            raise typer.Exit(2) from None
        raise UsageError(f"cannot write the report to standard output: {exc.strerror or exc}") from None


def _positive_timeout(timeout: float) -> None:
    """--timeout of publish --part: finite and > 0 (nan never gives up, -1 gave up at once)."""
    if not (0 < timeout < float("inf")):
        raise UsageError(f"--timeout {timeout}: a finite number of seconds > 0")


def _logging(quiet: bool, debug: bool) -> None:
    from .engine import logs
    logs.configure(quiet, debug)


# ---- commands ------------------------------------------------------------------------------
@app.command(rich_help_panel="Inspection")
def verify(
    paths: list[str] = typer.Argument(..., metavar="PATH...", help="Checkpoint directories, run roots, or fsspec "
                                      "URLs (s3://, file://); several give one report per path and the worst "
                                      "exit status."),
    layout: str | None = typer.Option(None, "--layout", autocompletion=_complete_layouts,
                                         help="Force a layout (see `ckptdoctor layouts`)."),
    target: Target = typer.Option(Target.all, "--target", help="all: every checkpoint decides the exit status; "
                                  "resume: the relaunch gate, only the tracker and the checkpoint the framework "
                                  "will resume from (findings in newer ones become info; older ones are not "
                                  "read unless the target is broken)."),
    num_experts: int | None = typer.Option(None, "--num-experts", help="Expected expert count for "
                                              "CKD109 (default: from config.json)."),
    mtime_tolerance: float | None = typer.Option(None, "--mtime-tolerance", help="Seconds a shard may "
                                                    "be newer than its marker before CKD107 fires [default: 2]."),
    checksums: bool = typer.Option(False, "--checksums", help="Also re-hash every file against the "
                                   "manifest (ckptdoctor.manifest.json or Megatron integrity.json); no "
                                   "manifest is an error."),
    slice_: str | None = typer.Option(None, "--slice", help="With --checksums or --deep: read only slice K "
                                         "of N (K/N, e.g. $SLURM_PROCID/$SLURM_NTASKS); combine with `ckptdoctor "
                                         "merge`."),
    workers: int | None = typer.Option(None, "--workers", help="Hashing threads [default: one per core, max 8]."),
    deep: bool = typer.Option(False, "--deep", help="Also read tensor bytes, without torch (safetensors, DCP "
                              "shards, torch zip archives): NaN/Inf in any float dtype, each record's CRC-32, "
                              "and a zero-filled tail left by a crash."),
    fix: bool = typer.Option(False, "--fix", help="Run roots: when the framework would resume from a broken "
                             "checkpoint (or none), repoint the tracker to the newest complete one (atomic, with "
                             "a backup); never deletes or moves a checkpoint's data."),
    fix_to: int | None = typer.Option(None, "--fix-to", help="With --fix: resume from this step instead "
                                         "(it must be complete)."),
    quarantine: bool = typer.Option(False, "--quarantine", help="With --fix, for families without a tracker "
                                    "(newest directory wins): rename broken newer checkpoints to a name the "
                                    "framework ignores."),
    dry_run: bool = typer.Option(False, "--dry-run", "-n", help="With --fix: print the repair it would make "
                                 "and change nothing."),
    allow_fresh: bool = typer.Option(False, "--allow-fresh", help="With --target resume: an empty run root, "
                                     "or a run root with nothing to resume from, passes the gate (a new run)."),
    loader_torch: str | None = typer.Option(None, "--loader-torch", help="The torch version the job loads with "
                                               "(e.g. 2.3.1): a DCP checkpoint it cannot unpickle is an error "
                                               "(CKD134) [default: the torch installed here, if any]."),
    select: list[str] | None = SelectOpt, ignore: list[str] | None = IgnoreOpt,
    fail_on: Level | None = FailOnOpt, severity: list[str] | None = SeverityOpt,
    config: str | None = ConfigOpt, isolated: bool = IsolatedOpt, format: Fmt = FormatOpt, output: str | None = OutputOpt,
    exit_zero: bool = ExitZeroOpt, statistics: bool = StatisticsOpt,
    debug: bool = DebugOpt, quiet: bool = QuietOpt, verbose: bool = VerboseOpt, color: Color = ColorOpt,
):
    """Check a checkpoint or run root: completeness, sizes, markers, trackers, coverage. Read-only
    unless --fix."""
    _logging(quiet, debug)
    from .commands import verify as flow
    sl = _parse_slice(slice_, checksums or deep)
    c = Common(select, ignore, fail_on, severity, config, isolated, format, debug, quiet, verbose, color)
    if (fix_to is not None or quarantine or dry_run) and not fix:
        raise UsageError("--fix-to, --quarantine and --dry-run only make sense with --fix")
    if allow_fresh and target.value != "resume":
        raise UsageError("--allow-fresh only makes sense with --target resume (the relaunch gate)")
    if loader_torch is not None:
        from .layouts.torchver import vtuple
        try:
            vtuple(loader_torch)
        except ValueError as exc:
            raise UsageError(f"--loader-torch: {exc}") from None

    def one(path: str):
        def make_engine():
            return _engine("verify", path, c, {"num_experts": num_experts, "mtime_tolerance": mtime_tolerance,
                                               "checksums": checksums or None, "slice": sl, "workers": workers,
                                               "deep": deep or None, "loader_torch": loader_torch})
        if not fix:
            eng = make_engine()
            flow.run(path, eng, layout=layout, target=target.value, allow_fresh=allow_fresh)
            return eng
        from .commands import fix as doctor
        return doctor.run_and_fix(path, make_engine, layout=layout, target=target.value, fix_to=fix_to,
                                  quarantine=quarantine, dry_run=dry_run, allow_fresh=allow_fresh,
                                  say=lambda line: quiet or _say(f"ckptdoctor: {line}"))
    if len(paths) == 1:
        _finish(one(paths[0]), format, output, exit_zero, statistics)
    _finish_many([one(p) for p in paths], format, output, exit_zero, statistics)


def _finish_many(engines: list, fmt: Fmt, output: str | None, exit_zero: bool, statistics: bool) -> None:
    """Several paths in one call: one document (text: each path's report then one line; json: a
    `reports` list; sarif: one run per path), one exit status, the worst."""
    from .report import render_many
    reports = [e.report for e in engines]
    if output:
        _write_out(lambda out: render_many(reports, fmt.value, out), output)
    else:
        emit(lambda: render_many(reports, fmt.value, sys.stdout))
    if statistics:
        from .engine.finding import Report
        _statistics(Report(command=reports[0].command, target="", findings=[f for r in reports for f in r.findings]))
    if any(e.internal_errors for e in engines):
        raise typer.Exit(EXIT_INTERNAL)
    raise typer.Exit(1 if any(r.failed() for r in reports) and not exit_zero else 0)


def _parse_slice(value: str | None, reads: bool):
    if value is None:
        return None
    k, sep, n = value.partition("/")
    try:
        k, n = int(k), int(n)
    except ValueError:
        raise UsageError(f"--slice {value!r}: expected K/N, e.g. 0/4") from None
    if not sep or n < 1 or not 0 <= k < n:
        raise UsageError(f"--slice {value!r}: need 0 <= K < N")
    if not reads:
        raise UsageError("--slice only makes sense with --checksums or --deep")
    return (k, n)


@app.command(rich_help_panel="Inspection")
def manifest(paths: list[str] = typer.Argument(..., metavar="PATH...", help="Checkpoint directories (local); "
                                               "several are hashed one after another, in one process."),
             workers: int | None = typer.Option(None, "--workers", help="Hashing threads."),
             force: bool = typer.Option(False, "--force", help="Write it even if the checkpoint fails "
                                        "structural verify."),
             replace: bool = typer.Option(False, "--replace", help="Rewrite an existing manifest (atomically)."),
             format: Fmt = FormatOpt, quiet: bool = QuietOpt, debug: bool = DebugOpt):
    """Hash a checkpoint and write ckptdoctor.manifest.json into it (atomically); refuses a
    checkpoint that fails structural verify unless --force."""
    from .commands.manifest import write_manifest
    _logging(quiet, debug)
    _text_or_json(format, "manifest")
    from .engine.finding import Report
    reps = []
    for path in paths:   # each written before the next is hashed: a refusal stops the rest (exit 2)
        target, nfiles, nbytes = write_manifest(path, workers=workers, quiet=quiet, force=force, replace=replace)
        if format is Fmt.text:
            emit(lambda: print(f"wrote {target}: {nfiles} files, {nbytes} bytes"))
        rep = Report(command="manifest", target=path)   # the shared report shape (`ckptdoctor schema report`)
        rep.facts["manifest"], rep.facts["files"], rep.facts["bytes"] = target, nfiles, nbytes
        reps.append(rep)
    if format is not Fmt.text:
        if len(reps) == 1:
            emit(lambda: _render(reps[0], format))
        else:
            from .report import render_many
            emit(lambda: render_many(reps, format.value, sys.stdout))


@app.command(rich_help_panel="Inspection")
def merge(reports: list[str] = typer.Argument(..., help="JSON reports of `verify --checksums --slice K/N`."),
          fail_on: Level | None = FailOnOpt, format: Fmt = FormatOpt, quiet: bool = QuietOpt,
          debug: bool = DebugOpt):
    """Combine slice reports into one verdict; every slice 0..N-1 must be present."""
    from .commands.merge import merge as do_merge
    rep = do_merge(reports)
    if fail_on:
        rep.fail_on = fail_on.value
    emit(lambda: _render(rep, format))
    raise typer.Exit(1 if rep.failed() else 0)


@app.command(rich_help_panel="Publishing")
def publish(
    src: str = typer.Argument(..., help="Local checkpoint directory to publish (e.g. node-local NVMe)."),
    dest_root: str = typer.Argument(..., help="Destination run root: a path or an fsspec URL (s3://...)."),
    name: str | None = typer.Option(None, "--name", help="Name under DEST_ROOT [default: basename of SRC]."),
    tracker: str = typer.Option("auto", "--tracker", help="Tracker to update last: auto (from the checkpoint "
                                "name and DEST_ROOT), none, or a family that writes one (megatron, verl, "
                                "deepspeed, ...; see `ckptdoctor layouts`)."),
    replace: bool = typer.Option(False, "--replace", help="Replace an existing checkpoint of the same name "
                                 "with different content (atomic exchange; local destinations only)."),
    force: bool = typer.Option(False, "--force", help="Publish even if the source fails verification."),
    trust_manifest: bool = typer.Option(False, "--trust-manifest", help="When DEST_ROOT/<name> exists, take "
                                        "its manifest's word that it holds the source's bytes instead of "
                                        "re-reading the destination."),
    keep_last: int | None = typer.Option(None, "--keep-last", help="After committing, keep only the newest "
                                            "K checkpoints (never the tracker target or one being written)."),
    keep_every: int | None = typer.Option(None, "--keep-every", help="Also keep every checkpoint whose "
                                             "step is a multiple of M."),
    workers: int | None = typer.Option(None, "--workers", help="Parallel file copies [default: one per file, max 16]."),
    part: str | None = typer.Option(None, "--part", help="K/N: this node's part of a checkpoint spread over N "
                                       "nodes' local disks (K from 0, e.g. $SLURM_NODEID/$SLURM_NNODES); the "
                                       "part completing the set verifies and commits."),
    publish_id: str | None = typer.Option(None, "--publish-id", help="With --part: the same ID on every node "
                                             "(e.g. $SLURM_JOB_ID); a re-run with it resumes."),
    timeout: float = typer.Option(1800.0, "--timeout", help="With --part: seconds to wait for the other parts "
                                  "before giving up with nothing committed (exit 75)."),
    select: list[str] | None = SelectOpt, ignore: list[str] | None = IgnoreOpt,
    fail_on: Level | None = FailOnOpt, severity: list[str] | None = SeverityOpt,
    config: str | None = ConfigOpt, isolated: bool = IsolatedOpt, format: Fmt = FormatOpt, output: str | None = OutputOpt,
    exit_zero: bool = ExitZeroOpt, statistics: bool = StatisticsOpt,
    debug: bool = DebugOpt, quiet: bool = QuietOpt, verbose: bool = VerboseOpt, color: Color = ColorOpt,
):
    """Copy a checkpoint so it appears whole or not at all: verify, copy+hash, fsync, manifest,
    rename, then the tracker; optional retention.  With --part K/N, one checkpoint from N nodes."""
    _logging(quiet, debug)
    from .commands import publish as flow
    c = Common(select, ignore, fail_on, severity, config, isolated, format, debug, quiet, verbose, color)
    eng = _engine("publish", src, c, {"workers": workers, "keep_last": keep_last, "keep_every": keep_every})
    import signal
    from .publishing.copier import CANCEL

    class Terminated(KeyboardInterrupt):
        """SIGTERM (scancel, a preemption notice): handled like Ctrl-C, exit 143."""

    def on_term(signum, frame):
        CANCEL.set()
        raise Terminated()
    if publish_id is not None and part is None:
        raise UsageError("--publish-id goes with --part K/N")
    _positive_timeout(timeout)
    old = signal.signal(signal.SIGTERM, on_term)
    try:
        if part is not None:
            from .publishing.parts import PartRefused
            try:
                flow.run_part(src, dest_root, eng, part=part, publish_id=publish_id, timeout=timeout, name=name,
                              force=force, replace=replace, tracker=tracker, keep_last=eng.opt("keep_last"),
                              keep_every=eng.opt("keep_every"), workers=eng.opt("workers"))
            except PartRefused as exc:
                _say(f"ckptdoctor: {exc}")
                emit(lambda: _render(eng.report, format))
                raise typer.Exit(exc.exit_code) from None  # 1 refused; 73 another publish id committed
        else:
            flow.run(src, dest_root, eng, name=name, force=force, replace=replace, tracker=tracker,
                     trust_manifest=trust_manifest,
                     keep_last=eng.opt("keep_last"), keep_every=eng.opt("keep_every"), workers=eng.opt("workers"))
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: copies stop at their next buffer, staging is removed
        CANCEL.set()
        term = isinstance(exc, Terminated)
        done = ("this part's copy in flight removed (its finished files stay staged for a re-run with the same "
                "--publish-id), nothing" if part is not None else "staging removed, nothing")
        from .publishing.dest import MOVED
        if MOVED:   # the commit and the tracker move were done before the interrupt: say so
            _say(f"ckptdoctor: publish {'terminated' if term else 'interrupted'} after the commit: the "
                 f"checkpoint is published and the tracker moved ({'; '.join(MOVED)}); retention may not have run")
        else:
            _say(f"ckptdoctor: publish {'terminated' if term else 'interrupted'}: {done} published, tracker untouched")
        raise typer.Exit(143 if term else 130) from None
    finally:
        signal.signal(signal.SIGTERM, old)
    _finish(eng, format, output, exit_zero, statistics)  # refused = the source's error findings, so the exit status is 1


@app.command(rich_help_panel="Publishing")
def prune(
    paths: list[str] = typer.Argument(..., metavar="RUN_ROOT...", help="Run roots (directories of checkpoints): "
                                      "paths or fsspec URLs; several give one report per root and the worst exit "
                                      "status."),
    keep_last: int | None = typer.Option(None, "--keep-last", help="Keep the newest K checkpoints."),
    keep_every: int | None = typer.Option(None, "--keep-every", help="Also keep every checkpoint whose step "
                                             "is a multiple of M."),
    keep_within: str | None = typer.Option(None, "--keep-within", help="Also keep every checkpoint written "
                                              "within DURATION (7d, 36h, 1w2d, 90min; by its newest file)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and the bytes it would free; remove "
                                 "nothing."),
    fail_on: Level | None = typer.Option(None, "--fail-on", help="Also exit 1 when a kept checkpoint has a "
                                         "finding at or above this severity (by default prune exits by "
                                         "its own outcome: 0 when the policy was applied)."),
    format: Fmt = FormatOpt, output: str | None = OutputOpt,
    exit_zero: bool = ExitZeroOpt, statistics: bool = StatisticsOpt, debug: bool = DebugOpt, quiet: bool = QuietOpt, verbose: bool = VerboseOpt,
    color: Color = ColorOpt,
):
    """Remove old checkpoints by a retention policy; never the tracker's target, the resume target,
    the newest complete checkpoint, or one being written."""
    _logging(quiet, debug)
    from .commands import prune as flow
    c = Common(None, None, None, None, None, True, format, debug, quiet, verbose, color)

    def one(path: str):
        eng = _engine("prune", path, c, {"keep_last": keep_last, "keep_every": keep_every})
        flow.run(path, eng, keep_last=eng.opt("keep_last"), keep_every=eng.opt("keep_every"), dry_run=dry_run,
                 keep_within=keep_within)
        eng.report.fail_on = fail_on.value if fail_on else "never"   # a nightly cron fails only when asked to
        return eng
    if len(paths) == 1:
        _finish(one(paths[0]), format, output, exit_zero, statistics)
    _finish_many([one(p) for p in paths], format, output, exit_zero, statistics)


@app.command(rich_help_panel="Inspection")
def reconcile(
    path: str = typer.Argument(..., help="RL checkpoint step directory (e.g. step_7), its run root, or a "
                               "run_state/v1 file (.json/.yaml)."),
    profile: str | None = typer.Option(None, "--profile", help="Mapping profile [default: detected; "
                                          "see rules/profiles]."),
    map_: list[str] | None = typer.Option(None, "--map", help="Override a mapping: FIELD=FILE:PATH, "
                                             "e.g. sampler.cursor=training_info.json:sampler_dispatch_index "
                                             "(repeatable)."),
    show_state: bool = typer.Option(False, "--show-state", help="Print the mapped run_state/v1 (with "
                                    "provenance) as JSON and exit."),
    simulate: bool = typer.Option(False, "--simulate", help="Also run the resume simulator and print "
                                  "per step what is dispatched, dropped, deduplicated and lost."),
    steps: int = typer.Option(4, "--steps", help="Trainer steps to simulate."),
    fix: bool = typer.Option(False, "--fix", help="Apply the one proven-safe repair (align the cursor to "
                             "the dataloader) after simulating it; backs up and rewrites atomically."),
    fix_output: str | None = typer.Option(None, "--fix-output", help="With --fix: write the repaired "
                                             "file here instead of in place (for read-only or remote "
                                             "checkpoints)."),
    select: list[str] | None = SelectOpt, ignore: list[str] | None = IgnoreOpt,
    fail_on: Level | None = FailOnOpt, severity: list[str] | None = SeverityOpt,
    config: str | None = ConfigOpt, isolated: bool = IsolatedOpt, format: Fmt = FormatOpt, output: str | None = OutputOpt,
    exit_zero: bool = ExitZeroOpt, statistics: bool = StatisticsOpt,
    debug: bool = DebugOpt, quiet: bool = QuietOpt, verbose: bool = VerboseOpt, color: Color = ColorOpt,
):
    """Check that an RL run resumes on the same data: sampler cursor vs replay buffer vs dataloader.
    Read-only unless --fix."""
    _logging(quiet, debug)
    from .commands import reconcile as flow
    if fix_output and not fix:
        raise UsageError("--fix-output only makes sense with --fix")
    if show_state:
        import json as _json
        _json.dump(flow.load(path, profile, map_ or [], steps).rs.to_json(), sys.stdout, indent=2, default=str)
        print()
        raise typer.Exit(0)
    c = Common(select, ignore, fail_on, severity, config, isolated, format, debug, quiet, verbose, color)
    eng = flow.run_and_fix(path, lambda: _engine("reconcile", path, c), profile=profile, maps=map_ or [],
                           steps=steps, simulate=simulate, fix_it=fix, fix_output=fix_output,
                           say=lambda line: quiet or print(f"ckptdoctor: {line}", file=sys.stderr))
    _finish(eng, format, output, exit_zero, statistics)


@app.command(rich_help_panel="Inspection")
def preflight(
    location: str | None = typer.Argument(None, help="Checkpoint directory or run root (path or fsspec URL); a "
                                   "{node} placeholder gives each node's node-local copy, e.g. "
                                   "/mnt/{node}/nvme/run7 or sftp://{node}/nvme/run7."),
    nodelist: str | None = typer.Option(None, "--nodelist", help="Slurm hostlist of the new allocation, "
                                           "e.g. gpu[001-004] [default: $SLURM_JOB_NODELIST, else $SLURM_NODELIST]."),
    ranks_per_node: str | None = typer.Option(None, "--ranks-per-node", help="Ranks per node, N or "
                                                 "Slurm's '4(x3),2' [default: $SLURM_NTASKS_PER_NODE / "
                                                 "$SLURM_TASKS_PER_NODE]; rank r runs on node r // N."),
    rank_map: str | None = typer.Option(None, "--rank-map", help="Explicit rank -> node map (JSON "
                                           "{\"0\": \"gpu001\"} or 'RANK NODE' lines) for non-block layouts."),
    local: bool = typer.Option(False, "--local", help="Prolog / first-step mode: check only this node's ranks "
                               "($SLURMD_NODENAME) in LOCATION, with stats only."),
    node: str | None = typer.Option(None, "--node", help="With --local: this node's name [default: "
                                       "$SLURMD_NODENAME, else the hostname]."),
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds the storage has to answer; past "
                                            "it, exit 75 (requeue held) instead of hanging [default: 8 with --local, "
                                            "below Slurm's 10 s MessageTimeout; else none]. 0: no deadline."),
    views: list[str] | None = typer.Option(None, "--views", help="Judge the whole allocation from every node's "
                                              "`preflight --local --format json` report (instead of LOCATION): a "
                                              "directory of them (*.json) or one file; repeatable."),
    mem_per_node: str | None = typer.Option(None, "--mem-per-node", help="Host memory per node for the "
                                               "budget (CKD410), e.g. 512G; 0 is all of each node's memory, as Slurm's --mem=0 [default: "
                                               "$SLURM_MEM_PER_NODE, scontrol RealMemory, or /proc/meminfo and cgroup "
                                               "with --local]."),
    allow_fresh: bool = typer.Option(False, "--allow-fresh", help="The job starts fresh: an empty or missing "
                                     "node-local run directory is not an error (CKD409)."),
    expect_step: int | None = typer.Option(None, "--expect-step", help="The step the job resumes from: a node "
                                              "whose own resume target differs is an error (CKD404)."),
    expect_tracker: str | None = typer.Option(None, "--expect-tracker", help="A copy of the tracker on durable "
                                                 "storage: its step is the job's (as --expect-step)."),
    contract: str | None = typer.Option(None, "--contract", help="Run root holding ckptdoctor.contract.json "
                                           "[default: LOCATION when it has one]; its rules (CKD51x) always run."),
    total_steps: int | None = typer.Option(None, "--total-steps", help="The total step count this relaunch "
                                              "uses, compared with the run contract (CKD514)."),
    read_plan: str | None = typer.Option(None, "--read-plan", help="Which ranks held each key at save time "
                                            "(ckptdoctor.read_plan/v1 JSON, or a manifest holding one; `ckptdoctor "
                                            "schema read-plan`) [default: the checkpoint manifest's]."),
    select: list[str] | None = SelectOpt, ignore: list[str] | None = IgnoreOpt,
    fail_on: Level | None = FailOnOpt, severity: list[str] | None = SeverityOpt,
    config: str | None = ConfigOpt, isolated: bool = IsolatedOpt, format: Fmt = FormatOpt, output: str | None = OutputOpt,
    exit_zero: bool = ExitZeroOpt, statistics: bool = StatisticsOpt,
    debug: bool = DebugOpt, quiet: bool = QuietOpt, verbose: bool = VerboseOpt, color: Color = ColorOpt,
):
    """Before a relaunch: can every rank of this allocation read what it will load?  Read-only."""
    _logging(quiet, debug)
    from .commands import preflight as flow
    if node and not local:
        raise UsageError("--node only makes sense with --local")
    c = Common(select, ignore, fail_on, severity, config, isolated, format, debug, quiet, verbose, color)
    if views:
        if location or local:
            raise UsageError("--views judges node reports: give no LOCATION and no --local")
        from .commands import views as vflow
        from .slurm.hostlist import HostlistError, expand
        eng = _engine("preflight", "allocation", c)
        nl = nodelist or os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
        try:
            vflow.judge(vflow.report_files(list(views)), eng, expand(nl) if nl else None)
        except HostlistError as exc:
            raise UsageError(f"--nodelist {nl!r}: {exc}") from None
        _finish(eng, format, output, exit_zero, statistics)
        return
    if not location:
        raise UsageError("preflight needs LOCATION (or --views REPORT...)")
    from .commands import contract as cflow
    from .commands.deadline import bounded
    expect = flow.expectation(expect_step, expect_tracker, location)
    plan = flow.read_plan(read_plan) if read_plan else None
    if contract and not os.path.lexists(os.path.join(contract, "ckptdoctor.contract.json")):
        raise InputError(f"--contract {contract}: no ckptdoctor.contract.json there")
    if timeout is not None and (timeout != timeout or timeout < 0 or timeout == float("inf")):
        raise UsageError(f"--timeout {timeout}: finite seconds >= 0 (0: no deadline)")

    def attempt():
        eng = _engine("preflight", location, c, {"ranks_per_node": ranks_per_node, "mem_per_node": mem_per_node})
        alloc = flow.allocation(nodelist, eng.opt("ranks_per_node"), rank_map)
        flow.run(location, eng, alloc, local=local, node=node, allow_fresh=allow_fresh, expect=expect,
                 read_plan=plan)
        root = contract or (location if "{node}" not in location and "://" not in location else None)
        if root and os.path.lexists(os.path.join(root, "ckptdoctor.contract.json")):
            cflow.evaluate(eng, cflow.subject(root, total_steps, quick_data=True))
        return eng
    limit = timeout if timeout is not None else (flow.LOCAL_TIMEOUT_S if local else None)
    eng = bounded(limit, attempt, "preflight")
    _finish(eng, format, output, exit_zero, statistics)


@app.command(rich_help_panel="Inspection")
def forensics(
    logs: list[str] = typer.Argument(..., metavar="LOG...", help="The failed job's logs: Slurm output files (one, "
                                     "or one per task), torchrun --log-dir files, plain or gzipped; read in "
                                     "bounded memory."),
    run_root: str | None = typer.Option(None, "--run-root", help="The run root (or a copy of it): verify the "
                                           "checkpoint the log names and link its findings to the failure."),
    select: list[str] | None = SelectOpt, ignore: list[str] | None = IgnoreOpt,
    fail_on: Level | None = FailOnOpt, severity: list[str] | None = SeverityOpt,
    config: str | None = ConfigOpt, isolated: bool = IsolatedOpt, format: Fmt = FormatOpt, output: str | None = OutputOpt,
    exit_zero: bool = ExitZeroOpt, statistics: bool = StatisticsOpt,
    debug: bool = DebugOpt, quiet: bool = QuietOpt, verbose: bool = VerboseOpt, color: Color = ColorOpt,
):
    """After a failed save or resume: the first checkpoint-related failure across ranks (rank, file,
    error, class), the ranks that only failed after it, and with --run-root the checkpoint's findings.
    Exit 0 when the cause was found (or none), 1 when the checkpoint is broken as well.  Read-only."""
    _logging(quiet, debug)
    from .commands import forensics as flow
    c = Common(select, ignore, fail_on, severity, config, isolated, format, debug, quiet, verbose, color)
    eng = _engine("forensics", logs[0], c)
    flow.run(list(logs), eng, run_root, lambda path: _engine("verify", path, c))
    _finish(eng, format, output, exit_zero, statistics)


# ---- the run contract ---------------------------------------------------------------------------
contract_app = typer.Typer(help="The run contract: code, data, recipe and length a run must keep across "
                                "resumes (ckptdoctor.contract.json in the run root).", no_args_is_help=True)
app.add_typer(contract_app, name="contract", rich_help_panel="Resume proofs")


@contract_app.command("init")
def contract_init(
    run_root: str = typer.Argument(..., help="The run root (directory of checkpoints)."),
    code: str | None = typer.Option(None, "--code", help="Code directory: git commit + uncommitted changes, "
                                       "or a tree hash outside git."),
    data: list[str] | None = typer.Option(None, "--data", help="Data file or directory (repeatable); each "
                                             "file's size and content hash."),
    recipe: list[str] | None = typer.Option(None, "--recipe", help="Recipe/config file (repeatable)."),
    total_steps: int | None = typer.Option(None, "--total-steps", help="The run's total step count."),
    format: Fmt = FormatOpt, output: str | None = OutputOpt,
    exit_zero: bool = ExitZeroOpt, statistics: bool = StatisticsOpt, debug: bool = DebugOpt, quiet: bool = QuietOpt,
):
    """Record the run contract's first phase; refuses if RUN_ROOT already has a contract."""
    _logging(quiet, debug)
    from . import contract as C
    from .commands import contract as cflow
    eng = _engine("contract", run_root, Common(None, None, None, None, None, True, format, debug, quiet))
    c = C.init(run_root, code, list(data or []), list(recipe or []), total_steps)
    cflow.written(eng, c, say=None if quiet else _say)
    _finish(eng, format, output, exit_zero, statistics)


@contract_app.command("check")
def contract_check(
    run_root: str = typer.Argument(..., help="The run root holding ckptdoctor.contract.json."),
    total_steps: int | None = typer.Option(None, "--total-steps", help="The total step count the relaunch "
                                              "uses; compared with the contract."),
    format: Fmt = FormatOpt, output: str | None = OutputOpt,
    exit_zero: bool = ExitZeroOpt, statistics: bool = StatisticsOpt, debug: bool = DebugOpt, quiet: bool = QuietOpt, verbose: bool = VerboseOpt,
    color: Color = ColorOpt,
):
    """Re-hash what the newest phase names; each changed, added or removed item is a finding (exit 1)."""
    _logging(quiet, debug)
    from .commands import contract as cflow
    c = Common(None, None, None, None, None, True, format, debug, quiet, verbose, color)
    eng = _engine("contract", run_root, c)
    cflow.check(run_root, eng, total_steps)
    _finish(eng, format, output, exit_zero, statistics)


@contract_app.command("new-phase")
def contract_new_phase(
    run_root: str = typer.Argument(..., help="The run root holding ckptdoctor.contract.json."),
    reason: str = typer.Option(..., "--reason", help="Why the contract changes (recorded with the phase)."),
    code: str | None = typer.Option(None, "--code", help="New code directory [default: the previous phase's]."),
    data: list[str] | None = typer.Option(None, "--data", help="New data paths [default: the previous phase's]."),
    recipe: list[str] | None = typer.Option(None, "--recipe", help="New recipe files [default: the previous "
                                               "phase's]."),
    total_steps: int | None = typer.Option(None, "--total-steps", help="New total step count [default: the "
                                              "previous phase's]."),
    format: Fmt = FormatOpt, output: str | None = OutputOpt,
    exit_zero: bool = ExitZeroOpt, statistics: bool = StatisticsOpt, debug: bool = DebugOpt, quiet: bool = QuietOpt,
):
    """Append a phase (what is on disk now, with its reason); earlier phases are never edited."""
    _logging(quiet, debug)
    from . import contract as C
    from .commands import contract as cflow
    eng = _engine("contract", run_root, Common(None, None, None, None, None, True, format, debug, quiet))
    c = C.new_phase(run_root, reason, code, list(data) if data else None, list(recipe) if recipe else None,
                    total_steps)
    cflow.written(eng, c, say=None if quiet else _say)
    _finish(eng, format, output, exit_zero, statistics)


# ---- resume digests -------------------------------------------------------------------------------
digests_app = typer.Typer(help="Per-rank state digests written by ckptdoctor.resume.record().",
                          no_args_is_help=True)
app.add_typer(digests_app, name="digests", rich_help_panel="Resume proofs")


@digests_app.command("diff")
def digests_diff(
    a: str = typer.Argument(..., help="A checkpoint with ckptdoctor.digests/ (or that directory)."),
    b: str = typer.Argument(..., help="Another one."),
    format: Fmt = FormatOpt, output: str | None = OutputOpt,
    exit_zero: bool = ExitZeroOpt, statistics: bool = StatisticsOpt, debug: bool = DebugOpt, quiet: bool = QuietOpt, verbose: bool = VerboseOpt,
    color: Color = ColorOpt,
):
    """Which items of which ranks differ between two digest sets (exit 1 when any does)."""
    _logging(quiet, debug)
    from .commands import digests as dflow
    c = Common(None, None, None, None, None, True, format, debug, quiet, verbose, color)
    eng = _engine("digests", b, c)
    dflow.diff(a, b, eng)
    _finish(eng, format, output, exit_zero, statistics)


@app.command(rich_help_panel="Reference")
def rules(
    rule: str | None = typer.Argument(None, autocompletion=_complete_rules,
                                         help="A rule id or name: print its full documentation."),
    format: Fmt = typer.Option(Fmt.text, "--format", "-f", help="Output format (text or json)."),
    quiet: bool = QuietOpt, debug: bool = DebugOpt,
):
    """List the rule catalog, or document one rule."""
    import json as _json
    _text_or_json(format, "rules")

    from .engine.catalog import catalog, lookup
    if rule:
        r = lookup(rule)
        if r is None:
            raise UsageError(f"no rule {rule!r} (see `ckptdoctor rules`)")
        if format is Fmt.json:
            _json.dump(r.__dict__, sys.stdout, indent=2)
            print()
            return
        print(f"{r.id} {r.name} [{r.severity}]  ({', '.join(r.subcommands)})\n")
        for title, body in (("What it checks", r.summary), ("Why it matters", r.why),
                            ("Example", r.example), ("How to fix", r.fix)):
            if body:
                print(f"{title}\n  {body}\n")
        if r.references:
            print("References\n  " + "\n  ".join(r.references))
        return
    rows = list(catalog().values())
    if format is Fmt.json:
        _json.dump([r.__dict__ for r in rows], sys.stdout, indent=2)
        print()
        return
    for r in rows:
        print(f"{r.id}  {r.name:<28} {r.severity:<8} {r.summary}")


@app.command(rich_help_panel="Reference")
def layouts(format: Fmt = typer.Option(Fmt.text, "--format", "-f", help="Output format (text or json)."),
           quiet: bool = QuietOpt, debug: bool = DebugOpt):
    """List the checkpoint families and their layouts (rules/layouts/<family>.yaml)."""
    import json as _json
    _text_or_json(format, "layouts")

    from .layouts.spec import layouts as all_layouts
    ls = list(all_layouts().values())
    if format is Fmt.json:
        _json.dump([{"name": l.name, "family": l.family, "title": l.title, "scope": l.scope,
                     "step_dirs": l.steps.format if l.steps else None,
                     "tracker": l.tracker.file if l.tracker else None, "resume": l.resume} for l in ls],
                   sys.stdout, indent=2)
        print()
        return
    for l in ls:
        print(f"{l.name:<22} {l.family:<15} {l.scope:<10} {l.title}")


class SchemaName(str, Enum):
    report = "report"
    run_state = "run-state"
    read_plan = "read-plan"


@app.command(rich_help_panel="Reference")
def schema(name: SchemaName = typer.Argument(..., help="report (what --format json prints), run-state "
                                              "(ckptdoctor.run_state/v1) or read-plan (ckptdoctor.read_plan/v1)."),
           format: Fmt = typer.Option(Fmt.json, "--format", "-f", help="Output format (json only)."),
           quiet: bool = QuietOpt, debug: bool = DebugOpt):
    """Print the JSON Schema of a report, of run_state/v1 or of read_plan/v1."""
    import json as _json

    from .report.schemas import SCHEMAS
    if format is not Fmt.json:
        raise UsageError("a JSON Schema is JSON: use --format json")
    emit(lambda: (_json.dump(SCHEMAS[name.value](), sys.stdout, indent=2), print()))


class ShellName(str, Enum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


@app.command(rich_help_panel="Reference")
def paths(format: Fmt = typer.Option(Fmt.text, "--format", "-f", help="Output format (text or json)."),
          activate: ShellName | None = typer.Option(None, "--activate", help="Print the line that enables "
                                                    "completion in this shell, to eval: eval \"$(ckptdoctor paths "
                                                    "--activate bash)\" (fish: ckptdoctor paths --activate fish | source)."),
          quiet: bool = QuietOpt, debug: bool = DebugOpt):
    """Where the man pages, shell completions and Slurm scripts are installed (for a Prolog or an
    admin copying them into place).  Exit 1 when any of them is missing."""
    import json as _json

    from .paths import activation, places
    _text_or_json(format, "paths")
    ps = places()
    if activate is not None:
        line = activation(activate.value)
        if line is None:
            raise InputError(f"the {activate.value} completion is not installed beside this ckptdoctor "
                             f"(`ckptdoctor paths` says where it was looked for)")
        print(line)
        return
    if format is Fmt.json:
        emit(lambda: _json.dump({p.what: {"path": p.path, "exists": p.exists} for p in ps}, sys.stdout, indent=2))
        print()
    else:
        labels = {"man": "man pages", "bash": "bash completion", "zsh": "zsh completion", "fish": "fish completion",
                  "slurm": "Slurm scripts"}
        for p in ps:
            print(f"{labels[p.what]:<16} {p.path}" + ("" if p.exists else "  (not found)"))
    if not all(p.exists for p in ps):
        print("ckptdoctor: some installed files are missing: reinstall the wheel into its own venv "
              "(python3 -m venv PREFIX && PREFIX/bin/pip install ckptdoctor-*.whl)", file=sys.stderr)
        raise typer.Exit(1)


@app.command(rich_help_panel="Reference")
def demo(directory: str | None = typer.Argument(None, help="Where to write the demo run "
                                                   "[default: a new temporary directory]."),
         format: Fmt = FormatOpt, quiet: bool = QuietOpt, debug: bool = DebugOpt):
    """Write a small realistic run with injected faults and run the doctor on it (DIR must be new,
    empty, or an earlier demo)."""
    from .demo import run_demo
    if format is not Fmt.text:
        raise UsageError("demo prints several reports, one per scene, as text; run a scene's own "
                         "command with --format json for a JSON report")
    raise typer.Exit(run_demo(directory, format.value))


def _version_callback(value: bool):
    if value:
        print(f"ckptdoctor {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", help="Print the version and exit.",
                                       callback=_version_callback, is_eager=True)):
    """ckptdoctor: checkpoint doctor and publisher for large training runs."""


def _say(line: str) -> None:
    """One line on stderr, whatever the message holds (a path with a newline stays one line)."""
    print(line.replace("\r", "\\r").replace("\n", "\\n"), file=sys.stderr)


def _quiet_stdout() -> None:
    """Point fd 1 at /dev/null, so the interpreter's own flush at exit of what could not be
    written succeeds silently (no 'Exception ignored' second message)."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.close(fd)
    except OSError:
        pass


def _os_error(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        where = exc.filename if exc.filename is not None else ""
        where = where.decode("utf-8", "backslashreplace") if isinstance(where, bytes) else str(where)
        where = where.encode("utf-8", "backslashreplace").decode("utf-8")
        return f"{where + ': ' if where else ''}{exc.strerror or exc}"
    return f"a name that cannot be encoded ({exc})"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--version"]:  # fast path: no typer/rich import for scripts that probe the version
        print(f"ckptdoctor {__version__}")
        sys.exit(0)
    debug = "--debug" in args
    # One short-lived run that builds millions of small acyclic records (a large `.metadata`):
    # the cyclic collector's passes over them cost more than the parse itself, and nothing here
    # relies on it.  Reference counting still frees everything; the library API leaves GC alone.
    gc.disable()
    if os.environ.get("_CKPTDOCTOR_COMPLETE"):  # TAB completion from completions/* scripts
        from typer._completion_classes import completion_init
        completion_init()
    try:
        from . import fastcli
        call = None if os.environ.get("_CKPTDOCTOR_COMPLETE") else fastcli.parse(args, app)
        if call is not None:  # an everyday invocation: parsed without importing typer/click
            call.fn(**call.kwargs)
            sys.exit(0)
        fastcli.run_typer(app, args)
    except SystemExit:
        raise
    except CkptDoctorError as exc:
        _say(f"ckptdoctor: {exc}")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        raise typer.interrupted() from None
    except (OSError, UnicodeError) as exc:   # a path the user gave (a symlink loop, a name that is not
        _say(f"ckptdoctor: {_os_error(exc)}")   # UTF-8, a directory gone): an input error, one line
        sys.exit(2)
    except Exception as exc:  # never a raw traceback
        if debug:
            import traceback
            traceback.print_exc()
        _say(f"ckptdoctor: internal error: {type(exc).__name__}: {exc} (rerun with --debug)")
        sys.exit(EXIT_INTERNAL)
