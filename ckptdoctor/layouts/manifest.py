"""The checkpoint manifest: `ckptdoctor.manifest.json` inside each checkpoint directory.

    {"schema": "ckptdoctor.manifest/v1", "algorithm": "xxh3-128", "chunk_bytes": 67108864,
     "tool": "ckptdoctor 0.1.0", "created": "2026-11-29T10:00:00Z", "layout": "dcp",
     "files": {"__0_0.distcp": {"size": 1577, "xxh3_128": "<32 hex>"},
               "big.bin": {"size": 134217728, "chunks": ["<32 hex>", "<32 hex>"]}},
     "nodes": ["gpu001", "gpu002"]}          # optional: the Slurm nodes of the writing job

Paths are relative, '/'-separated; the manifest does not list itself.  A file larger than
chunk_bytes has one digest per chunk_bytes range, so ranges can be hashed (and sliced across
nodes) in parallel; each chunk digest is the plain xxh3-128 of that byte range.
"""
from __future__ import annotations

import json
import re
from ..values import value

NAME = "ckptdoctor.manifest.json"
SCHEMA = "ckptdoctor.manifest/v1"
INTEGRITY = "integrity.json"  # Megatron-LM --verify-integrity: {"algorithm": "sha256", "files": {...}}
MAX_MANIFEST_BYTES = 256 << 20
HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")


class ManifestError(ValueError):
    pass


@value
class Expected:
    size: int | None
    digests: list[str]  # one per chunk (or one for the whole file)
    algorithm: str
    chunk_bytes: int


def parse(data: bytes, source: str) -> dict[str, Expected]:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), dict):
        raise ManifestError("no 'files' table")
    out: dict[str, Expected] = {}
    if source == INTEGRITY:
        if doc.get("algorithm", "sha256") != "sha256":
            raise ManifestError(f"unsupported algorithm {doc.get('algorithm')!r}")
        for name, hexd in doc["files"].items():
            if not isinstance(name, str) or not isinstance(hexd, str) or not HEX64.match(hexd):
                raise ManifestError(f"bad entry for {name!r:.60}")
            out[name] = Expected(None, [hexd], "sha256", 0)
        return out
    if doc.get("schema") != SCHEMA:
        raise ManifestError(f"unknown schema {doc.get('schema')!r:.40} (expected {SCHEMA})")
    if doc.get("algorithm") != "xxh3-128":
        raise ManifestError(f"unsupported algorithm {doc.get('algorithm')!r:.40}")
    chunk = doc.get("chunk_bytes")
    if not isinstance(chunk, int) or chunk <= 0:
        raise ManifestError("chunk_bytes must be a positive integer")
    for name, ent in doc["files"].items():
        if not isinstance(name, str) or not name or name.startswith("/") or ".." in name.split("/"):
            raise ManifestError(f"bad file name {name!r:.60}")
        if not isinstance(ent, dict) or not isinstance(ent.get("size"), int) or ent["size"] < 0:
            raise ManifestError(f"bad entry for {name!r:.60}")
        digs = ent.get("chunks") if "chunks" in ent else [ent.get("xxh3_128")]
        if not isinstance(digs, list) or not all(isinstance(d, str) and HEX32.match(d) for d in digs):
            raise ManifestError(f"bad digest for {name!r:.60}")
        want_chunks = max(1, -(-ent["size"] // chunk))
        if len(digs) != want_chunks:
            raise ManifestError(f"{name!r:.60}: {len(digs)} chunk digests for {ent['size']} bytes")
        out[name] = Expected(ent["size"], digs, "xxh3-128", chunk)
    return out


def read_plan_of(raw: bytes) -> dict | None:
    """The manifest's `read_plan` (ckptdoctor.read_plan/v1, written by ManifestWriter), validated, or
    None: a publish carries it into the manifest it writes, so preflight of the published copy is exact."""
    from ..preflight.readsets import ReadPlanError, parse_read_plan
    try:
        doc = json.loads(raw).get("read_plan")
        if doc is not None:
            parse_read_plan(doc, NAME)
        return doc
    except (ValueError, AttributeError, ReadPlanError):
        return None  # a damaged record is dropped: preflight decides by evidence


def writer_nodes() -> list[str] | None:
    """The Slurm node set of the job writing the manifest (preflight compares it with the next one)."""
    import os
    expr = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not expr:
        return None
    from ..slurm.hostlist import HostlistError, expand
    try:
        return expand(expr)
    except HostlistError:
        return None


def utc_now() -> str:
    import datetime
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def build(files: dict[str, int], digests: dict[tuple[str, int], str], *, chunk_bytes: int, layout: str | None,
          tool: str, created: str | None = None, nodes: list[str] | None = None, extra: dict | None = None) -> bytes:
    """The manifest's bytes; `created` defaults to now (UTC), `extra` adds top-level keys (a part
    publish records its publish id, the nodes and the committing part)."""
    table = {}
    for rel in sorted(files):
        n = max(1, -(-files[rel] // chunk_bytes))
        digs = [digests[(rel, i)] for i in range(n)]
        table[rel] = {"size": files[rel], **({"xxh3_128": digs[0]} if n == 1 else {"chunks": digs})}
    doc = {"schema": SCHEMA, "algorithm": "xxh3-128", "chunk_bytes": chunk_bytes, "tool": tool,
           "created": created or utc_now(), "layout": layout, "files": table}
    if nodes:
        doc["nodes"] = nodes
    doc.update(extra or {})
    return (json.dumps(doc, indent=1) + "\n").encode()
