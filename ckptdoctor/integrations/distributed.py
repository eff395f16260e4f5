"""publish_distributed: the part publish (publishing/parts/) from inside a torch.distributed job.

Every rank calls it after the local save.  Ranks are grouped into nodes (by host name, or `node=`);
the lowest rank of each node copies its node's directory into the shared stage and writes the
node's record; an all-gather is the barrier; global rank 0 (always the copier of its node) commits
-- verify of the assembled tree, merged manifest, rename or manifest-create, tracker -- and
broadcasts the outcome, so every rank returns the same result or raises the same error.  Nothing is
committed unless every node's copy succeeded.
"""
from __future__ import annotations

import os
import socket
import time
import uuid


def publish_distributed(local_dir: str, dest_root: str, *, name: str | None = None, group=None,
                        publish_id: str | None = None, node: str | None = None, tracker: str = "auto",
                        force: bool = False, keep_last: int | None = None, keep_every: int | None = None,
                        workers: int | None = None):
    """Publish the checkpoint every node saved under `local_dir` (node-local disk) as one checkpoint
    DEST_ROOT/<name>; call on every rank of `group`.  Returns the PartResult (status "committed" on
    rank 0's node copier, "part-done" elsewhere); raises PartRefused on every rank when nothing was
    committed (a node failed to copy, copies conflict, or verify refused the assembled tree)."""
    import torch.distributed as dist
    from ..api import make_engine
    from ..commands.publish import part_job
    from ..engine.errors import CkptDoctorError
    from ..publishing import parts

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    me = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    seen: list = [None] * world
    dist.all_gather_object(seen, me, group=group)
    nodes = list(dict.fromkeys(seen))           # node order = order of their lowest rank
    k, n = nodes.index(me), len(nodes)
    copier = seen.index(me) == rank
    box = [publish_id or uuid.uuid4().hex[:16]]
    dist.broadcast_object_list(box, src=_global(group, 0), group=group)
    spec = parts.PartSpec(k, n, box[0])
    t0 = time.monotonic()

    outcome = None                              # (error message | None) of this node's copy
    res = None
    job = None
    if copier:
        try:
            eng = make_engine("publish", local_dir)
            job = part_job(local_dir, dest_root, eng, spec, name=name, force=force, tracker=tracker,
                           keep_last=keep_last, keep_every=keep_every)
            res = parts.PartResult(k, n, spec.publish_id, dest_root, job.name)
            if parts.begin(job.stage, res):
                outcome = "already"
            else:
                try:
                    parts.copy_part(job.stage, job.src, res, workers)
                finally:
                    job.stage.close()
        except (CkptDoctorError, OSError) as exc:
            outcome = f"node {me} (rank {rank}): {exc}"
    everyone: list = [None] * world
    dist.all_gather_object(everyone, outcome, group=group)   # the barrier: every node's copy is done
    errors = [e for e in everyone if e and e != "already"]
    verdict = [None]
    if rank == 0 and not errors:
        try:
            if outcome == "already":
                res.status = "already-committed"
            else:
                parts.commit_all(job.stage, res, job.verify, job.after, tracker, keep_last, keep_every)
            verdict[0] = ("ok", res.committer, res.tracker)
        except (CkptDoctorError, OSError) as exc:
            verdict[0] = ("refused", str(exc), None)
    elif rank == 0:
        verdict[0] = ("refused", "nothing committed: " + "; ".join(errors[:4]), None)
    dist.broadcast_object_list(verdict, src=_global(group, 0), group=group)
    status, info, tracker_info = verdict[0]
    if status != "ok":
        raise parts.PartRefused(info)
    if res is None:
        res = parts.PartResult(k, n, spec.publish_id, dest_root, name or os.path.basename(local_dir.rstrip("/")))
    if rank != 0:
        res.status, res.committer, res.tracker = "part-done" if copier else "not-a-copier", info, tracker_info
    res.seconds = time.monotonic() - t0
    return res


def _global(group, group_rank: int) -> int:
    import torch.distributed as dist
    if group is None:
        return group_rank
    return dist.get_global_rank(group, group_rank)
