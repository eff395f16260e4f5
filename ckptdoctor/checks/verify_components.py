"""Per-family completeness beyond markers: required files, rank sets, staging leftovers."""
from __future__ import annotations

import re

from ..engine.finding import Hit
from ..engine.registry import check
from ..layouts.model import age_seconds
from ..layouts.spec import match_any


@check("CKD123", "checkpoint")
def required_component_missing(ck, eng):
    lay = ck.layout
    names = set(ck.entries)
    for req in lay.required:
        if not any(match_any(n, (req,)) for n in names):
            yield Hit(ck.path(req), f"{req} is missing ({lay.title})", details={"file": req},
                      hint=_why_required(lay.name, req))
    for w in lay.extra.get("warn_missing", ()):   # needed by one way of resuming, not by another: a warning
        if w["file"] not in names:
            yield Hit(ck.path(w["file"]), f"{w['file']} is missing ({lay.title}): {w['why']}",
                      details={"file": w["file"]}, severity="warning",
                      hint="restore it from the source copy; a resume that passes explicit restore args still works")
    for cond in lay.extra.get("required_when", ()):   # required because the save recorded it
        f = cond["file"]
        if f not in names and _recorded(ck, cond["recorded_in"], cond["key"]):
            yield Hit(ck.path(f), f"{f} is missing although {cond['recorded_in']} records "
                      f"{cond['key']}: {cond['why']}", details={"file": f, "recorded_in": cond["recorded_in"]},
                      hint="copy the file from the source (a copy that skipped it), or resume from an "
                           "older checkpoint")
    opt = tuple(lay.extra.get("optimizer_files", ()))
    rng = lay.extra.get("rng_files")
    # siblings of the same family whose commit markers are there (a broken or unreadable sibling
    # proves nothing; CKD901 reports an unreadable one); listed only for a family that compares
    # with them (the relaunch gate lists no older checkpoint it does not need, issue 42)
    peers = []
    for c in (ck.run.checkpoints if ck.run is not None and (opt or rng) else ()):
        try:
            if c is not ck and c.layout is lay and all(c.matching(group) for group in lay.markers):
                c.files  # noqa: B018 - listed now, so the uses below cannot fail
                peers.append(c)
        except OSError:
            continue
    for f in opt:  # each file the framework resumes optimizer/scheduler state from, by name
        if f in names:
            continue
        partners = [o for o in opt if o in names]
        having = [c.name for c in peers if f in c.files]
        if partners and lay.extra.get("optimizer_files_together"):
            # the Trainer restores optimizer and scheduler only when both files are there: one
            # alone is dropped with the other, and nothing is logged (transformers 5.23, measured)
            yield Hit(ck.path(f), f"{f} is missing beside {partners[0]}: resuming here silently restarts both "
                      f"the optimizer state and the LR schedule",
                      details={"file": f, "present": partners, **({"peer": having[-1]} if having else {})},
                      hint="the framework loads them only as a pair; restore the file, or resume from an "
                           "earlier checkpoint that has both")
        elif having:
            yield Hit(ck.path(f), f"{f} is missing although {having[-1]} has it: resuming here silently "
                      f"restarts {'the optimizer state' if 'optim' in f else 'the LR schedule'}",
                      details={"file": f, "peer": having[-1]},
                      hint="a save that died before this file, or a copy that skipped it; resume from "
                           f"{having[-1]} or restore the file")
    if rng:
        yield from _rng_set(ck, re.compile(rng), peers, lay.extra.get("rng_name", "rng_state_{rank}.pth"))


def _recorded(ck, file: str, key: str) -> bool:
    """Does the JSON file `file` of the checkpoint hold `key` at its top level?"""
    if file not in ck.files:
        return False
    try:
        doc, _problem = _json_marker(ck, file)
    except OSError:
        return False   # CKD101 / CKD901 report a missing or unreadable marker
    return isinstance(doc, dict) and key in doc


