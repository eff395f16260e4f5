#!/bin/bash
# First step of a Slurm batch job: every node checks that its ranks can read what they will load,
# before any GPU work starts.  A bad checkpoint fails the *job*; nodes stay idle (a node Prolog
# would drain them instead).  Usage inside an sbatch script (with #SBATCH --requeue):
#
#   CKPTDOCTOR=/opt/ckptdoctor/bin/ckptdoctor  # absolute path; default: ckptdoctor on PATH
#   /opt/ckptdoctor/share/ckptdoctor/slurm/preflight-step.sh '/nvme/{node}/run7' || exit $?
#   srun python train.py
#
# LOCATION may contain {node}: each node checks its own copy ({node} -> $SLURMD_NODENAME).
# With CKPTDOCTOR_VIEWS_DIR set to a directory on shared storage, the nodes' views are also judged
# together (preflight --views): nodes that disagree on the resume target stop the job too.
# A node whose node-local run directory is empty or missing (a replacement node) stops the job
# (CKD409); a job that really starts from scratch passes --allow-fresh after LOCATION.
# Ranks per node come from the job ($SLURM_NTASKS_PER_NODE), captured before the one-task step
# overrides it; set CKPTDOCTOR_RANKS_PER_NODE to override.
# Output: one line per node (`preflight n1 (ranks 0-1): ok - ...`, after that node's findings, one
# line each) and one summary line.
# Exit: 0 go on; 75 storage unreachable -> job requeued and held for a human; else the failure.
set -u
loc=${1:?usage: preflight-step.sh LOCATION [extra ckptdoctor preflight options]}
shift
ckd=${CKPTDOCTOR:-ckptdoctor}
rpn=${CKPTDOCTOR_RANKS_PER_NODE:-${SLURM_NTASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-1}}}
export CKD_LOC="$loc" CKD_BIN="$ckd" CKD_RPN="$rpn"
# one task per node: --ntasks-per-node=1 alone is ignored when the job asked for more tasks (srun warns
# and ran every node's check once per task: measured on the test cluster, 6 checks for 3 nodes)
nn=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
one_per_node=(--nodes="$nn" --ntasks="$nn" --ntasks-per-node=1)
if [ -n "${CKPTDOCTOR_VIEWS_DIR:-}" ]; then
  # Whole-allocation agreement: every node writes its view to shared storage, then one judgement
  # over all of them (nodes that would resume from different checkpoints, a node with nothing
  # while others have a checkpoint, a node that sent no view).
  export CKD_VIEWS="$CKPTDOCTOR_VIEWS_DIR/${SLURM_JOB_ID:-job}"
  rm -rf "$CKD_VIEWS" && mkdir -p "$CKD_VIEWS" || exit 2
  srun "${one_per_node[@]}" bash -c \
    '"$CKD_BIN" preflight --local "${CKD_LOC//\{node\}/$SLURMD_NODENAME}" --ranks-per-node "$CKD_RPN" \
       --format json "$@" > "$CKD_VIEWS/$SLURMD_NODENAME.json"' ckptdoctor-preflight "$@"
  node_rc=$?
  "$ckd" preflight --views "$CKD_VIEWS" --nodelist "$SLURM_JOB_NODELIST" --format concise
  rc=$?
  [ "$rc" -ne 0 ] && [ "$node_rc" -eq 75 ] && rc=75
else
  srun "${one_per_node[@]}" --kill-on-bad-exit=1 bash -c \
    '"$CKD_BIN" preflight --local "${CKD_LOC//\{node\}/$SLURMD_NODENAME}" --ranks-per-node "$CKD_RPN" \
       --format concise "$@"' \
    ckptdoctor-preflight "$@"
  rc=$?
fi
case $rc in
  0) echo "ckptdoctor preflight: every node of ${SLURM_JOB_NODELIST:-the job} can resume; starting training"; exit 0 ;;
  75) echo "ckptdoctor preflight: storage unreachable; requeueing job $SLURM_JOB_ID held" >&2
      scontrol requeuehold "$SLURM_JOB_ID"; exit 75 ;;
  *) echo "ckptdoctor preflight failed (rc=$rc): not starting training" >&2; exit "$rc" ;;
esac
