"""`ckptdoctor manifest PATH`: hash an existing checkpoint and write its manifest (new file only)."""
from __future__ import annotations

import os

from .. import __version__
from ..engine.errors import InputError, UsageError
from ..io import atomic, hashing
from ..io.fs import TreeLimit, open_location, walk_files
from ..layouts import manifest as mf
from ..report.progress import Progress
from ..layouts.locate import locate


def write_manifest(path: str, *, workers: int | None = None, quiet: bool = False, force: bool = False,
                   replace: bool = False, chunk_bytes: int = hashing.CHUNK_BYTES) -> tuple[str, int, int]:
    """Hash a checkpoint and write its manifest.  A checkpoint that fails structural verify is
    refused unless `force` (a manifest would certify broken bytes); an existing manifest is kept
    unless `replace` (then rewritten atomically)."""
    st = open_location(path)
    if not st.local:
        raise UsageError(f"{path}: writing manifests to object stores is done by `ckptdoctor publish`")
    ck = locate(st).checkpoint
    if ck is None:
        raise UsageError(f"{path}: not a checkpoint directory (give one checkpoint, not a run root)")
    target = os.path.join(st.abspath(""), mf.NAME)
    if os.path.exists(target) and not replace:
        raise UsageError(f"{target}: already exists; pass --replace to rewrite it from the bytes on disk")
    if not force:
        from ..api import make_engine
        from .verify import check_checkpoint
        eng = make_engine("verify", path, ignore=["CKD15"])  # structure only: the manifest is being made
        status = check_checkpoint(eng, ck)
        if not status.complete:
            errs = [f"{f.rule} {f.message}" for f in eng.report.findings if f.severity == "error"]
            raise UsageError(f"{path}: fails verification ({'; '.join(errs[:2])}); a manifest would certify "
                             f"broken bytes; fix it, or pass --force")
    try:
        files = {rel: size for rel, size in walk_files(st).items() if rel != mf.NAME}
    except TreeLimit as exc:
        raise InputError(str(exc)) from None
    units = [u for rel, size in files.items() for u in hashing.units_for(rel, size, chunk=chunk_bytes)]
    total = sum(files.values())
    prog = Progress(total, f"hashing {ck.name}", enabled=not quiet)
    digests = hashing.hash_units(st, units, workers, prog)
    prog.close()
    for u, (_, nread) in digests.items():
        if nread != u.length:
            raise InputError(f"{st.show(u.rel)}: file changed while hashing; nothing written")
    data = mf.build(files, {(u.rel, u.index): d for u, (d, _) in digests.items()}, chunk_bytes=chunk_bytes,
                    layout=ck.layout.name, tool=f"ckptdoctor {__version__}", nodes=mf.writer_nodes())
    try:
        if replace:
            atomic.replace_file(target, data)
        else:
            atomic.write_new(target, data)
    except FileExistsError:
        raise UsageError(f"{target}: appeared while hashing; refusing to replace it") from None
    except PermissionError:
        raise InputError(f"{target}: permission denied") from None
    return target, len(files), total
