"""Mapping profiles: how a framework's checkpoint files become a run_state/v1 (data, in rules/profiles).

A profile names, for each canonical field, the file and path its value lives at, a fallback
(another canonical field or a small expression of them), and a default for files that are
legitimately absent.  Files are read once each: JSON, YAML, or `.pt` through the torch-free
reader.  Problems reading a file become notes (findings later), never exceptions.
"""
from __future__ import annotations

import json
from ..values import value, field
from functools import lru_cache
TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import Any

import yaml

from ..engine.catalog import data_dir, load_yaml
from ..engine.errors import UsageError
from ..io import ptfile
from ..io.fs import Storage
from ..io.decoded import check_size, load_yaml_bounded
from ..io.unpickle import RefusedGlobal
from ..layouts.spec import families, match_any
from .pathexpr import MISSING, PathError, evaluate
from .schema import FIELDS, RunState, normalize

MAX_JSON_BYTES = 64 << 20


@value(frozen=True)
class Profile:
    id: str
    framework: str
    title: str
    description: str
    priority: int
    detect_files: tuple[str, ...]
    capture: dict
    fields: dict[str, dict]


@lru_cache(maxsize=1)
def profiles() -> dict[str, Profile]:
    out = {}
    for p in sorted((data_dir() / "profiles").glob("*.yaml")):
        d = load_yaml(p)
        out[d["id"]] = Profile(d["id"], d.get("framework", ""), d.get("title", ""), d.get("description", ""),
                               int(d.get("priority", 0)), tuple(d.get("detect", {}).get("files", ())),
                               d.get("capture") or {}, d.get("fields") or {})
    return out


def detect(files: set[str]) -> Profile | None:
    cands = [p for p in profiles().values() if p.detect_files and all(f in files for f in p.detect_files)]
    return max(cands, key=lambda p: p.priority) if cands else None


@value
class Mapping:
    st: Storage
    profile: Profile
    overrides: dict[str, dict] = field(default_factory=dict)
    _files: dict[str, Any] = field(default_factory=dict)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (file, problem)
    present: set[str] = field(default_factory=set)

    def load(self, rel: str) -> Any:
        """The parsed content of `rel`, or MISSING (absent) / None (unreadable, noted)."""
        if rel in self._files:
            return self._files[rel]
        val: Any = MISSING
        ent = self.st.stat(rel)
        if ent is not None and not ent.is_dir:
            self.present.add(rel)
            try:
                val = self._parse(rel, ent.size)
            except RefusedGlobal as exc:
                self.notes.append((rel, f"pickle refers to {exc.qualname}, which is not allowed "
                                        f"(refused, nothing was run)"))
                val = None
            except (ptfile.PtError, ValueError) as exc:
                self.notes.append((rel, str(exc).splitlines()[0][:200]))
                val = None
            except OSError as exc:
                self.notes.append((rel, f"cannot read: {exc.strerror or exc}"))
                val = None
        self._files[rel] = val
        return val

    def _parse(self, rel: str, size: int | None) -> Any:
        if rel.endswith((".pt", ".pth")):
            with self.st.open(rel) as fh:
                return check_size(ptfile.read_pt(fh), rel)
        if size is not None and size > MAX_JSON_BYTES:
            raise ValueError(f"{size} bytes is too large for a run-state file (limit {MAX_JSON_BYTES})")
        return parse_text(rel, self.st.read(rel, MAX_JSON_BYTES))


def parse_text(rel: str, raw: bytes):
    """JSON for *.json, safe YAML otherwise; ValueError naming the format on bad input."""
    kind = "JSON" if rel.endswith(".json") else "YAML"
    try:
        return check_size(json.loads(raw) if kind == "JSON" else load_yaml_bounded(raw), kind)
    except (json.JSONDecodeError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"not valid {kind}: {str(exc).splitlines()[0][:120]}") from None
    except RecursionError:
        raise ValueError(f"not valid {kind}: nested too deeply") from None


def _spec(profile: Profile, overrides: dict[str, dict], name: str) -> dict | None:
    return overrides.get(name) or profile.fields.get(name)


def parse_overrides(items: list[str]) -> dict[str, dict]:
    """--map FIELD=FILE:PATH (PATH in the profile path language)."""
    out = {}
    for it in items:
        fld, sep, rest = it.partition("=")
        fname, sep2, path = rest.partition(":")
        sec, _, key = fld.partition(".")
        if not sep or not sep2 or not fname or not path or sec not in FIELDS or key not in FIELDS[sec]:
            raise UsageError(f"--map {it!r}: expected FIELD=FILE:PATH with FIELD like sampler.cursor "
                             f"(see `ckptdoctor reconcile --help`)")
        out[fld] = {"file": fname, "path": path}
    return out


