"""The `verify --deep` rules (CKD130-132).  The scan itself is in deep_scan.py, imported only when
`--deep` asks for it: its imports (numpy, a thread pool, the archive readers) and record types
cost start-up that a structural verify does not need (issue 20)."""
from __future__ import annotations

from ..engine.finding import Hit
from ..engine.registry import check


def scan(ck, eng):
    if not eng.opt("deep"):
        return None
    from .deep_scan import scan as run
    return run(ck, eng)


# ---- the rules -----------------------------------------------------------------------------------
@check("CKD130", "checkpoint", option="deep")
def nonfinite_values(ck, eng):
    res = scan(ck, eng)
    for d in (res.nonfinite if res else []):
        yield Hit(ck.path(d["file"]), f"{d['file']}: tensor {d['tensor']} ({d['dtype']}) holds {d['nan']} NaN and "
                                      f"{d['inf']} Inf value(s)" + (f"; the first at {d['first']}" if d.get("first")
                                                                    else ""), details=d,
                  hint="a run resumed from this checkpoint diverges; resume from an earlier one")


@check("CKD131", "checkpoint", option="deep")
def zero_filled_tail(ck, eng):
    res = scan(ck, eng)
    for d in (res.zero_tails if res else []):
        yield Hit(ck.path(d["file"]), f"{d['file']}: bytes {d['start']}-{d['end']} are all zero to the end of the "
                                      f"file, inside tensor {d['tensor']}, which is non-zero before them",
                  details=d, hint="the signature of a crash before delayed allocation reached the disk (size and "
                                  "header intact); check against a manifest, or resume from an earlier checkpoint")


@check("CKD132", "checkpoint", option="deep")
def record_crc_mismatch(ck, eng):
    res = scan(ck, eng)
    for d in (res.bad_crc if res else []):
        yield Hit(ck.path(d["file"]), f"{d['file']}: record {d['record']} (bytes {d['start']}-{d['end']}) has "
                                      f"CRC-32 {d['actual']}, its archive recorded {d['expected']}", details=d,
                  hint="the bytes changed after torch.save wrote them (bit rot, a partial overwrite); "
                       "torch.load does not check this: restore the file from a good copy")
    for d in (res.unreadable if res else []):
        yield Hit(ck.path(d["file"]), f"{d['file']}: {d['record']}: archive directory unreadable: {d['why']}",
                  details=d, hint="torch.load cannot open this archive; restore the file from a good copy")
