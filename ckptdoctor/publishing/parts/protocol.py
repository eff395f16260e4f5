"""One part's run: copy, record, then elect and commit or wait (the protocol in __init__'s
docstring); the same steps serve publish --part and publish_distributed."""
from __future__ import annotations

import os
import threading
import time

from ...io import hashing
from ...io.fs import read_regular
from ...layouts import manifest as mf
from .. import faults, naming
from ..copier import SourceChanged, copy_workers, gather, list_tree, snapshot, snapshot_diff, source_tree
from .local import LocalParts
from .records import FileRecord, PartRecord, PartRefused, PartResult, PartSpec, PartTaken, PartTimeout, \
    merge_records

POLL_SECONDS = 0.2


def run_part(src: str, dest_root: str, name: str, spec: PartSpec, *, verify, tracker: str, keep_last, keep_every,
             workers, progress_factory, timeout: float, after_commit_fn, stage: "LocalParts") -> PartResult:
    """One node's part: copy, record, then elect/commit or wait.  `verify(path) -> (layout, reasons)`
    is the structural verify of the assembled tree (its family and error reasons; none = fine).
    Raises PartRefused (PartTaken), PartTimeout or UsageError; touches the tracker only when this part
    committed or when it finds the checkpoint committed by a part that died before its after-commit."""
    t0 = time.monotonic()
    st = stage
    res = PartResult(spec.index, spec.count, spec.publish_id, dest_root, name)
    if begin(st, res):
        return _late(st, res, t0, "already committed", after_commit_fn, tracker, keep_last, keep_every)
    try:
        _copy_part(st, src, spec, name, res, workers, progress_factory)
        faults.point("part-record")
        return _finish(st, res, spec, name, verify, tracker, keep_last, keep_every, t0 + timeout, t0,
                       after_commit_fn)
    finally:
        st.close()


def begin(st: LocalParts, res: PartResult) -> bool:
    """Open this part's stage; True when DEST_ROOT/<name> is already committed under this ID."""
    done = st.committed_id()
    if done == st.spec.publish_id:
        return True
    if done is not None:
        raise PartTaken(f"{st.final} exists (not from publish id {st.spec.publish_id}); refusing to overwrite a "
                        f"published checkpoint; this publish can never commit (use --name to publish under "
                        f"another name)")
    res.cleaned = st.clean_stale(float(naming.config()["parts_stale_seconds"]), res.notes)
    st.open()
    # a re-run replaces its earlier record, never reuses it: withdrawn before copying, so no part
    # commits this part's files while its source is being read again (they may have changed)
    st.withdraw_record()
    if st.failed() is not None:
        st.clear_failure()  # a re-run after a refused commit starts the judgement again (recorded conflicts stay)
    return False


def copy_part(st: LocalParts, src: str, res: PartResult, workers=None, progress_factory=None) -> None:
    """This node's files into the stage and its record written (no election: publish_distributed
    uses the process group as the barrier and global rank 0 commits)."""
    from ...report.progress import Progress
    _copy_part(st, src, st.spec, st.name, res, workers,
               progress_factory or (lambda total, label: Progress(total, label, enabled=False)))
    faults.point("part-record")


def commit_all(st: LocalParts, res: PartResult, verify, after_commit_fn, tracker, keep_last, keep_every) -> None:
    """Commit once every record is in (the caller knows it is); then after-commit and cleanup."""
    missing = sorted(set(range(st.spec.count)) - st.record_count())
    if missing:
        raise PartRefused(f"{st.dir}: no record from parts {missing[:8]}; nothing committed")
    _commit(st, res, st.spec, st.name, verify)
    res.status, res.committer = "committed", st.spec.index
    try:
        after_commit_fn(res, tracker, keep_last, keep_every)
    finally:
        st.remove()


