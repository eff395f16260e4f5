# Shared by prolog-wrapper.sh (node Prolog) and prolog-slurmctld.sh (PrologSlurmctld); sourced, not run.
#
# Policy, the same for both hooks:
#  * opt-in by the job comment: `ckptdoctor=LOCATION [ranks=N] [fresh]`;
#  * preflight runs AS THE JOB'S USER (SLURM_JOB_UID/GID and the user's groups) when the hook runs as
#    root: the location comes from the user, and a root process would let any user learn what root can
#    see (which files exist under a root-only directory) through the verdict.  Without a job uid it
#    does not run at all;
#  * preflight judged and failed (exit 1): the job is requeued held; AdminComment carries the first
#    error's rule, file and message (one line, at most 400 characters);
#  * preflight could not judge (binary missing or broken, usage error, crash, storage that did not
#    answer in time: exit >= 2): the job proceeds by default -- an admin's broken install must not stop
#    every opted-in job -- and the error text goes to syslog (tag ckptdoctor-prolog), to the file
#    $CKPTDOCTOR_PROLOG_LOG when set, and to stderr.  CKPTDOCTOR_ON_ERROR=hold holds such jobs instead;
#  * the hook itself always exits 0 (a failing Prolog drains the node; a failing PrologSlurmctld
#    requeues a batch job every 121 s).
# The hooks have no PATH: CKPTDOCTOR must be an absolute path.
CKPTDOCTOR=${CKPTDOCTOR:-/opt/ckptdoctor/bin/ckptdoctor}
SCONTROL=${SCONTROL:-/usr/bin/scontrol}
ON_ERROR=${CKPTDOCTOR_ON_ERROR:-proceed}   # proceed | hold
job=${SLURM_JOB_ID:-?}
where=${SLURMD_NODENAME:-controller}

ckd_log() {  # one line to syslog, the admin's log file and stderr (never fails the hook)
  /usr/bin/logger -t ckptdoctor-prolog -p user.err -- "job $job on $where: $1" 2>/dev/null
  [ -n "${CKPTDOCTOR_PROLOG_LOG:-}" ] && printf '%s job %s on %s: %s\n' "$(/bin/date -u +%FT%TZ)" "$job" "$where" \
    "$1" >> "$CKPTDOCTOR_PROLOG_LOG" 2>/dev/null
  printf 'ckptdoctor-prolog: job %s on %s: %s\n' "$job" "$where" "$1" >&2
}

ckd_hold() {  # requeue held with a bounded one-line reason
  "$SCONTROL" update JobId="$job" AdminComment="${1:0:400}" 2>/dev/null
  "$SCONTROL" requeuehold "$job" 2>/dev/null
}

# parse the comment: sets ckd_loc, ckd_rpn, ckd_fresh; returns 1 when the job did not opt in
ckd_parse() {
  local c=${SLURM_JOB_COMMENT:-}
  case "$c" in *ckptdoctor=*) ;; *) return 1 ;; esac
  ckd_loc=${c#*ckptdoctor=}; ckd_loc=${ckd_loc%% *}
  ckd_rpn=1
  case "$c" in *ranks=*) ckd_rpn=${c#*ranks=}; ckd_rpn=${ckd_rpn%% *} ;; esac
  ckd_fresh=()
  case " $c " in *" fresh "*) ckd_fresh=(--allow-fresh) ;; esac
  return 0
}

# sets ckd_as_user (a command prefix) and HOME; returns 1 when preflight must not run
ckd_drop_to_job_user() {
  ckd_as_user=()
  [ "$(/usr/bin/id -u)" -eq 0 ] || return 0          # not root: already unprivileged
  [ "${SLURM_JOB_UID:-}" = 0 ] && return 0          # root's own job
  if [ -z "${SLURM_JOB_UID:-}" ]; then
    ckd_log "no SLURM_JOB_UID in the hook's environment: preflight not run (never as root on a user's path)"
    return 1
  fi
  local line groups=(--clear-groups)
  line=$(/usr/bin/getent passwd "$SLURM_JOB_UID")
  [ -n "$line" ] && groups=(--init-groups)
  ckd_as_user=(/usr/bin/setpriv --reuid="$SLURM_JOB_UID" --regid="${SLURM_JOB_GID:-$SLURM_JOB_UID}" "${groups[@]}" --)
  HOME=$(printf '%s' "$line" | /usr/bin/cut -d: -f6)
  HOME=${HOME:-/nonexistent}
  return 0
}

# ckd_judge TIMEOUT_S ARGS...: run `ckptdoctor preflight ARGS --format json` as the job's user and act
ckd_judge() {
  local limit=$1 out rc py reason why first
  shift
  ckd_drop_to_job_user || return 0
  out=$(/usr/bin/timeout "$limit" "${ckd_as_user[@]}" /usr/bin/env HOME="$HOME" "$CKPTDOCTOR" preflight "$@" \
        --quiet --format json 2>&1)
  rc=$?
  [ "$rc" -eq 0 ] && return 0
  if [ "$rc" -eq 1 ]; then  # judged: the job cannot resume as it stands
    py="${CKPTDOCTOR%/*}/python3"; [ -x "$py" ] || py=/usr/bin/python3
    reason=$(printf '%s' "$out" | "$py" -c '
import json, sys
try:
    d = json.loads(sys.stdin.read())
    f = next(x for x in d["findings"] if x["severity"] == "error")
    print(" ".join(str(f[k]) for k in ("rule", "path", "message")).replace("\n", " "))
except Exception:
    print("")' 2>/dev/null)
    ckd_log "preflight failed, job held: ${reason:-$out}"
    ckd_hold "ckptdoctor preflight on $where: ${reason:-failed, no report (see syslog there)}"
    return 0
  fi
  case "$rc" in
    124) why="timed out after ${limit}s" ;;
    126|127) why="cannot run $CKPTDOCTOR (exit $rc)" ;;
    *) why="exit $rc" ;;
  esac
  first=$(printf '%s' "$out" | /usr/bin/tr '\n' ' ' | /usr/bin/cut -c1-300)
  if [ "$ON_ERROR" = hold ]; then
    ckd_log "preflight could not judge ($why): ${first:-no output}; job held (CKPTDOCTOR_ON_ERROR=hold)"
    ckd_hold "ckptdoctor preflight could not run on $where ($why): ${first:-no output}"
  else
    ckd_log "preflight could not judge ($why): ${first:-no output}; job proceeds (CKPTDOCTOR_ON_ERROR=hold holds it)"
  fi
  return 0
}
