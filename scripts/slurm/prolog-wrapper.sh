#!/bin/bash
# Slurm node Prolog wrapper (slurm.conf: Prolog=/path/prolog-wrapper.sh).  ALWAYS exits 0: a
# failing Prolog drains the node, and a bad checkpoint is not a node fault.  Instead, when the
# check fails, the job is requeued held and the reason is put in its AdminComment
# (`scontrol show job` / `squeue -O AdminComment`).
#
# REQUIRES PrologFlags=Alloc,DeferBatch in slurm.conf: without DeferBatch the batch script starts
# on nodes whose Prolog already finished, so a hold issued by a slower node comes too late (measured
# on the test cluster: 4 of 6 ranks ran before the hold).  With it, nothing starts before every
# node's check is done.
#
# The job opts in with its comment, since a Prolog sees no job environment:
#   sbatch --comment 'ckptdoctor=/nvme/{node}/run7 ranks=8' job.sh
# A job that starts from scratch adds the word `fresh` (an empty node-local directory is then fine):
#   sbatch --comment 'ckptdoctor=/nvme/{node}/run7 ranks=8 fresh' job.sh
# The Prolog has no PATH: CKPTDOCTOR must be an absolute path (edit the default below).
CKPTDOCTOR=${CKPTDOCTOR:-/opt/ckptdoctor/bin/ckptdoctor}
SCONTROL=${SCONTROL:-/usr/bin/scontrol}
TIMEOUT=${CKPTDOCTOR_TIMEOUT:-8}   # stay under MessageTimeout (10 s by default)
comment=${SLURM_JOB_COMMENT:-}
case "$comment" in *ckptdoctor=*) ;; *) exit 0 ;; esac
loc=${comment#*ckptdoctor=}; loc=${loc%% *}
rpn=1
case "$comment" in *ranks=*) rpn=${comment#*ranks=}; rpn=${rpn%% *} ;; esac
fresh=()
case " $comment " in *" fresh "*) fresh=(--allow-fresh) ;; esac
node=${SLURMD_NODENAME:-$(/bin/hostname -s)}
out=$(/usr/bin/timeout "$TIMEOUT" "$CKPTDOCTOR" preflight --local "${loc//\{node\}/$node}" \
      --nodelist "${SLURM_JOB_NODELIST:-$SLURM_NODELIST}" --ranks-per-node "$rpn" --quiet \
      --format json --timeout "$((TIMEOUT > 2 ? TIMEOUT - 1 : 1))" "${fresh[@]}" 2>&1)
rc=$?
if [ "$rc" -ne 0 ]; then
  reason=$(printf '%s' "$out" | /usr/bin/python3 -c '
import json, sys
try:
    d = json.load(sys.stdin)
    f = [x for x in d["findings"] if x["severity"] == "error"]
    print("; ".join(x["rule"] + " " + x["message"] for x in f[:2])[:400])
except Exception:
    print("preflight failed")' 2>/dev/null)
  [ "$rc" -eq 124 ] && reason="preflight timed out after ${TIMEOUT}s"
  "$SCONTROL" update JobId="$SLURM_JOB_ID" AdminComment="ckptdoctor preflight rc=$rc on $node: ${reason:-$out}" 2>/dev/null
  "$SCONTROL" requeuehold "$SLURM_JOB_ID" 2>/dev/null
fi
exit 0