def _rng_set(ck, rx, peers, fmt: str):
    """Trainer writes rng_state_{process}.pth for every process of a multi-process run: all of them,
    and as many as the sibling checkpoints hold (a missing one: that process resumes with a fresh
    RNG; transformers only logs it)."""
    def ranks(c):
        return {int(m.group("rank")) for n in c.files if (m := rx.match(n)) and m.group("rank") is not None}
    if not any(rx.match(n) for n in ck.files) and (peers or ck.layout.extra.get("rng_always")):
        name = ck.layout.extra.get("rng_single") or fmt.format(rank=0)
        yield Hit(ck.path(name), f"no RNG state file ({name}): the resume starts with a fresh RNG",
                  severity="warning", details={"file": name},
                  hint="the framework only logs it (at INFO) and goes on: data order and dropout differ from "
                       "an uninterrupted run; restore the file if exactness matters")
        return
    mine = ranks(ck)
    want = max([max(mine) + 1 if mine else 0] + [max(r) + 1 for r in map(ranks, peers) if r])
    missing = [fmt.format(rank=r) for r in range(want) if r not in mine]
    if missing and want > 1:
        yield Hit(ck.display, f"{len(missing)} of {want} per-process RNG files missing: {_files(missing)}",
                  severity="warning", details={"missing_files": missing[:100], "processes": want},
                  hint="those processes resume with a fresh RNG state: the data order and dropout differ "
                       "from an uninterrupted run")


@check("CKD126", "checkpoint")
def trainer_state_invalid(ck, eng):
    """trainer_state.json is the Trainer's commit marker and its resume state: it must parse, and
    its global_step must be the N of checkpoint-N (a copy renamed to another step, a truncated
    write)."""
    lay = ck.layout
    state = lay.extra.get("state_file") if lay is not None else None  # the family says which file
    if not state or state["file"] not in ck.files:
        return
    import json
    f, key = state["file"], state["step_key"]
    try:
        doc = json.loads(ck.storage.read(ck.relpath(f), 256 << 20))
    except (ValueError, RecursionError) as exc:
        yield Hit(ck.path(f), f"{f} is not valid JSON ({str(exc)[:80]}): the framework cannot resume from this "
                  f"checkpoint", details={"file": f}, hint="a write cut short; resume from an earlier checkpoint")
        return
    except OSError:
        return  # CKD901 / CKD123 report unreadable or missing files
    step = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(step, int) or isinstance(step, bool):
        yield Hit(ck.path(f), f"{f} has no integer {key}", details={"file": f, key: step})
    elif ck.step is not None and step != ck.step:
        yield Hit(ck.path(f), f"{f} says {key} {step}, but the directory is {ck.name}: the framework would "
                  f"resume at step {step}", details={"file": f, key: step, "directory_step": ck.step},
                  hint="a checkpoint copied or renamed to another step; rename it back or resume elsewhere")


MARKER_CONFIG_MAX = 1 << 20   # Megatron's metadata.json is ~120 bytes; a MiB is far past any real one


def _json_marker(ck, f: str):
    """(document, problem) of the small JSON file `f` the listing holds, read and parsed once per
    checkpoint for every rule that asks (on an object store each read is a GET: Megatron's
    metadata.json was fetched twice per checkpoint, issue 42's harness).  A file the listing sizes
    past MARKER_CONFIG_MAX, or that grew past it since, is not read.  OSError: unreadable."""
    key = ("json_marker", f)
    got = ck.results.get(key)
    if got is None:
        got = ck.results[key] = _read_json_marker(ck, f)
    if isinstance(got, OSError):
        raise got
    return got


def _read_json_marker(ck, f: str):
    """(document, problem), or the OSError that reading raised."""
    import json
    try:
        raw = ck.storage.read(ck.relpath(f), MARKER_CONFIG_MAX) if ck.files[f].size <= MARKER_CONFIG_MAX else None
    except OSError as exc:
        return exc
    except ValueError:   # larger than the bound when read
        raw = None
    if raw is None:
        return None, f"is larger than {MARKER_CONFIG_MAX >> 20} MiB (not read)"
    try:
        return json.loads(raw), None
    except (ValueError, RecursionError) as exc:
        return None, f"is not valid JSON ({str(exc)[:80]})"


@check("CKD136", "checkpoint")
def marker_config_invalid(ck, eng):
    """A marker the framework's load parses as its configuration (the family's `marker_config`):
    a JSON object with every required field and no field the framework does not know."""
    lay = ck.layout
    cfg = lay.extra.get("marker_config") if lay is not None else None
    if not cfg or cfg["file"] not in ck.files:
        return
    f, who = cfg["file"], cfg["reader"]
    try:
        doc, problem = _json_marker(ck, f)
    except OSError:
        return   # CKD901 reports an unreadable file
    if problem is None and not isinstance(doc, dict):
        problem = f"holds a JSON {type(doc).__name__}, not an object"
    elif problem is None:
        unknown = sorted(k for k in doc if k not in cfg["fields"])
        absent = [k for k in cfg["required"] if k not in doc]
        if unknown:
            problem = f"has a field {who} does not know ({', '.join(map(repr, unknown[:4]))})"
        elif absent:
            problem = f"lacks {', '.join(absent)}"
    if problem:
        yield Hit(ck.path(f), f"{f} {problem}: {who} raises on every rank", details={"file": f},
                  hint="restore the file from the source copy, or resume from an earlier checkpoint")


