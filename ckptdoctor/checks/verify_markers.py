"""Commit markers and in-flight commit leftovers inside one checkpoint directory."""
from ..engine.finding import Hit
from ..engine.registry import check


@check("CKD101", "checkpoint")
def marker_missing(ck, eng):
    groups = ck.layout.markers
    if ck.storage.local and ck.layout.extra.get("local_markers"):  # the family says a rename commits here
        groups = tuple(tuple(g) for g in ck.layout.extra["local_markers"])
    for group in groups:
        if not [e for e in ck.matching(group) if e.is_file]:  # a FIFO named .metadata commits nothing
            yield Hit(ck.display, f"commit marker {' or '.join(group)} is missing: the save never "
                                  f"committed ({ck.layout.title})",
                      details={"expected": list(group), "layout": ck.layout.name},
                      hint="do not resume from this checkpoint")
    sharded = ck.layout.extra.get("sharded_dirs")
    if sharded:  # checkpoints saved as a directory inside this one (Lightning's sharded <name>.ckpt/)
        for e in ck.matching(tuple(sharded["names"])):
            if not e.is_dir:
                continue
            try:
                inside = {x.name for x in ck.storage.listdir(ck.relpath(e.name)) if x.is_file}
            except OSError:
                continue
            for group in sharded["markers"]:
                if not inside & set(group):
                    yield Hit(ck.path(e.name), f"{e.name}/{' or '.join(group)} is missing: the sharded save "
                              f"never committed ({sharded['why']})",
                              details={"expected": list(group), "checkpoint": e.name},
                              hint="do not resume from this checkpoint")


@check("CKD102", "checkpoint")
def commit_interrupted(ck, eng):
    for e in ck.matching(ck.layout.temp):
        yield Hit(ck.path(e.name), f"leftover {e.name}: the save crashed while committing",
                  details={"file": e.name, "bytes": e.size},
                  hint="the marker was never renamed into place; treat the checkpoint as incomplete")
