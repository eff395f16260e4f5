"""Exceptions that map to the public exit codes (see EXIT_CODES)."""

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_TEMPFAIL = 75  # EX_TEMPFAIL: could not evaluate; requeue, do not fail

EXIT_CODES = {
    EXIT_OK: "no finding at or above --fail-on",
    EXIT_FINDINGS: "findings at or above --fail-on",
    EXIT_USAGE: "usage error, bad config, or an input that cannot be read at all",
    EXIT_INTERNAL: "internal error (a bug; --debug shows the traceback)",
    EXIT_TEMPFAIL: "could not evaluate for a transient reason (storage unreachable, timeout)",
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