def _why_required(layout: str, name: str) -> str:
    return {("verl", "data.pt"): "without it verl restarts the dataloader from sample 0 while the step "
                                 "resumes (prompts repeat); rotation deleting actor/ leaves such dirs too",
            ("hf-trainer", "trainer_state.json"): "Trainer cannot restore global_step or the RNG/LR state",
            }.get((layout, name), "the framework cannot resume without it")


@check("CKD122", "checkpoint")
def rank_set_incomplete(ck, eng):
    lay = ck.layout
    if lay.reader == "deepspeed":
        yield from _deepspeed(ck, lay)
    elif lay.reader == "verl":
        yield from _verl(ck, lay)


def _deepspeed(ck, lay):
    """The file set DeepSpeed's load_checkpoint opens, from what the tag's own model-states file
    records (`ds_config.zero_optimization.stage`, `dp_world_size`, `mp_world_size`), else from the
    files there: ZeRO-1/2 read `mp_rank_{mp}_model_states.pt` plus every data-parallel rank's
    `zero_pp_rank_{dp}_mp_rank_{mp}_optim_states.pt`; ZeRO-3 writes no `mp_rank_*_model_states.pt`
    but a `zero_pp_rank_{dp}_mp_rank_{mp}_model_states.pt` per rank beside its optimizer file
    (measured with deepspeed 0.19.8 on 2 gloo ranks: tests/fixtures/real/deepspeed)."""
    grid_re, model_re = re.compile(lay.extra["grid"]), re.compile(lay.extra["model"])
    have: dict[str, dict[int, set[int]]] = {"optim": {}, "model": {}}   # kind -> mp -> dp ranks
    prefix = ""                                                         # "bf16_" when the optimizer wrote it
    models = set()
    for n, e in sorted(ck.files.items()):
        m = grid_re.match(n)
        if m:
            have[m.group("kind")].setdefault(int(m.group("mp")), set()).add(int(m.group("dp")))
            if m.group("kind") == "optim":
                prefix = m.group("prefix") or ""
        mm = model_re.match(n)
        if mm:
            models.add(int(mm.group("mp")))
        if (m or mm) and e.size == 0:
            yield Hit(ck.path(n), f"{n} is empty (0 bytes): a rank's save did not happen",
                      details={"file": n})
    rec = _ds_recorded(ck, sorted(n for n in ck.files if model_re.match(n) or
                                  ((m := grid_re.match(n)) and m.group("kind") == "model")))
    stage = rec.get("stage")
    zero3 = bool(have["model"]) if stage is None else stage == 3
    seen = [dp for k in have.values() for s in k.values() for dp in s]
    dp_world = rec.get("dp") or (max(seen) + 1 if seen else 0)
    mp_world = rec.get("mp") or (max([*models, *have["optim"], *have["model"]], default=-1) + 1)
    wants_optim = bool(have["optim"]) or (stage is not None and stage >= 1)
    kinds = (["model"] if zero3 else []) + (["optim"] if wants_optim else [])
    for mp in range(mp_world):
        if not zero3 and mp not in models:
            name = f"mp_rank_{mp:02d}_model_states.pt"
            yield Hit(ck.path(name), f"{name} is missing: load_checkpoint opens it first on every rank",
                      details={"mp": mp, "file": name},
                      hint="copy the file from the source, or resume from another tag")
        for kind in kinds:
            got = have[kind].get(mp, set())
            missing = sorted(set(range(dp_world)) - got)
            if not missing:
                continue
            pre = prefix if kind == "optim" else ""
            files = [f"{pre}zero_pp_rank_{dp}_mp_rank_{mp:02d}_{kind}_states.pt" for dp in missing]
            yield Hit(ck.path(files[0]), f"model-parallel rank {mp}: ZeRO{'-3' if zero3 else ''} {kind} files of "
                      f"data-parallel rank(s) {_list(missing)} missing (have {len(got)} of {dp_world}): "
                      f"{_files(files)}",
                      details={"mp": mp, "kind": kind, "missing_dp": missing, "dp_world": dp_world,
                               "zero_stage": stage, "missing_files": files[:100]},
                      hint="every rank opens its own partition (load_checkpoint raises FileNotFoundError "
                           "on that rank, and the others can wait in a collective); copy the missing "
                           "files or resume from another tag")