def map_checkpoint(st: Storage, profile: Profile, overrides: dict[str, dict] | None = None,
                   parent: Storage | None = None, name: str = "") -> RunState:
    m = Mapping(st, profile, overrides or {})
    doc: dict[str, dict] = {sec: {} for sec in FIELDS}
    prov: dict[str, str] = {}
    resolving: set[str] = set()

    def canon(name: str):
        """Value of a canonical field, resolving it (and its fallbacks) on demand."""
        sec, _, key = name.partition(".")
        if key in doc.get(sec, {}):
            v = doc[sec][key]
            return MISSING if v is None else v
        if name in resolving:
            return MISSING
        resolving.add(name)
        v = _resolve(name)
        doc[sec][key] = None if v is MISSING else v
        return v

    def _resolve(name: str):
        spec = _spec(profile, m.overrides, name)
        if not spec:
            return MISSING
        fname = spec["file"]
        content = m.load(fname)
        v = MISSING
        if content is not MISSING and content is not None:
            paths = spec["path"] if isinstance(spec["path"], list) else [spec["path"]]
            for p in paths:
                try:
                    v = evaluate(content, p)
                except PathError as exc:
                    raise UsageError(f"profile {profile.id}: field {name}: {exc}") from None
                if isinstance(v, list) and "map" in spec:
                    v = [_map_item(item, spec["map"], name) for item in v]
                if v is not MISSING and v is not None:
                    prov[name] = f"{fname}:{p}"
                    break
        if (v is MISSING or v is None) and spec.get("fallback") is not None:
            fb = spec["fallback"]
            v = evaluate({}, str(fb), lookup=canon)
            if v is not MISSING and v is not None:
                prov[name] = f"{spec.get('fallback_source', 'fallback')}: {fb} " \
                             f"(no {spec['path']} in {fname})"
                if name == "sampler.cursor":
                    doc["sampler"]["cursor_source"] = spec.get("fallback_source", "derived")
        if (v is MISSING or v is None) and "default" in spec and content is MISSING:
            v = spec["default"]  # the file is legitimately absent (e.g. no reserve was pooled)
            prov[name] = f"default {v!r} ({fname} absent)"
        elif (v is MISSING or v is None) and "default" in spec and content is not None \
                and fname.endswith((".yaml", ".yml", ".json")):
            v = spec["default"]  # the key is absent from the config: the framework's own default
            prov[name] = f"default {v!r} (no {spec['path']} in {fname})"
        return None if v is MISSING else v

    def _map_item(item, mapping: dict, name: str) -> dict:
        out = {}
        for k, expr in mapping.items():
            try:
                v = evaluate(item, str(expr))
            except PathError as exc:
                raise UsageError(f"profile {profile.id}: field {name}.{k}: {exc}") from None
            out[k] = None if v is MISSING else v
        return out

    for sec, keys in FIELDS.items():
        for key in keys:
            if _spec(profile, m.overrides, f"{sec}.{key}"):
                canon(f"{sec}.{key}")
    if doc["sampler"].get("cursor") is not None and not doc["sampler"].get("cursor_source"):
        doc["sampler"]["cursor_source"] = "saved"
    if doc["inflight"].get("groups"):
        doc["inflight"]["persisted"] = True
    doc["capture"].update({k: v for k, v in profile.capture.items() if k in FIELDS["capture"]})
    doc["source"] = {"framework": profile.framework, "profile": profile.id, "checkpoint": name or st.display}
    _run_section(doc, prov, profile, m, parent, name)
    _sanitize(doc, m, prov)
    rs = normalize({"schema": "ckptdoctor.run_state/v1", **doc, "provenance": prov}, st.display)
    rs.notes = [f"{st.show(f) if f else st.display}: {msg}" for f, msg in m.notes]   # CKD313: "PATH: what"
    derive(rs)
    return rs


