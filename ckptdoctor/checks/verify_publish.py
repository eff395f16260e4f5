"""Traces of `ckptdoctor publish` that verify must understand: uncommitted uploads, leftovers."""
from __future__ import annotations

from ..engine.finding import Hit
from ..engine.registry import check
from ..layouts import manifest as mf
from ..layouts.model import age_seconds
from ..publishing import naming


@check("CKD201", "checkpoint")
def publish_uncommitted(ck, eng):
    files = set(ck.files)
    marker = naming.in_progress_object()
    if marker in files and mf.NAME not in files:
        yield Hit(ck.display, f"{marker} present and no {mf.NAME}: a publish to this location never "
                  f"committed (killed or failed mid-upload)", details={"marker": marker},
                  hint="re-run the same `ckptdoctor publish`; do not resume from this checkpoint")


@check("CKD202", "run")
def publish_leftover(run, eng):
    for e in run.entries.values():   # the run root's one listing (again: one more LIST on an object store)
        own = naming.parse_own(e.name)
        if own and e.is_dir:
            age = age_seconds(e.mtime)
            yield Hit(run.storage.show(e.name), f"leftover {own['kind']} directory of an interrupted publish "
                      f"of {own['name']} (host {own['host']}, pid {own['pid']})",
                      details={"checkpoint": own["name"], "host": own["host"], "pid": int(own["pid"]),
                               "age_seconds": round(age, 1) if age is not None else None},
                      hint="re-run the publish (it cleans its own leftovers) or delete it once that "
                           "process is gone")
            continue
        parts = naming.parse_parts(e.name)
        if parts and e.is_dir:
            from ..publishing.parts import staging_age
            age = staging_age(run.storage.abspath(e.name)) if run.storage.local else age_seconds(e.mtime)
            if age is not None and age < float(naming.config()["parts_stale_seconds"]):
                continue  # a part publish in progress (a part touched it recently): not a leftover yet
            yield Hit(run.storage.show(e.name), f"leftover staging of a part publish of {parts['name']} "
                      f"(publish id {parts['id']}) that never committed",
                      details={"checkpoint": parts["name"], "publish_id": parts["id"],
                               "age_seconds": round(age, 1) if age is not None else None},
                      hint="re-run the missing parts with the same --publish-id to finish it, or delete it; "
                           "a new part publish of that name removes it once stale")