def _ds_recorded(ck, model_files: list[str]) -> dict:
    """stage / dp / mp as the tag's first readable model-states file records them ({} if none)."""
    from ..io import ptfile
    from ..io.unpickle import RefusedGlobal
    for name in model_files[:1]:
        try:
            with ck.storage.open(ck.relpath(name)) as fh:
                doc = ptfile.read_pt(fh)
        except (OSError, ptfile.PtError, RefusedGlobal):
            return {}   # CKD117 / CKD127 say what is wrong with the file
        if not isinstance(doc, dict):
            return {}
        cfg = doc.get("ds_config")
        zo = cfg.get("zero_optimization") if isinstance(cfg, dict) else None
        stage = zo.get("stage") if isinstance(zo, dict) else None
        out = {"stage": stage if isinstance(stage, int) and not isinstance(stage, bool) else None}
        for k, key in (("dp", "dp_world_size"), ("mp", "mp_world_size")):
            v = doc.get(key)
            out[k] = v if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 1 << 20 else None
        return out
    return {}


def _verl(ck, lay):
    rx = re.compile(lay.extra["rank_file"])
    for comp in lay.extra.get("components", ()):
        if comp not in ck.dirs:
            continue
        try:
            entries = ck.storage.listdir(ck.relpath(comp))
        except OSError:
            continue
        kinds: dict[str, dict[int, int]] = {}
        example: dict[str, tuple[str, str]] = {}  # kind -> (a file of it, its rank digits)
        world = set()
        for e in entries:
            m = rx.match(e.name)
            if not m or e.is_dir:
                continue
            kinds.setdefault(m.group("kind"), {})[int(m.group("rank"))] = e.size
            example.setdefault(m.group("kind"), (e.name, m.group("rank")))
            world.add(int(m.group("world")))
            if e.size == 0:
                yield Hit(ck.path(f"{comp}/{e.name}"), f"{comp}/{e.name} is empty (0 bytes)",
                          details={"file": f"{comp}/{e.name}"})
        if len(world) > 1:
            yield Hit(ck.path(comp), f"{comp}/ mixes world sizes {sorted(world)}: files from two saves",
                      details={"component": comp, "world_sizes": sorted(world)})
            continue
        if not world:
            continue
        w = world.pop()
        for kind, ranks in sorted(kinds.items()):
            missing = sorted(set(range(w)) - set(ranks))
            if missing:
                ex = example[kind][0]
                files = [f"{comp}/" + re.sub(r"_rank_\d+\.pt$", f"_rank_{r}.pt", ex) for r in missing]
                yield Hit(ck.path(comp), f"{comp}/{kind}: rank(s) {_list(missing)} of world size {w} missing: "
                                         f"{_files(files)}",
                          details={"component": comp, "kind": kind, "missing_ranks": missing, "world": w,
                                   "missing_files": files[:100]},
                          hint="every rank 0..W-1 loads its own file; copy the missing ones or resume earlier")


def _files(names: list[str]) -> str:
    """The first five names, then how many more (every missing-file finding names them)."""
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _list(xs: list[int]) -> str:
    return ", ".join(map(str, xs[:8])) + (f", ... ({len(xs)} in all)" if len(xs) > 8 else "")


@check("CKD124", "run")
def temp_leftover(run, eng):
    pats = run.layout.staging_globs
    if not pats:
        return
    target = run.resume_target
    named = run.tracker.target
    done = run.newest_complete()
    for name, e in sorted(run.entries.items()):
        if not e.is_dir or not match_any(name, pats):
            continue
        step = re.search(r"(\d+)", name)
        is_named = named is not None and step is not None and run.step_of(named) == int(step.group(1)) \
            and named not in {c.name for c in run.checkpoints}
        age = age_seconds(e.mtime)
        try:
            size = sum(x.size for x in run.storage.listdir(name) if not x.is_dir)
        except OSError:
            size = None
        sev = "error" if is_named else "warning"
        why = (f"the tracker names {named}, which exists only as this staging directory" if is_named else
               f"a save that is still staging or died; resume target {target or 'none'}"
               + (f", newest complete {done.name}" if done else ""))
        yield Hit(run.storage.show(name), f"staging leftover {name}: {why}", severity=sev,
                  details={"dir": name, "bytes": size, "age_seconds": round(age, 1) if age is not None else None},
                  hint="never resume from it; delete it once no process is writing it")


