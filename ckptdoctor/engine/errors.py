"""Exceptions that map to the public exit codes (see EXIT_CODES)."""

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_TAKEN = 73     # EX_CANTCREAT: publish --part lost the name to another publish id; do not requeue
EXIT_TEMPFAIL = 75  # EX_TEMPFAIL: could not evaluate; requeue, do not fail

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143

EXIT_CODES = {
    EXIT_OK: "no finding at or above --fail-on (verify --target resume: and the relaunch gate passed; "
             "prune: the policy was applied)",
    EXIT_FINDINGS: "findings at or above --fail-on, or the relaunch gate failed (verify --target resume, "
                   "verify --fix: the resume target is broken, absent, or no checkpoint of a known family)",
    EXIT_USAGE: "usage error, bad config, or an input that cannot be read at all (a missing path, a symlink "
                "loop: one line naming it)",
    EXIT_INTERNAL: "internal error (a bug; --debug shows the traceback)",
    EXIT_TAKEN: "publish --part: another publish id committed this name first; nothing of this publish was "
                "committed and a requeue cannot succeed (publish under another --name)",
    EXIT_TEMPFAIL: "could not evaluate for a transient reason (storage unreachable, timeout)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C); publish removes what it staged first",
    EXIT_TERMINATED: "terminated (SIGTERM during publish, e.g. scancel or a preemption notice)",
}


class CkptDoctorError(Exception):
    exit_code = EXIT_INTERNAL


class UsageError(CkptDoctorError):
    """Bad option, bad config file, or an input path that cannot be read at all."""
    exit_code = EXIT_USAGE


class InputError(UsageError):
    """The inspected path is missing or unreadable (one line naming it)."""


class TransientError(CkptDoctorError):
    """Storage unreachable or timed out: the checkpoint was not judged either way."""
    exit_code = EXIT_TEMPFAIL

