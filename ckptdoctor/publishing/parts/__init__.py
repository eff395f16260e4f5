"""publish --part K/N --publish-id ID: one checkpoint assembled from N nodes' local disks.

Every node runs one part with the same ID.  The parts share one staging directory beside the final
name, DEST_ROOT/.<name>.ckptdoctor-parts-<ID>/ (rules/publish.yaml `parts_dir`):

    <name>/          the checkpoint being assembled; becomes DEST_ROOT/<name> by one rename
    tmp/             a part's copy in flight (never inside <name>/, so a dead part leaves no half file there)
    journal/K.jsonl  one line per file part K put in place or checked, appended after the rename
    parts/K.json     part K's record (every file it holds, size and xxh3-128 chunk digests), written last
    alive/K          touched every few seconds while part K runs (stale staging is told by it)
    commit           the election: the part that creates it exclusively commits
    failed.json      written by a part that refused (a conflict, a failed verify), so the others stop waiting
    conflicts/       one file per conflict a part saw, never rewritten (no record rewrite can drop one)

A part copies each of its files to tmp/, fsyncs it, renames it into <name>/ without replacing; a
file that is already there (present on several nodes: `.metadata`, `common.pt`, `config.json`) is
not copied again, but read and compared with this node's copy.  When all N records exist, one part
wins the election and commits: records agree on every shared file, the assembled tree is exactly
the union of the records, structural verify passes, then the merged manifest (with the publish ID),
fsync, rename, fsync, tracker, retention -- the same after-commit as a single-node publish.  A part
that finds DEST_ROOT/<name> committed under its ID exits 0, after finishing the tracker itself if the
committer died between its rename and its after-commit; one that finds it committed under another ID
exits 73 (PartTaken).  A re-run with the same ID withdraws its old record, skips the files its journal
already records (same size and mtime at the source) and unplaces those its source no longer holds.
"""
from .local import HEARTBEAT_SECONDS, LocalParts, clean_stale, hash_file, staging_age, staging_name
from .objects import ObjectParts
from .protocol import POLL_SECONDS, begin, commit_all, copy_part, run_part
from .records import ID_RE, RECORD_SCHEMA, FileRecord, PartRecord, PartRefused, PartResult, PartSpec, PartTaken, \
    PartTimeout, merge_records

__all__ = ["HEARTBEAT_SECONDS", "ID_RE", "POLL_SECONDS", "RECORD_SCHEMA", "FileRecord", "LocalParts", "ObjectParts",
           "PartRecord", "PartRefused", "PartResult", "PartSpec", "PartTaken", "PartTimeout", "begin",
           "clean_stale", "commit_all", "copy_part", "hash_file", "merge_records", "run_part", "staging_age",
           "staging_name"]