@check("CKD155", "checkpoint")
def no_family_matched(ck, eng):
    if ck.layout is None or not ck.layout.extra.get("generic_checks_only"):
        return
    kinds: dict[str, int] = {}
    for n in ck.files:
        ext = n.rsplit(".", 1)[-1] if "." in n else n
        kinds[ext] = kinds.get(ext, 0) + 1
    what = ", ".join(f"{k} .{e}" for e, k in sorted(kinds.items()))
    yield Hit(ck.display, f"no checkpoint family matched {ck.display} ({what}): generic checks only",
              details={"files": sorted(ck.files)[:50]})


@check("CKD128", "checkpoint")
def peft_adapter_mismatch(ck, eng):
    """A LoRA adapter's tensors must be what its adapter_config.json says: lora_A is (r, in), lora_B
    (out, r) with r from `r` or `rank_pattern`, on modules `target_modules` names."""
    lora = ck.layout.extra.get("lora") if ck.layout is not None else None  # the family names its files
    if not lora or lora["config"] not in ck.files or lora["weights"] not in ck.files:
        return
    import json
    from ..layouts import safetensors as stf
    try:
        cfg = json.loads(ck.storage.read(ck.relpath(lora["config"]), 16 << 20))
    except (ValueError, RecursionError) as exc:
        yield Hit(ck.path(lora["config"]), f"{lora['config']} is not valid JSON ({str(exc)[:80]})",
                  details={"file": lora["config"]})
        return
    except OSError:
        return
    if not isinstance(cfg, dict) or cfg.get("peft_type") != "LORA":
        return  # other adapter types: the weights' names differ; only presence is checked
    rel = ck.relpath(lora["weights"])
    try:
        hdr = stf.read_header(lambda off, n: ck.storage.read_range(rel, off, n), ck.files[lora["weights"]].size)
    except (stf.HeaderError, OSError):
        return  # CKD120 names it
    r = cfg.get("r")
    pattern = cfg.get("rank_pattern") or {}
    targets = cfg.get("target_modules")
    problems, modules = [], set()
    for name, (_dt, shape, _b, _e) in sorted(hdr.tensors.items()):
        for part, dim in ((".lora_A.", 0), (".lora_B.", 1)):
            if part not in name:
                continue
            module = name.split(part, 1)[0]
            modules.add(module)
            want = next((v for k, v in pattern.items() if re.search(rf"(^|\.){re.escape(k)}$", module) or
                         re.fullmatch(k, module)), r) if isinstance(pattern, dict) else r
            # Linear: lora_A [r, in], lora_B [out, r].  ConvNd: lora_A [r, in, *kernel] but lora_B
            # [out, r // groups, 1, ...], and groups is the base layer's, not the adapter's (peft
            # 0.21.2, measured: make_wild.py peft_conv_adapter), so there only lora_A says r
            judged = len(shape) == 2 or (len(shape) > 2 and dim == 0)
            if isinstance(want, int) and judged and shape[dim] != want:
                problems.append(f"{name} has rank {shape[dim]}, the config says {want}")
    if not modules:
        problems.append(f"{lora['weights']} holds no lora_A/lora_B tensors")
    if isinstance(targets, str):
        try:
            re.compile(targets)
        except re.error as exc:   # peft's load raises re.error on it (0.21.2, measured)
            problems.append(f"target_modules {targets[:80]!r} is not a regular expression ({exc}): "
                            f"PeftModel.from_pretrained raises on it")
            targets = None
    if (isinstance(targets, list) and targets) or isinstance(targets, str):
        off = sorted(m for m in modules if not _peft_targets(targets, m))
        if off:
            problems.append(f"{len(off)} module(s) not in target_modules {targets}: {off[0]}")
    for p in problems[:10]:
        yield Hit(ck.path(lora["weights"]), f"adapter does not match {lora['config']}: {p}",
                  details={"file": lora["weights"], "r": r, "target_modules": targets},
                  hint="the adapter and its config come from different saves; PeftModel.from_pretrained "
                       "would fail or load the wrong shapes")