def _sanitize(doc: dict, m: Mapping, prov: dict[str, str]) -> None:
    """A mapped value of the wrong type is noted (against the file it came from) and treated as
    unknown, never coerced."""
    from ..engine.errors import InputError
    from .schema import GROUP_FIELDS, STATUSES, Provenance, _typed

    def source(field: str) -> str:   # the file a mapped field came from ("" when none: a default, a fallback)
        return Provenance.parse(prov.get(field)).file or ""
    for sec, spec in FIELDS.items():
        for key, kind in spec.items():
            v = _jsonable(doc[sec].get(key))
            try:
                doc[sec][key] = _typed(v, kind, f"{sec}.{key}")
            except InputError as exc:
                m.notes.append((source(f"{sec}.{key}"), f"{exc} (treated as unknown)"))
                doc[sec][key] = None
    for sec in ("buffer", "inflight"):
        groups = []
        for i, g in enumerate(doc[sec].get("groups") or []):
            g = g if isinstance(g, dict) else {}
            out = {}
            for key, kind in GROUP_FIELDS.items():
                try:
                    out[key] = _typed(g.get(key), kind, f"{sec}.groups[{i}].{key}")
                except InputError as exc:
                    m.notes.append((source(f"{sec}.groups"), f"{exc} (treated as unknown)"))
                    out[key] = None
            if out["status"] not in STATUSES:
                out["status"] = None
            if out["prompt_id"] is not None and not isinstance(out["prompt_id"], (str, int)):
                out["prompt_id"] = str(out["prompt_id"])
            groups.append(out)
        doc[sec]["groups"] = groups


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(ptfile.plain(obj))


def _run_section(doc: dict, prov: dict, profile: Profile, m: Mapping, parent: Storage | None, name: str):
    """Facts about the run root around this step directory: its step, siblings, status pointer."""
    fam = families().get(profile.framework)
    run = fam.run if fam else None
    if run is None:
        return
    step = run.steps.step(name or "")
    if step is not None:
        doc["run"]["checkpoint_step"] = step
        prov["run.checkpoint_step"] = f"directory name {name}"
    if parent is None:
        return
    try:
        entries = parent.listdir("")
    except OSError:
        return
    dirs = [e.name for e in entries if e.is_dir]
    doc["run"]["steps"] = sorted(s for s in map(run.steps.step, dirs) if s is not None)
    doc["run"]["staging"] = sorted(d for d in dirs if match_any(d, run.staging_globs))
    sf = run.tracker
    if sf and sf.parse.startswith("json:"):
        key = sf.parse.split(":", 1)[1]
        pm = Mapping(parent, m.profile)
        content = pm.load(sf.file)
        m.notes += pm.notes
        if content is not MISSING and content is not None:
            v = evaluate(content, key)
            if v is not MISSING and v is not None:
                doc["run"]["latest_status_step"] = v
                prov["run.latest_status_step"] = f"{parent.show(sf.file)}:{key}"


def derive(rs: RunState) -> None:
    """Fill fields that follow from others (recorded in provenance as derived)."""
    dl = rs.doc["dataloader"]
    if dl.get("batches_total") is None and dl.get("batches_in_epoch") is not None:
        epoch = rs.get("trainer.epoch")
        bpe = rs.get("config.batches_per_epoch")
        if epoch == 0:
            dl["batches_total"] = dl["batches_in_epoch"]
            rs.provenance["dataloader.batches_total"] = "derived: batches_in_epoch (epoch 0)"
        elif epoch is not None and bpe is not None:
            dl["batches_total"] = epoch * bpe + dl["batches_in_epoch"]
            rs.provenance["dataloader.batches_total"] = \
                f"derived: trainer.epoch * config.batches_per_epoch + batches_in_epoch ({epoch}*{bpe}+{dl['batches_in_epoch']})"
    if rs.doc["sampler"].get("cursor") is not None and not rs.doc["sampler"].get("cursor_source"):
        rs.doc["sampler"]["cursor_source"] = "saved"


def load_state_file(st: Storage, rel: str) -> RunState:
    """A neutral run_state/v1 file (JSON or YAML)."""
    from ..engine.errors import InputError
    try:
        raw = st.read(rel, MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{st.show(rel)}: cannot read: {exc.strerror or exc}") from None
    except ValueError:
        raise InputError(f"{st.show(rel)}: larger than {MAX_JSON_BYTES} bytes; not a run-state file") from None
    if len(raw) > MAX_JSON_BYTES:
        raise InputError(f"{st.show(rel)}: larger than {MAX_JSON_BYTES} bytes; not a run-state file")
    try:
        doc = parse_text(rel, raw)
    except ValueError as exc:
        raise InputError(f"{st.show(rel)}: {exc}") from None
    rs = normalize(doc, st.show(rel))
    derive(rs)
    return rs