def _copy_part(st: LocalParts, src: str, spec: PartSpec, name: str, res: PartResult, workers, progress_factory):
    tree = source_tree(src)
    before = snapshot(src, tree)
    _, files = list_tree(src, tree)
    files.pop(mf.NAME, None)  # the merged manifest is computed from every node's bytes
    res.files, res.bytes = len(files), sum(files.values())
    journal = st.journal()
    _unplace_gone(st, journal, files)
    todo = []
    recs: dict[str, FileRecord] = {}
    for rel in sorted(files, key=lambda r: -files[r]):
        j = journal.get(rel)
        mt = before[rel][1] if rel in before else 0
        if j and j.size == files[rel] and j.mtime_ns == mt and st.staged_size(rel) == j.size:
            recs[rel] = j
            res.resumed += 1
        else:
            todo.append(rel)
    conflicts: list[dict] = []
    lock = threading.Lock()
    prog = progress_factory(sum(files[r] for r in todo), f"publishing part {spec.index}/{spec.count} of {name}")

    def one(rel: str) -> None:
        c, wrote = st.put(os.path.join(src, rel), rel, prog)
        rec = FileRecord(c.size, c.digests, before[rel][1], wrote)
        if not wrote:
            there = st.staged_digests(rel)
            if (there.size, there.digests) != (c.size, c.digests):
                by = _writer_of(st, rel)
                with lock:
                    conflicts.append({"rel": rel, "detail": f"holds different bytes from the copy {by} placed "
                                      f"({c.size} vs {there.size} bytes)"})
        st.journal_add(rel, rec)
        with lock:
            recs[rel] = rec
            if wrote:
                res.copied += 1
            else:
                res.compared += 1
        if wrote:
            faults.point("copy")

    try:
        n = copy_workers(workers, len(todo))
        if n <= 1 or len(todo) <= 1:
            for rel in todo:
                one(rel)
        else:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(max_workers=n, thread_name_prefix="ckd-part") as ex:
                gather({rel: ex.submit(one, rel) for rel in todo})
    finally:
        prog.close()
    changed = snapshot_diff(before, snapshot(src))
    if changed:
        raise SourceChanged(f"source changed while publishing: {changed}")
    faults.point("copied")
    if conflicts:
        # recorded where no later write of any record can drop it (one file per sighting), then every
        # part is told: this publish id can never commit
        st.record_conflicts(conflicts)
        msg = (f"{st.dir}: conflicting copies, nothing committed: "
               + "; ".join(f"{c['rel']}: part {spec.index} ({naming.HOST}) {c['detail']}" for c in conflicts[:4])
               + (f" (+{len(conflicts) - 4} more)" if len(conflicts) > 4 else "")
               + "; settle which node's copy is right, then publish again with a new --publish-id")
        st.fail(msg)
        raise PartRefused(msg)
    plan = _check_save_time_manifest(src, recs)
    st.write_record(PartRecord(spec.index, spec.count, spec.publish_id, name, naming.HOST, src, recs, conflicts,
                               plan))


def _writer_of(st: LocalParts, rel: str) -> str:
    """Who placed <rel>: its writer journals it just after placing it, so a comparer that got there
    first waits for that line a little (the message then names both nodes)."""
    for _ in range(10):
        by = st.writer_of(rel)
        if by:
            return by
        time.sleep(POLL_SECONDS)
    return "another part"


def _unplace_gone(st: LocalParts, journal: dict[str, FileRecord], files: dict[str, int]) -> None:
    """A file an earlier run of this part placed that its source no longer holds is taken out of
    the staging (unless another part's record holds it): the commit publishes what the sources
    hold now, and an unrecorded leftover would refuse it."""
    gone = [rel for rel, j in journal.items() if j.wrote and rel not in files]
    if not gone:
        return
    held = set()
    for k, data in st.records().items():
        if k != st.spec.index:
            try:
                held |= set(PartRecord.from_bytes(data, f"part {k}").files)
            except PartRefused:
                continue
    for rel in gone:
        if rel not in held:
            st.unplace(rel)


def _check_save_time_manifest(src: str, recs: dict[str, FileRecord]) -> dict | None:
    """A manifest written while saving (ManifestWriter on the coordinator's node) lists every
    rank's files; each file this node holds must still have the bytes it had at save time.
    Returns its read plan (which ranks held each key), for the merged manifest to keep."""
    path = os.path.join(src, mf.NAME)
    if not os.path.exists(path):
        return None
    try:
        raw = read_regular(path, mf.MAX_MANIFEST_BYTES)
        want = mf.parse(raw, mf.NAME)
    except (mf.ManifestError, ValueError, OSError):
        return None  # verify reports a corrupt manifest (CKD154); the merged manifest is computed afresh
    plan = mf.read_plan_of(raw)
    for rel, e in want.items():
        r = recs.get(rel)
        if r is None or e.chunk_bytes != hashing.CHUNK_BYTES:
            continue  # held by another node (or another chunking): judged there
        if r.size != e.size or r.digests != e.digests:
            raise SourceChanged(f"{os.path.join(src, rel)}: this node's bytes differ from the {mf.NAME} written "
                                f"at save time (corrupted on local disk since the save); nothing committed")
    return plan


def _finish(st, res, spec, name, verify, tracker, keep_last, keep_every, deadline, t0,
            after_commit_fn) -> PartResult:
    while True:
        done = st.committed_id()
        if done == spec.publish_id:
            _committed_elsewhere(st, res, deadline, after_commit_fn, tracker, keep_last, keep_every)
            res.seconds = time.monotonic() - t0
            return res
        if done is not None:
            raise PartTaken(f"{st.final} was committed by {'publish id ' + repr(done) if done else 'another publish'} "
                            f"while part {spec.index} of publish id {spec.publish_id} waited; nothing of this "
                            f"publish was committed and it can never be (do not requeue; publish under another "
                            f"--name)")
        msg = st.failed()
        if msg is not None:
            raise PartRefused(msg)
        have = st.record_count()
        if have >= set(range(spec.count)):
            faults.point("elect")
            if st.elect():
                if st.committed_id() == spec.publish_id:
                    # the claim won was a dead committer's whose rename landed after this part's look
                    # above (a waiting part met it in CI): committed, only its after-commit is left
                    res.status, res.committer = "part-done", st.committed_by
                    _after_dead_committer(st, res, "ended", after_commit_fn, tracker, keep_last, keep_every)
                else:
                    commit_all(st, res, verify, after_commit_fn, tracker, keep_last, keep_every)
                res.seconds = time.monotonic() - t0
                return res
        if time.monotonic() > deadline:
            missing = sorted(set(range(spec.count)) - have)
            what = (f"parts {', '.join(map(str, missing[:8]))}{' ...' if len(missing) > 8 else ''} never arrived"
                    if missing else f"part {st.committer()} was committing and did not finish")
            raise PartTimeout(f"{st.dir}: {what} within --timeout; nothing committed, tracker untouched "
                              f"(re-run the missing parts with the same --publish-id; this part's files stay "
                              f"staged and are not copied again)")
        time.sleep(POLL_SECONDS)