def _peft_targets(targets: list | str, module: str) -> bool:
    """Whether peft's target_modules names a saved adapter module, as peft matches it (0.21.2,
    `check_target_module_exists`): a string is one regex over the whole module name; a list entry is
    the name itself or a dotted suffix of it ("c_attn", "attn.c_attn", or the full names "all-linear"
    is saved expanded to).  The saved name carries the `base_model.model.` prefix the model's has not."""
    key = module.removeprefix("base_model.model.")
    if isinstance(targets, str):
        return re.fullmatch(targets, key) is not None   # a pattern that does not compile was named before
    return any(key == t or key.endswith(f".{t}") for t in targets if isinstance(t, str))


OCDBT_MAX_FILES = 100_000   # files of one Orbax item judged (a few per array in a real one)


@check("CKD129", "checkpoint")
def orbax_item_damaged(ck, eng):
    """An Orbax item stored in OCDBT must have its root manifest, and every file the root names
    (the nodes under d/ and the data files they point at) must exist and be as long as its own
    header says.  Files nothing names (process-level copies after the merge) are not judged:
    Orbax restores without them."""
    spec = ck.layout.extra.get("ocdbt") if ck.layout is not None else None
    if not spec:
        return
    import fnmatch
    from ..layouts import ocdbt
    for item in sorted(ck.dirs):
        base = ck.relpath(item)
        try:
            entries = {e.name: e for e in ck.storage.listdir(base)}
        except OSError:
            try:
                entries = _ocdbt_by_name(ck, base, spec)
            except OSError as exc:   # not even entered: restore fails (0.12.8, measured: FileNotFoundError)
                eng.emit("CKD901", Hit(ck.path(item), f"cannot enter {item}: {exc.strerror or exc}; Orbax restores "
                                       f"the arrays of {item!r} from it and fails", details={"item": item,
                                                                                      "errno": exc.errno},
                                       hint="make it readable (chmod a+rx, or run as the user who wrote it) and "
                                            "verify again"))
                continue
        procs = [n for n, e in entries.items() if e.is_dir and fnmatch.fnmatch(n, spec["process_dirs"])]
        nodes_dir = entries.get(spec["nodes"])
        if not procs and not (nodes_dir and nodes_dir.is_dir) and spec["manifest"] not in entries:
            continue  # not an OCDBT item (a JSON item, a plain directory)
        man = entries.get(spec["manifest"])
        if man is None or not man.is_file:
            yield Hit(ck.path(f"{item}/{spec['manifest']}"), f"{item}/{spec['manifest']} is missing: the item's "
                      f"array store has no root, and Orbax cannot restore any array of {item!r}",
                      details={"item": item, "file": f"{item}/{spec['manifest']}", "problem": "missing"})
            continue
        tree = spec.get("tree_metadata")
        if tree and entries.get(tree) and entries[tree].is_file and not entries[tree].readable:
            # unlike a missing one, restore raises PermissionError with explicit args too (0.12.8, measured)
            eng.emit("CKD901", Hit(ck.path(f"{item}/{tree}"), f"cannot read {item}/{tree}: permission denied; "
                                   f"Orbax's restore opens it, with or without explicit restore args, and fails",
                                   details={"item": item, "file": f"{item}/{tree}", "problem": "permission denied"},
                                   hint="make it readable (chmod a+r, or run as the user who wrote it) and verify again"))
        elif tree and not (entries.get(tree) and entries[tree].is_file):
            yield Hit(ck.path(f"{item}/{tree}"), f"{item}/{tree} is missing: restore(step) with no args reads "
                      f"{item!r}'s tree from it and raises FileNotFoundError; restore(step, args=StandardRestore(...)) "
                      f"restores (orbax-checkpoint 0.12.8, measured)",
                      details={"item": item, "file": f"{item}/{tree}", "problem": "missing"}, severity="warning",
                      hint="restore it from the source copy; a resume that passes explicit restore args still works")
        named = [spec["manifest"]]
        if nodes_dir and nodes_dir.is_dir:
            try:
                named += [f"{spec['nodes']}/{e.name}" for e in ck.storage.listdir(f"{base}/{spec['nodes']}")
                          if e.is_file]
            except OSError:
                pass
        seen: set[str] = set()
        queue = list(named)
        while queue:  # the root, the nodes under d/, and every data file a readable node names
            rel = queue.pop(0)
            if rel in seen:
                continue
            if len(seen) >= OCDBT_MAX_FILES:   # bounded work on a hostile b-tree; what is left is said
                yield Hit(ck.path(item), f"{item}: its b-tree names more than {OCDBT_MAX_FILES} files; the "
                          f"rest were not checked", severity="warning",
                          details={"item": item, "checked": len(seen), "problem": "too many files"},
                          hint="a real Orbax item names a few files per array; check where this one came from")
                break
            seen.add(rel)
            try:
                st = ck.storage.stat(f"{base}/{rel}")
            except OSError as exc:   # a directory on its path this user may not enter
                eng.emit("CKD901", _unreadable_node(ck, item, rel, exc))
                continue
            if st is None or not st.is_file:
                yield Hit(ck.path(f"{item}/{rel}"), f"{item}/{rel} is missing: the item's b-tree names it, and "
                          f"Orbax fails reading the arrays stored there", details={"item": item, "file": f"{item}/{rel}",
                                                                                   "problem": "missing"})
                continue
            try:
                head = ck.storage.read_range(f"{base}/{rel}", 0, ocdbt.HEADER)
            except OSError as exc:   # what restore reads and cannot: not a pass (a permission, an I/O error)
                eng.emit("CKD901", _unreadable_node(ck, item, rel, exc))
                continue
            if head[:4] == ocdbt.ZSTD_MAGIC:  # a value file: zstd frames, no OCDBT header
                bad = ocdbt.zstd_problem(lambda off, n, r=f"{base}/{rel}": ck.storage.read_range(r, off, n), st.size)
            elif head[:4] in ocdbt.MAGICS or rel == spec["manifest"] or rel.startswith(spec["nodes"] + "/"):
                bad = ocdbt.header_problem(head, st.size)
            else:
                bad = None  # an uncompressed value file carries no framing to check
            if bad:
                yield Hit(ck.path(f"{item}/{rel}"), f"{item}/{rel}: {bad}; Orbax fails reading it",
                          details={"item": item, "file": f"{item}/{rel}", "problem": bad})
                continue
            if rel == spec["manifest"] or rel.startswith(spec["nodes"] + "/"):
                try:
                    data = ck.storage.read(f"{base}/{rel}", 64 << 20)
                except ValueError:
                    continue   # a data file under d/ holding values past 64 MiB: its header was checked
                except OSError as exc:
                    eng.emit("CKD901", _unreadable_node(ck, item, rel, exc))
                    continue
                queue += sorted(ocdbt.references(data) - seen)


