#!/usr/bin/env python3
"""Mutation check: each curated mutant is a small, plausible bug in a core decision; the tests that
guard that decision must fail on it.  A surviving mutant is treated like a failing test.

    python scripts/mutation_check.py            # every mutant, 2 at a time
    python scripts/mutation_check.py -k CKD104  # only mutants whose id or text contains the word
    python scripts/mutation_check.py --suite-passed   # CI, right after the whole suite passed

Each mutant is applied to a private copy of the tracked tree (never to this checkout), the tests
named with it run there against that copy (PYTHONPATH puts the copy first, so subprocesses of the
CLI see it too), and one line per mutant is printed, then `mutants: K killed of N`.  Exit 0 only
when every mutant was killed.  A mutant whose text no longer appears exactly once is an error: the
list must follow the code.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    what: str


M = Mutant
MUTANTS = [
    # ---- verify: sizes, markers, tolerances, detection -------------------------------------------
    M("CKD104-size-boundary", "ckptdoctor/checks/verify_dcp.py", "e.size < end:", "e.size < end - 1:",
      ("tests/test_bite.py", "tests/test_verify_dcp.py"), "a shard one byte short passes"),
    M("CKD105-zip64-ignored", "ckptdoctor/layouts/ptzip.py",
      "    if eocd_at >= 20 + 56 and tail[n - EOCD_LEN - 20:n - EOCD_LEN - 16] == Z64_LOCATOR:",
      "    if False:", ("tests/test_verify_dcp.py::test_slice_end_records_are_judged_as_torch_reads_them",),
      "a torch archive's end judged by its 32-bit EOCD fields, which torch's reader never reads"),
    M("deep-zip64-record-required", "ckptdoctor/layouts/ptzip.py",
      "        if rec[:4] == Z64_EOCD and len(rec) == 56:",
      "        if rec[:4] != Z64_EOCD:\n            raise ZipDirError('zip64 end record missing')\n        if True:",
      ("tests/test_verify_dcp.py::test_slice_end_records_are_judged_as_torch_reads_them",), "verify --deep calls an archive torch loads unreadable (a damaged zip64 signature)"),
    M("dcp-record-rebuilt", "ckptdoctor/io/unpickle.py",
      '    body = "".join(f"\\n        self.{f} = g({f!r})" for f in fields)',
      '    body = "".join(f"\\n        if not hasattr(self, {f!r}): self.{f} = g({f!r})" for f in fields)',
      ("tests/test_hostile.py::test_dcp_records_built_twice_or_from_an_iterable_are_refused",),
      "a DCP record BUILT twice is read by its first state"),
    M("dcp-dtype-unchecked", "ckptdoctor/layouts/dcp.py",
      "            if not isinstance(dtype, str):", "            if False:",
      ("tests/test_hostile.py::test_dcp_dtype_that_is_no_dtype_is_refused_not_a_crash",),
      "an unhashable dtype in a .metadata crashes the check instead of being a finding"),
    M("CKD103-missing-shard", "ckptdoctor/checks/verify_dcp.py", "        if rel not in files:",
      "        if False:", ("tests/test_verify_dcp.py",), "a missing shard passes"),
    M("CKD107-tolerance", "ckptdoctor/checks/verify_dcp.py", "DEFAULT_MTIME_TOLERANCE = 2.0",
      "DEFAULT_MTIME_TOLERANCE = 30.0", ("tests/test_verify_dcp.py::test_mixed_generations_are_errors_when_no_copy_explains_them",),
      "a shard 10 s newer than its marker passes"),
    M("CKD101-marker", "ckptdoctor/checks/verify_markers.py", "        if not [e for e in ck.matching(group) if e.is_file]:",
      "        if False:", ("tests/test_megatron.py", "tests/test_family_model.py"),
      "a checkpoint without its commit marker passes"),
    M("CKD120-exact-end", "ckptdoctor/layouts/safetensors.py", "    if 8 + n + pos != file_size:",
      "    if 8 + n + pos > file_size + 1:", ("tests/test_families.py",),
      "a safetensors shard with bytes missing or appended passes"),
    M("detect-claims-ignored", "ckptdoctor/layouts/spec.py",
      "            if lay is not None and fits(lay, files, dirs):",
      "            if lay is not None and _by_content(lay, files, dirs):",
      ("tests/test_megatron.py", "tests/test_family_model.py"),
      "a Megatron save that died before metadata.json is judged plain DCP"),
    M("resume-marker-ignored", "ckptdoctor/layouts/model.py",
      "            return next((c.name for c in stepped if c.matching(self.layout.resume_markers)), None)",
      "            return next((c.name for c in stepped), None)", ("tests/test_family_model.py",),
      "torchtitan is said to resume from a step without .metadata"),
    M("tracker-negative", "ckptdoctor/layouts/trackers.py", "        if step < 0:", "        if step < -10**9:",
      ("tests/test_bite.py",), "a negative tracker iteration is accepted"),
    M("CKD113-dangling", "ckptdoctor/checks/verify_trackers.py", "\n    if val.target not in names:",
      "\n    if val.target not in names and False:", ("tests/test_families.py", "tests/test_megatron.py"),
      "a tracker naming a missing checkpoint passes"),
    M("CKD122-rank-grid", "ckptdoctor/checks/verify_components.py", "            missing = sorted(set(range(w)) - set(ranks))",
      "            missing = []", ("tests/test_families.py",), "a missing verl rank file passes"),
    M("config-unknown-key", "ckptdoctor/engine/config.py", "            if k not in known:",
      "            if k not in known and False:", ("tests/test_family_model.py",),
      "a typo in [verify] is silently ignored"),
    M("walk-cap-silent", "ckptdoctor/io/fs.py", "                if depth + 1 > MAX_TREE_DEPTH:",
      "                if depth + 1 > MAX_TREE_DEPTH and False:", ("tests/test_family_model.py",),
      "a tree past the walk cap is walked without bound"),
    # ---- the restricted unpickler ------------------------------------------------------------------
    M("unpickle-allow-open", "ckptdoctor/io/unpickle.py", 'DCP_ALLOW[(f"{DCP}.planner", "WriteItemType")] = _enum_value',
      'DCP_ALLOW[(f"{DCP}.planner", "WriteItemType")] = _enum_value\nDCP_ALLOW[("builtins", "open")] = open',
      ("tests/test_bite.py",), "a hostile .metadata may open files during verify"),
    M("unpickle-torch-standin", "ckptdoctor/io/unpickle.py",
      "    if module == \"torch\" and name in DTYPES:\n        return DType(name)",
      "    if module.startswith(\"torch\"):\n        return DType(name)",
      ("tests/test_bite.py",), "every torch.* global (torch.load too) resolves to a stand-in"),
    # ---- checksums ---------------------------------------------------------------------------------
    M("checksum-last-chunk", "ckptdoctor/io/hashing.py",
      "for i, off in enumerate(range(0, size, chunk))]", "for i, off in enumerate(range(0, size - chunk, chunk))]",
      ("tests/test_publish.py::test_multi_chunk_files_hash_the_same_in_publish_and_verify", "tests/test_checksums.py"),
      "the last 64 MiB of a large file is never hashed"),
    M("CKD151-compare", "ckptdoctor/checks/verify_checksums.py", "            if got != want or nread != u.length:",
      "            if nread != u.length:", ("tests/test_checksums.py",), "a flipped byte passes --checksums"),
    # ---- publish: order, protection, source checks ---------------------------------------------------
    M("publish-source-manifest", "ckptdoctor/publishing/flow.py", "            plan = _check_source_manifest(src_man, copied)",
      "            plan = None", ("tests/test_bite.py",), "a source that no longer matches its own manifest is published"),
    M("locate-torn-snapshot", "ckptdoctor/layouts/locate.py",
      "        if target is None or target in names:\n", "        if True:\n",
      ("tests/test_publish.py::test_verify_during_a_commit_sees_one_moment",),
      "verify running while a publisher commits calls the new tracker dangling (a false alarm)"),
    M("parts-takeover-blind", "ckptdoctor/publishing/parts/local.py",
      "                if now != dead:\n", "                if False:\n",
      ("tests/test_parts.py::test_a_dead_committer_is_taken_over_by_exactly_one_part",),
      "two parts take over a dead committer's claim at once and both commit"),
    M("tracker-backwards", "ckptdoctor/publishing/dest.py",
      "    if old_step is not None and old_step > (layout.steps.step(name) or 0) and old_target in entries:",
      "    if False:", ("tests/test_publish.py::test_tracker_never_moves_backwards",), "publishing an older step moves the tracker backwards"),
    M("retention-tracker-target", "ckptdoctor/publishing/dest.py",
      '        protect.setdefault(target, "the tracker names it")', "        pass",
      ("tests/test_publish.py::test_retention_keeps_tracker_target_multiples_and_in_flight",), "retention prunes the tracker's target"),
    M("publish-no-fsync", "ckptdoctor/publishing/copier.py",
      "                os.fsync(fd)  # EIO", "                pass  # EIO",
      ("tests/test_publish.py::test_every_file_is_fsynced_before_the_commit_rename",),
      "publish renames a checkpoint into place whose files were never fsynced"),
    M("retention-staging", "ckptdoctor/publishing/retention.py", "            if staging:", "            if False:",
      ("tests/test_publish.py",), "retention prunes a checkpoint that is still being written"),
    M("rename-overwrites", "ckptdoctor/io/atomic.py",
      '    if os.path.lexists(dst):\n        raise FileExistsError(errno.EEXIST, "exists", dst)\n    os.rename(src, dst)',
      "    os.rename(src, dst)", ("tests/test_bite.py",),
      "without renameat2 a publish replaces an existing checkpoint"),
    M("publish-lock-removed", "ckptdoctor/publishing/flow.py", "        with dest.lock():",
      "        with open(os.devnull):", ("tests/test_reliability.py::test_a_slow_older_publish_cannot_overwrite_a_newer_tracker",),
      "a slow older publish moves the tracker backwards"),
    M("source-snapshot-ignored", "ckptdoctor/publishing/flow.py", "        if changed:\n", "        if False:\n",
      ("tests/test_reliability.py",), "a source rewritten during the copy is published as a mixed generation"),
    M("CKD129-length-header", "ckptdoctor/layouts/ocdbt.py", "    if length != size:", "    if length < size:",
      ("tests/test_wild.py::test_orbax_verdict_matches_the_real_restore",),
      "an Orbax b-tree node cut short passes (the real restore fails)"),
    # ---- publish --part: agreement, completeness, election, save-time digests ---------------------
    M("parts-conflict-ignored", "ckptdoctor/publishing/parts/records.py",
      "            if (f0.size, f0.digests) != (f.size, f.digests):", "            if False:",
      ("tests/test_parts.py::test_parts_to_s3_racing_uploads_of_different_bytes_are_refused",),
      "two nodes' different common.pt uploads (no node compared) are committed"),
    M("parts-placed-copy-not-compared", "ckptdoctor/publishing/parts/protocol.py",
      "            if (there.size, there.digests) != (c.size, c.digests):", "            if False:",
      ("tests/test_parts.py::test_a_stale_file_left_in_staging_by_a_dead_run_is_never_committed",),
      "a node's copy that differs from the one already placed is committed"),
    M("parts-commit-before-all-records", "ckptdoctor/publishing/parts/protocol.py",
      "        if have >= set(range(spec.count)):", "        if have:",
      ("tests/test_parts.py::test_timeout_commits_nothing_and_a_rerun_resumes",),
      "the first part commits before the others arrived"),
    M("parts-verify-skipped", "ckptdoctor/publishing/parts/protocol.py",
      "        if reasons:\n            raise PartRefused", "        if False:\n            raise PartRefused",
      ("tests/test_parts.py::test_committed_checkpoint_loads_in_torch_and_a_refused_one_does_not",),
      "an assembly missing a shard is committed"),
    M("parts-save-time-manifest", "ckptdoctor/publishing/parts/protocol.py", "    plan = _check_save_time_manifest(src, recs)\n",
      "    plan = None\n", ("tests/test_integrations.py::test_part_publish_checks_each_node_against_the_save_time_manifest",),
      "a node whose shard rotted since the save is published"),
    M("manifestwriter-metadata-digest", "ckptdoctor/integrations/dcp.py", "        md = pickle.dumps(metadata)",
      "        md = pickle.dumps(metadata, protocol=2)",
      ("tests/test_integrations.py::test_manifest_written_during_save_lists_every_file_and_precedes_the_marker",),
      "the manifest vouches for .metadata bytes other than those written"),
    M("name-not-validated", "ckptdoctor/publishing/naming.py", "    if not NAME_RE.fullmatch(name or \"\"):",
      "    if not NAME_RE.match(name or \"\"):", ("tests/test_reliability.py",),
      "a name with a trailing newline or non-ASCII digits is published"),
    M("regular-files-only", "ckptdoctor/io/fs.py", "        if not stat_mod.S_ISREG(st.st_mode):",
      "        if stat_mod.S_ISDIR(st.st_mode):", ("tests/test_reliability.py",),
      "a FIFO or /dev/zero is opened and read"),
    M("unlisted-data-file-warning", "ckptdoctor/checks/verify_checksums.py",
      '                  severity="error" if data else None,', "                  severity=None,",
      ("tests/test_reliability.py",), "an empty manifest lets a corrupted shard pass --checksums"),
    M("coverage-corners", "ckptdoctor/layouts/coverage.py",
      "            counts[v] = get(v, 0) + sign\n", "            counts[v] = get(v, 0) + 1\n",
      ("tests/test_reliability.py", "tests/test_verify_dcp.py"), "chunk coverage says exact when it is not"),
    M("yaml-alias-budget", "ckptdoctor/io/decoded.py", "            if aliases > MAX_ALIASES:",
      "            if aliases > MAX_ALIASES * 10**9:", ("tests/test_reliability.py",),
      "a 1 KB YAML alias bomb is expanded"),
    M("prune-newest-complete", "ckptdoctor/commands/prune.py",
      '            protect.setdefault(newest.name, "the newest complete checkpoint")', "            pass",
      ("tests/test_doctor.py",), "prune removes the newest complete checkpoint"),
    M("fix-backup-skipped", "ckptdoctor/commands/fix.py",
      "            _keep_backup(root, p.tracker, lambda b: write_new(b, current))", "            pass",
      ("tests/test_doctor.py",), "verify --fix overwrites the tracker without a backup"),
    # ---- session 14: judgement, the gate, locks, real-library families ------------------------------
    M("selection-skips-checks", "ckptdoctor/engine/runner.py",
      "        for chk in checks_for(scope):   # every check runs: a deselected one's findings are judged, then hidden\n",
      "        for chk in [c for c in checks_for(scope) if self.selection.enabled_rule(c.rule)]:\n",
      ("tests/test_trusted_actions.py",), "--select/--ignore make a truncated checkpoint complete and the gate pass"),
    M("override-changes-completeness", "ckptdoctor/engine/finding.py",
      '        return (self.judged or self.severity) == "error" and not self.unverified',
      '        return self.severity == "error" and not self.unverified',
      ("tests/test_trusted_actions.py",), "--severity CKD1=info makes a truncated checkpoint complete"),
    M("fix-plans-before-lock", "ckptdoctor/commands/fix.py",
      "            eng, runv, p = judge_and_plan()   # the judgement the write is made from\n", "",
      ("tests/test_trusted_actions.py",), "verify --fix writes from a judgement made before a publish landed"),
    M("fix-reverts-rollback", "ckptdoctor/commands/fix.py",
      "    if fix_to is None and current is not None and current in complete:",
      "    if False:", ("tests/test_trusted_actions.py",), "verify --fix undoes a deliberate rollback"),
    M("prune-judges-before-lock", "ckptdoctor/commands/prune.py",
      "    with (contextlib.nullcontext() if dry_run else dest.lock()):\n        rep, runv = vflow.judge(location, engine)\n",
      "    rep, runv = vflow.judge(location, engine)\n    with (contextlib.nullcontext() if dry_run else dest.lock()):\n",
      ("tests/test_trusted_actions.py",), "prune deletes what a tracker moved meanwhile names"),
    M("digest-key-untyped", "ckptdoctor/resume.py", "    elif k.lstrip(\"-\").isdigit() or", "    elif False or",
      ("tests/test_resume.py::test_digests_tell_int_keys_from_str_keys_of_a_real_optimizer",), "an optimizer restored with str keys proves the resume"),
    M("ds-zero3-unknown", "ckptdoctor/checks/verify_components.py",
      '    zero3 = bool(have["model"]) if stage is None else stage == 3',
      '    zero3 = False', ("tests/test_conformance.py",), "a healthy DeepSpeed ZeRO-3 tag is called broken"),
    M("gate-downgrades-target", "ckptdoctor/commands/verify.py", "        if name != target:\n            _as_info(st)",
      "        if True:\n            _as_info(st)", ("tests/test_ux.py",),
      "the relaunch gate hides a broken resume target"),
    M("deep-nonfinite-mask", "ckptdoctor/checks/deep_scan.py", "        bad = (arr & expo) == expo  #",
      "        bad = (arr & expo) == expo + 1  #", ("tests/test_deep.py",), "verify --deep misses NaN and Inf"),
    M("deep-window-unsigned-max-skipped", "ckptdoctor/checks/deep_scan.py",
      "            and int(np.frombuffer(chunk, dtype=UINT[width], count=count).max()) < (1 << (8 * width - 1)) | expo)",
      "            and True)", ("tests/test_deep.py::test_window_test_agrees_with_torch_on_every_bit_pattern",
                               "tests/test_deep.py::test_half_and_fp8_nonfinite_named_as_torch_loads_them"), "verify --deep misses a negative NaN or -Inf in F16/BF16/FP8"),
    M("deep-dead-worker-trusted", "ckptdoctor/checks/deep_scan.py",
      "        rest = [i for i in range(len(work)) if i not in got]",
      "        rest = [i for i in range(len(work)) if i not in got and not res.worker_signals]",
      ("tests/test_deep.py::test_a_shard_truncated_under_a_worker_is_reported_not_a_crash",),
      "verify --deep drops the records of a scan worker that died (SIGBUS: a shard truncated under it)"),
    M("deep-short-read-silent", "ckptdoctor/checks/deep_scan.py",
      "    if got.short:\n        res.changed.append(", "    if False:\n        res.changed.append(",
      ("tests/test_deep.py::test_a_shard_truncated_under_a_worker_is_reported_not_a_crash",), "verify --deep says ok on a shard that shrank while it was scanned"),
    M("deep-workers-outlive-interrupt", "ckptdoctor/checks/deep_scan.py",
      "                os.kill(pid, 9)\n", "                pass\n",
      ("tests/test_deep.py::test_ctrl_c_during_the_workers_stops_them_all",),
      "Ctrl-C on verify --deep leaves its scan workers running"),
    M("deep-last-group-dropped", "ckptdoctor/checks/deep_scan.py",
      "        if plan:\n            _run(ck, plan, files, res, prog)", "        if False:\n            _run(ck, plan, files, res, prog)",
      ("tests/test_deep.py::test_files_scanned_a_group_at_a_time_find_what_one_pass_finds",),
      "verify --deep never scans the files of its last group of records"),
    M("deep-crc-ignored", "ckptdoctor/checks/deep_scan.py",
      "    if rec.crc is not None and not got.short and got.crc != rec.crc:",
      "    if rec.crc is not None and not got.short and False:", ("tests/test_deep.py",),
      "verify --deep passes a torch archive whose bytes changed after the write"),
    # ---- resume proofs and the run contract --------------------------------------------------------
    M("resume-compare-blind", "ckptdoctor/resume.py",
      "    differing = sorted(k for k in saved.keys() & now.keys() if saved[k] != now[k])",
      "    differing = sorted(k for k in saved.keys() & now.keys() if False)",
      ("tests/test_resume.py::test_mismatch_lists_differing_missing_and_unexpected",),
      "a restored state with different values passes resume.check"),
    M("contract-data-hash-ignored", "ckptdoctor/contract.py",
      '        if now[p]["xxh3_128"] != files[p]["xxh3_128"]:', '        if False:',
      ("tests/test_contract.py",), "a data file rewritten in place passes the run contract"),
    # ---- reconcile -----------------------------------------------------------------------------------
    M("repair-gate-removed", "ckptdoctor/runstate/positions.py",
      "    if after.lost_prompts or len(after.duplicate_prompts) > len(before.duplicate_prompts) \\",
      "    if False and len(after.duplicate_prompts) > len(before.duplicate_prompts) \\",
      ("tests/test_bite.py",), "--fix rewrites a cursor whose simulated resume still loses prompts"),
    M("repair-agree", "ckptdoctor/runstate/positions.py", "    if p.a == p.c + 1:", "    if p.a == p.c + 2:",
      ("tests/test_reconcile.py",), "--fix raises a cursor that already agrees with the dataloader"),
    # ---- preflight -------------------------------------------------------------------------------------
    M("CKD402-size-boundary", "ckptdoctor/preflight/analysis.py", "elif rel in need and have < need[rel]:",
      "elif rel in need and have < need[rel] - 1:", ("tests/test_bite.py",),
      "a node-local shard one byte short passes"),
    M("rank-node-off-by-one", "ckptdoctor/preflight/model.py",
      "        rank_node = [n for n, k in zip(nodes, per_node) for _ in range(k)]",
      "        rank_node = [n for n, k in zip(nodes[1:] + nodes[:1], per_node) for _ in range(k)]",
      ("tests/test_preflight.py",), "ranks are placed on the wrong nodes"),
    M("hostlist-drops-last", "ckptdoctor/slurm/hostlist.py", "    return hosts\n", "    return hosts[:-1]\n",
      ("tests/test_preflight.py",), "the last host of a node list is dropped"),
    M("preflight-dangling-tracker", "ckptdoctor/checks/preflight.py", "    if pf.dangling:", "    if False:",
      ("tests/test_bite.py",), "a node whose tracker names a missing checkpoint passes preflight"),
    # ---- preflight: what each rank reads (issue 36) -----------------------------------------------------
    M("per-rank-key-read-by-every-rank", "ckptdoctor/preflight/readsets.py",
      '            out[s.fqn] = ("rank", n) if ok else \\', '            out[s.fqn] = ("every",) if ok else \\',
      ("tests/test_readsets.py::test_evidence_rules_for_keys_saved_once",),
      "a key only one rank holds (per-rank RNG, dp_rank_{r}) is demanded from every node: false alarms"),
    M("undecided-key-silent", "ckptdoctor/preflight/readsets.py",
      "            out._undecided(s, every - ({w} if not out.resharded else set()), kind[1])", "            pass",
      ("tests/test_readsets.py::test_evidence_rules_for_keys_saved_once",),
      "a key the evidence cannot place is assumed read by its writer alone: a broken split passes silently"),
    M("shared-metadata-unreadable-passes", "ckptdoctor/preflight/analysis.py",
      "                if out is not None:\n                    why = (getattr(exc,",
      "                if False:\n                    why = (getattr(exc,",
      ("tests/test_preflight.py::test_a_metadata_that_is_not_a_regular_file_is_an_error_not_a_pass",),
      "a .metadata that cannot be read (a FIFO) passes preflight"),
    M("recorded-read-plan-ignored", "ckptdoctor/preflight/analysis.py",
      "self.ranks_checked(), self._recorded_plan(name, copies))", "self.ranks_checked(), None)",
      ("tests/test_readsets.py::test_read_plan_file_decides_what_a_manifestless_copy_cannot",),
      "the save's recorded read plan (manifest or --read-plan) is ignored: undecided where it was exact"),
    # ---- exit codes ------------------------------------------------------------------------------------
    M("fail-on-ignored", "ckptdoctor/engine/finding.py", "        threshold = RANK[fail_on or self.fail_on]",
      '        threshold = RANK["error"]', ("tests/test_cli_contract.py",), "--fail-on warning is ignored"),
    M("exit-1-lost", "ckptdoctor/cli.py", "    raise typer.Exit(1 if eng.report.failed() and not exit_zero else 0)",
      "    raise typer.Exit(0)", ("tests/test_cli_contract.py",), "a failed verify exits 0"),
    # ---- the fast command line and the plain report (issue 20) ----------------------------------------
    M("fastcli-first-wins", "ckptdoctor/fastcli.py", "            out[p[\"name\"]] = vals[-1]",
      "            out[p[\"name\"]] = vals[0]", ("tests/test_fastcli.py",),
      "a repeated option takes its first value where typer takes the last"),
    M("fastcli-no-enum", "ckptdoctor/fastcli.py", "            out[p[\"name\"]] = cls(out[p[\"name\"]])",
      "            out[p[\"name\"]] = out[p[\"name\"]]", ("tests/test_fastcli.py",),
      "the fast path hands a command strings where typer hands Enum members"),
    M("fastcli-spec-enum-lost", "ckptdoctor/fastcli.py", "    if p.name in enums:\n", "    if False:\n",
      ("tests/test_fastcli.py",), "the compiled CLI spec forgets which parameters are Enum-typed"),
    M("values-frozen-assignable", "ckptdoctor/values.py",
      'src.append("def __setattr__(self, name, value):\\n  if type(self) is _cls or name in _names:\\n"',
      'src.append("def __setattr__(self, name, value):\\n  if False:\\n"', ("tests/test_values.py",),
      "a frozen value (a finding, a rule, a layout) can be changed after it is built"),
    M("plain-table-width", "ckptdoctor/report/styled.py", "    widths = [max([cell_len(x) for x in h]",
      "    widths = [1 + max([cell_len(x) for x in h]", ("tests/test_report_text.py",),
      "the plain text report's table differs from what rich prints"),
    # ---- issue 39: the survivors of a fresh set of deliberate bugs, killed by promise tests ----------
    M("publish-seal-no-subdir-fsync", "ckptdoctor/publishing/copier.py",
      "        fsync_dir(os.path.join(root, d))", "        pass",
      ("tests/test_publish.py::test_every_directory_of_the_checkpoint_is_fsynced_before_the_commit_rename",),
      "after a power loss a published checkpoint keeps its name but loses files in its subdirectories"),
    M("parts-commit-without-every-record", "ckptdoctor/publishing/parts/protocol.py",
      "    if missing:\n        raise PartRefused(f\"{st.dir}: no record from parts",
      "    if False:\n        raise PartRefused(f\"{st.dir}: no record from parts",
      ("tests/test_parts.py::test_the_commit_never_happens_while_a_part_has_not_recorded",),
      "a part publish commits while a part's record is missing"),
    M("parts-commit-unrecorded-staged-file", "ckptdoctor/publishing/parts/protocol.py",
      "        extra = sorted(set(listed) - set(merged))", "        extra = []",
      ("tests/test_parts.py::test_a_file_in_staging_that_no_part_recorded_is_never_published",),
      "a file a dead attempt left in staging is published"),
    # ---- issue 38: part conflicts never dropped, a dead committer's tracker recovered, 73 for losers --
    M("parts-conflict-sighting-dropped", "ckptdoctor/publishing/parts/protocol.py",
      "        merged = merge_records(recs, st.dir, st.conflicts())", "        merged = merge_records(recs, st.dir)",
      ("tests/test_parts.py::test_a_conflict_seen_by_a_rerun_survives_the_stalled_original_rewriting_its_record",),
      "a conflict seen by a re-run of a part is dropped when the stalled original rewrites its record"),
    M("parts-conflict-part-exits-0", "ckptdoctor/publishing/parts/protocol.py",
      "        st.fail(msg)\n        raise PartRefused(msg)", "        pass",
      ("tests/test_parts.py::test_a_conflict_seen_by_a_rerun_survives_the_stalled_original_rewriting_its_record",),
      "the part that saw a conflict goes on as if nothing happened"),
    M("parts-dead-committer-tracker", "ckptdoctor/publishing/parts/protocol.py",
      "        if gone or time.monotonic() > deadline:", "        if False:",
      ("tests/test_parts.py::test_a_committer_killed_after_its_rename_leaves_the_tracker_to_a_waiting_part",),
      "a committer killed after its rename leaves the checkpoint without a tracker while every part exits 0"),
    M("parts-loser-requeues", "ckptdoctor/publishing/parts/records.py",
      "    exit_code = EXIT_TAKEN", "    exit_code = 75",
      ("tests/test_parts.py::test_a_waiting_part_exits_73_when_another_publish_id_commits_the_name",
       "tests/test_parts.py::test_a_committer_that_loses_the_rename_to_another_publish_id_exits_73"),
      "the losers of a publish-id race ask to be requeued, which can never succeed"),
    M("parts-stale-record-reused", "ckptdoctor/publishing/parts/protocol.py",
      "    st.withdraw_record()\n", "    pass\n",
      ("tests/test_parts.py::test_a_rerun_withdraws_its_old_record_and_unplaces_a_file_gone_from_its_source",),
      "a re-run's old record lets another part commit while the re-run is still reading its source"),
    M("parts-gone-file-kept", "ckptdoctor/publishing/parts/protocol.py",
      "            st.unplace(rel)", "            pass",
      ("tests/test_parts.py::test_a_rerun_withdraws_its_old_record_and_unplaces_a_file_gone_from_its_source",),
      "a file deleted from a part's source since its earlier run stays staged and blocks (or joins) the commit"),
    M("preflight-reshard-floor", "ckptdoctor/preflight/readsets.py",
      "min(world, -(-hi // per))", "min(world, hi // per)",
      ("tests/test_preflight.py::test_after_a_world_size_change_a_node_missing_a_file_its_new_rank_overlaps_is_not_cleared",),
      "after a world-size change preflight clears a node whose new rank needs a file it lacks"),
    M("rl-repair-last-step-unchecked", "ckptdoctor/runstate/positions.py",
      "range(p.c + 1, new + 1) if p.cnt.get(t, 0) != p.n]", "range(p.c + 1, new) if p.cnt.get(t, 0) != p.n]",
      ("tests/test_reconcile.py::test_fix_refuses_when_the_last_step_it_would_hand_out_is_not_exactly_full",),
      "reconcile --fix raises the cursor though step A-1 does not hold exactly N groups"),
    # ---- forensics (issue 43) ----------------------------------------------------------------------
    M("forensics-blames-collateral", "ckptdoctor/forensics/analyse.py",
      'causes = [e for e in a.events if e.kind == "cause" and not e.handled and _related(e)]',
      'causes = [e for e in a.events if e.kind != "exit" and not e.handled and _related(e)]',
      ("tests/test_forensics.py::test_forensics_names_the_true_first_cause_rank_file_and_class",
       "tests/test_forensics.py::test_collective_timeouts_alone_are_never_called_the_cause"),
      "forensics blames a rank that only timed out or lost its peer"),
    M("forensics-survived-traceback-blamed", "ckptdoctor/forensics/analyse.py",
      "                if not ev.prefixed:\n                    ev.handled = True",
      "                if False:\n                    ev.handled = True",
      ("tests/test_forensics.py::test_a_logged_traceback_without_the_rank_prefix_is_not_the_failure_even_as_the_last_word",
       "tests/test_forensics.py::test_a_survived_traceback_is_evidence_not_the_failure"),
      "a traceback the process logged and survived is called the failure"),
    M("torch-loader-installed-ignored", "ckptdoctor/checks/verify_dcp.py",
      "    loader = given or torchver.installed()", "    loader = given",
      ("tests/test_conformance.py::test_the_installed_torch_is_the_default_loader",),
      "verify ignores the torch installed beside it when no --loader-torch is given"),
    # ---- slow storage (issue 42) ---------------------------------------------------------------------
    M("slow-storage-never-concurrent", "ckptdoctor/io/fs.py",
      "        if threads > 1 and (_seen_slow or (i == PROBE_CALLS and spent / i > slow_s)):",
      "        if False:",
      ("tests/test_slow_storage.py::test_slow_metadata_calls_are_issued_together_and_answered_in_order",),
      "a listing on a networked filesystem stats its entries one round trip after another"),
    M("gate-skips-target-shards", "ckptdoctor/commands/verify.py",
      "            ck.read_data = ck.name == runv.resume_target",
      "            ck.read_data = False",
      ("tests/test_slow_storage.py::test_the_gate_still_reads_every_shard_of_the_checkpoint_it_resumes",),
      "the relaunch gate passes a resume target whose shard bytes it never read"),
    M("shard-reads-serial", "ckptdoctor/checks/verify_dcp.py",
      "map_io(lambda job: _shard_slices(ck, readers, files[job[0]].size, *job), todo)",
      "map(lambda job: _shard_slices(ck, readers, files[job[0]].size, *job), todo)",
      ("tests/test_slow_storage.py::test_on_slow_storage_the_shard_bytes_are_read_together_not_one_shard_after_another",),
      "on a parallel filesystem the gate reads its target's shards one round trip after another"),
]


def copy_tree(dst: str) -> None:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = os.path.join(ROOT, rel)
        # a tracked symlink stays a link (Composer's latest-rank0.pt fixture): a copy that followed it
        # is another case (`cp -L`) with another real outcome, and CI's first run failed on exactly that
        if os.path.islink(src) or os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dst, rel), follow_symlinks=False)


def _env(work: str) -> dict:
    """The environment every run in a copy gets: the copy first on PYTHONPATH (subprocesses of the
    CLI too) and its own temporary directory -- pytest prunes old numbered run directories under
    it, and two copies sharing one pruned each other's module fixtures mid-run (seen as false
    failures)."""
    tmp = work.rstrip("/") + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=work, PYTHONDONTWRITEBYTECODE="1", PYTHONWARNINGS="ignore", TMPDIR=tmp)
    env.pop("CKPTDOCTOR_CONFIG", None)
    return env


def _imports_own_copy(work: str, out: list) -> bool:
    p = subprocess.run([sys.executable, "-c", "import ckptdoctor; print(ckptdoctor.__file__)"], cwd=work,
                       env=_env(work), capture_output=True, text=True)
    if p.returncode == 0 and os.path.realpath(p.stdout.strip()).startswith(os.path.realpath(work) + os.sep):
        return True
    out.append(f"the copy {work} imports {p.stdout.strip() or p.stderr[-400:]!r}, not its own package")
    return False


def union_of(test_sets) -> set[str]:
    """Every test named by any set, once: a node id whose file is itself named is dropped (pytest
    would run it twice)."""
    every = {t for ts in test_sets for t in ts}
    return {t for t in every if "::" not in t or t.split("::", 1)[0] not in every}


def _pytest(work: str, tests: tuple[str, ...], timeout: int, out: list | None = None,
            stop_first: bool = True) -> int:
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", *(["-x"] if stop_first else []), "-q",
                            "-p", "no:cacheprovider", *tests],
                           cwd=work, env=_env(work), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1
    if out is not None:
        out.append(p.stdout[-4000:])
    return p.returncode


def run_one(m: Mutant, work: str, timeout: int) -> tuple[Mutant, str, float]:
    path = os.path.join(work, m.file)
    original = open(path).read()
    if original.count(m.old) != 1:
        return m, f"ERROR: text to mutate found {original.count(m.old)} times in {m.file}", 0.0
    open(path, "w").write(original.replace(m.old, m.new))
    t0 = time.monotonic()
    try:
        rc = _pytest(work, m.tests, timeout)
    finally:
        open(path, "w").write(original)
    dt = time.monotonic() - t0
    if rc == 1:
        return m, "killed", dt
    if rc == 0:
        return m, "SURVIVED", dt
    return m, f"ERROR: pytest exit {rc}" + ("" if rc != -1 else " (timeout)"), dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-k", default="", help="only mutants whose id or description contains this")
    ap.add_argument("-j", type=int, default=2, help="mutants tested at once (each in its own copy)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per mutant")
    ap.add_argument("--baseline-only", action="store_true", help="only run the guarding tests unmutated")
    ap.add_argument("--suite-passed", action="store_true",
                    help="the whole suite just passed on this tree (CI): only check that each copy imports "
                         "itself and collects the guarding tests, instead of running them unmutated again")
    a = ap.parse_args()
    chosen = [m for m in MUTANTS if a.k.lower() in (m.id + " " + m.what).lower()]
    if not chosen:
        print(f"no mutant matches {a.k!r}")
        return 2
    with tempfile.TemporaryDirectory(prefix="ckd-mutants-") as tmp:
        works = []
        for i in range(max(1, a.j)):
            w = os.path.join(tmp, f"w{i}")
            copy_tree(w)
            works.append(w)
        free = list(works)
        results = []

        def job(m):
            w = free.pop()
            try:
                return run_one(m, w, a.timeout)
            finally:
                free.append(w)

        # the guarding tests must pass on the unmutated code, or a "kill" would prove nothing: each
        # test once (the union of every mutant's tests, a file standing for its own tests), split over
        # the copies, rather than one run per mutant's set (the same tests and pytest's start-up over
        # and over)
        t0 = time.monotonic()
        sets = sorted(union_of(m.tests for m in chosen))
        if a.suite_passed:
            # CI ran the whole suite on this very tree just before (and stops when it fails): these
            # tests passing unmutated is proven there, and repeating them took 339 s of CI's 60 minutes
            # (measured, 2 copies).  What the suite cannot prove is the copies themselves: each must
            # import its own package (PYTHONPATH first, the mechanism every kill depends on) and
            # collect every guarding test.
            chunks = [["--collect-only", *sets]] * len(works)
        else:
            chunks = [sets[i::len(works)] for i in range(len(works))]

        def base(tests):
            w = free.pop()
            out: list = []
            try:
                if a.suite_passed and not _imports_own_copy(w, out):
                    return tests, 1, "".join(out)
                return tests, _pytest(w, tests, a.timeout * 4, out, stop_first=False), "".join(out)
            finally:
                free.append(w)
        with ThreadPoolExecutor(max_workers=len(works)) as ex:
            broken = [(t, text) for t, rc, text in ex.map(base, [tuple(c) for c in chunks if c]) if rc != 0]
        if broken:
            for t, text in broken:
                print(f"ERROR: some of the tests {' '.join(t)} fail on the unmutated code:\n{text}")
            print(f"mutants: 0 killed of {len(chosen)}")
            return 1
        print(f"guarding tests {'collected in each copy' if a.suite_passed else 'pass on the unmutated code'} "
              f"({len(sets)} named, {time.monotonic() - t0:.0f} s)", flush=True)
        if a.baseline_only:
            return 0

        with ThreadPoolExecutor(max_workers=len(works)) as ex:
            for m, verdict, dt in ex.map(job, chosen):
                print(f"{verdict:<9} {m.id:<28} {dt:6.1f}s  {m.what}", flush=True)
                results.append(verdict)
    killed = sum(v == "killed" for v in results)
    print(f"mutants: {killed} killed of {len(results)}")
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