def _committed_elsewhere(st: LocalParts, res: PartResult, deadline: float, after_commit_fn, tracker, keep_last,
                         keep_every) -> None:
    """Another part committed under this ID.  Its after-commit (tracker, retention) ends with the
    staging removed; a committer that died in between (after its rename) would leave the checkpoint
    committed and the tracker behind, so this part finishes the after-commit itself: idempotent,
    under the destination's lock, and a tracker never moves backwards."""
    res.status, res.committer = "part-done", st.committed_by
    while st.after_commit_pending():
        gone = st.committer_gone()
        if gone or time.monotonic() > deadline:
            _after_dead_committer(st, res, "ended" if gone else "did not finish", after_commit_fn, tracker,
                                  keep_last, keep_every)
            return
        time.sleep(POLL_SECONDS)


def _after_dead_committer(st: LocalParts, res: PartResult, how: str, after_commit_fn, tracker, keep_last,
                          keep_every) -> None:
    who = f"part {res.committer}" if res.committer is not None else "the committer"
    res.notes.append(f"{st.final}: {who} {how} before its after-commit; part {st.spec.index} wrote the tracker "
                     f"and applied retention")
    after_commit_fn(res, tracker, keep_last, keep_every)
    st.remove()


def _commit(st: LocalParts, res: PartResult, spec: PartSpec, name: str, verify) -> None:
    try:
        recs = {}
        for k, data in st.records().items():
            r = PartRecord.from_bytes(data, os.path.join(st.dir, "parts", f"{k}.json"))
            if (r.parts, r.publish_id, r.name) != (spec.count, spec.publish_id, name):
                raise PartRefused(f"part {k} ({r.host}) was run as part of {r.parts} for {r.name!r}, id "
                                  f"{r.publish_id!r}; every part must agree (here {spec.count}, {name!r})")
            recs[k] = r
        merged = merge_records(recs, st.dir, st.conflicts())
        listed = st.listing()
        extra = sorted(set(listed) - set(merged))
        short = sorted(r for r in merged if listed.get(r) != merged[r].size)
        if extra or short:
            raise PartRefused(f"{st.tree}: the assembled tree differs from the part records "
                              f"({'unrecorded ' + ', '.join(extra[:3]) if extra else ''}"
                              f"{'; ' if extra and short else ''}"
                              f"{'missing or wrong size ' + ', '.join(short[:3]) if short else ''}); nothing committed")
        st.before_verify()  # object stores: the framework's markers go up after every data object (marker last)
        layout_name, reasons = verify(st.tree)
        if reasons:
            raise PartRefused(f"{name}: the checkpoint assembled from {spec.count} parts fails verification: "
                              + "; ".join(reasons[:4]) + "; nothing committed, tracker untouched")
        from ..flow import _manifest
        plan = next((r.read_plan for _, r in sorted(recs.items()) if r.read_plan is not None), None)
        st.seal_and_rename(_manifest(merged, layout_name, hashing.CHUNK_BYTES, extra={
            "publish_id": spec.publish_id, "parts": {str(k): r.host for k, r in sorted(recs.items())},
            "committed_by": spec.index, **({"read_plan": plan} if plan is not None else {})}))
        res.files, res.bytes = len(merged), sum(f.size for f in merged.values())
    except PartTaken:
        raise  # the other publish id's checkpoint stands; every waiting part finds it for itself
    except PartRefused as exc:
        st.fail(str(exc))
        raise
    except (KeyboardInterrupt, SystemExit):
        if not os.path.lexists(st.final) or st.committed_id() != spec.publish_id:
            try:
                os.unlink(os.path.join(st.dir, "commit"))  # let a re-run commit
            except FileNotFoundError:
                pass
        raise


def _late(st, res, t0, how, after_commit_fn, tracker, keep_last, keep_every) -> PartResult:
    """DEST_ROOT/<name> is committed under this ID: finish the after-commit (idempotent: a tracker
    never moves backwards) in case the committer died before it, clear the staging."""
    res.status = "already-committed"
    res.notes.append(f"{st.final} is {how} under publish id {st.spec.publish_id}; nothing copied")
    after_commit_fn(res, tracker, keep_last, keep_every)
    if os.path.isdir(st.dir):
        st.remove()
    res.seconds = time.monotonic() - t0
    return res