def _ocdbt_by_name(ck, base: str, spec: dict) -> dict:
    """The entries of an item directory this user may enter but not list (mode 311): Orbax opens
    its files by name and restores (0.12.8, measured), so they are found and judged by name.  An
    OSError: the directory cannot even be entered."""
    out = {}
    for n in (spec["manifest"], spec.get("tree_metadata"), spec["nodes"]):
        e = ck.storage.stat(f"{base}/{n}") if n else None
        if e is not None:
            out[n] = e
    return out


def _unreadable_node(ck, item: str, rel: str, exc: OSError) -> Hit:
    return Hit(ck.path(f"{item}/{rel}"), f"cannot read {item}/{rel}: {exc.strerror or exc}; the item's b-tree "
               f"names it, and Orbax fails restoring {item!r}", details={"item": item, "file": f"{item}/{rel}",
                                                                        "errno": exc.errno},
               hint="make it readable (chmod a+r, or run as the user who wrote it) and verify again")


@check("CKD118", "checkpoint")
def nvrx_iteration_incomplete(ck, eng):
    """NVRx resumes from the newest iteration every rank holds and falls back silently: name the
    ranks here that lack the newest iteration (and their unfinished `.dirty` writes)."""
    if ck.layout is None or not ck.layout.extra.get("iterations_across_ranks"):
        return
    import re
    from ..layouts.spec import families
    fam = families().get(ck.layout.family)
    if fam is None or not fam.local.get("dirty"):
        return
    spec = fam.local
    ranks = sorted(d for d in ck.dirs if re.fullmatch(fam.local["rank_dir"], d))
    held: dict[str, set[int]] = {}
    dirty: dict[str, list[str]] = {}
    for r in ranks:
        try:
            entries = ck.storage.listdir(ck.relpath(r))
        except OSError as exc:   # measured (nvidia-resiliency-ext 0.4.1, make_nvrx.py --unreadable)
            eng.emit("CKD901", Hit(ck.path(r), f"cannot list {r}/: {exc.strerror or exc}; rank {r}'s find_latest "
                                   f"raises on it and the other ranks wait for it in a collective: the resume hangs",
                                   details={"dir": r, "errno": exc.errno},
                                   hint="make it readable (chmod a+rx, or run as the user who wrote it) and verify "
                                        "again"))
            continue
        held[r], dirty[r] = set(), []
        for e in entries:
            m = re.fullmatch(fam.local["file"], e.name)
            if m and e.is_file and int(m["owner"]) == int(r):
                held[r].add(int(m["step"]))
            md = re.fullmatch(spec["dirty"], e.name)
            if md:
                dirty[r].append(e.name)
    every = set.intersection(*held.values()) if held else set()
    seen = set().union(*held.values()) if held else set()
    seen |= {int(re.fullmatch(spec["dirty"], n)["step"]) for names in dirty.values() for n in names}
    if not seen:
        return
    newest, resume = max(seen), (max(every) if every else None)
    if newest == resume:
        return
    lacking = [r for r in held if newest not in held[r]]
    files = [f"{r}/iter_{newest:07d}_{r}_local.pt" for r in lacking]
    unfinished = [f"{r}/{n}" for r in lacking for n in dirty.get(r, []) if f"iter_{newest:07d}_" in n]
    shown = ", ".join(files[:5]) + (f" (+{len(files) - 5} more)" if len(files) > 5 else "")
    msg = (f"iteration {newest} is incomplete here: {shown} missing"
           + (f" ({len(unfinished)} unfinished .dirty write(s): {', '.join(unfinished[:3])})" if unfinished else "")
           + (f"; NVRx will silently resume from iteration {resume}" if resume is not None else
              "; no iteration is held by every rank here: NVRx will start from scratch"))
    yield Hit(ck.display, msg, severity=None if resume is None else "warning",
              details={"newest": newest, "resume_from": resume, "missing": files, "dirty": unfinished,
                       "ranks": len(held)},
              hint="the save of that iteration died; the older iteration is what resumes (or re-save)")


@check("CKD119", "checkpoint")
def resume_file_behind(ck, eng):
    """Lightning `ckpt_path="last"` resumes from the `last*.ckpt` with the newest mtime; a save_last
    copy older (by its own global_step) than a step checkpoint beside it loses that progress."""
    spec = ck.layout.extra.get("last_file") if ck.layout is not None else None
    if not spec:
        return
    import re
    from ..io import ptfile
    last_re, step_re = re.compile(spec["last"]), re.compile(spec["step_in_name"])
    lasts = [e for e in ck.files.values() if last_re.match(e.name) and e.is_file and e.mtime is not None]
    if not lasts:
        return  # no last file, or a dangling link (CKD125): Lightning drops those
    chosen = max(lasts, key=lambda e: e.mtime)

    def step_of(name):
        try:
            with ck.storage.open(ck.relpath(name)) as fh:
                obj = ptfile.read_pt(fh)
        except (ptfile.PtError, ptfile.RefusedGlobal, OSError):
            return None  # CKD117 / CKD127 say why it cannot be read
        v = obj.get(spec["step_key"]) if isinstance(obj, dict) else None
        return v if isinstance(v, int) and not isinstance(v, bool) else None
    at = step_of(chosen.name)
    if at is None:
        return
    others = {}
    for e in ck.files.values():
        if e is chosen or last_re.match(e.name) or not e.name.endswith(spec["suffix"]):
            continue
        m = step_re.search(e.name)
        others[e.name] = int(m.group(1)) if m else step_of(e.name)
    newer = sorted(((s, n) for n, s in others.items() if s is not None and s > at), reverse=True)
    if newer:
        s, n = newer[0]
        yield Hit(ck.path(chosen.name), f"{chosen.name} holds step {at} but {n} is at step {s}: "
                  f"`ckpt_path=\"last\"` resumes from {chosen.name} and loses {s - at} step(s)",
                  details={"file": chosen.name, "step": at, "newest": n, "newest_step": s},
                  hint=f"resume with ckpt_path pointing at {n}, or replace {chosen.name} with it")
