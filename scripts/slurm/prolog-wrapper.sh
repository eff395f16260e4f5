#!/bin/bash
# Slurm node Prolog wrapper (slurm.conf: Prolog=/path/prolog-wrapper.sh).  ALWAYS exits 0: a
# failing Prolog drains the node, and a bad checkpoint is not a node fault.  Instead, when the
# check fails, the job is requeued held and the reason is put in its AdminComment
# (`scontrol show job` / `squeue -O AdminComment`): the first error's rule, file and message.
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
#
# preflight runs as the job's user; a preflight that cannot run lets the job proceed (logged to
# syslog, tag ckptdoctor-prolog) unless CKPTDOCTOR_ON_ERROR=hold: see prolog-lib.sh beside this file.
# The Prolog has no PATH: CKPTDOCTOR must be an absolute path (default /opt/ckptdoctor/bin/ckptdoctor).
. "${BASH_SOURCE[0]%/*}/prolog-lib.sh" || { /usr/bin/logger -t ckptdoctor-prolog "prolog-lib.sh missing beside $0"; exit 0; }
TIMEOUT=${CKPTDOCTOR_TIMEOUT:-8}   # stay under MessageTimeout (10 s by default)
ckd_parse || exit 0
node=${SLURMD_NODENAME:-$(/bin/hostname -s)}
where=$node
ckd_judge "$TIMEOUT" --local "${ckd_loc//\{node\}/$node}" --node "$node" \
  --nodelist "${SLURM_JOB_NODELIST:-$SLURM_NODELIST}" --ranks-per-node "$ckd_rpn" \
  --timeout "$((TIMEOUT > 2 ? TIMEOUT - 1 : 1))" "${ckd_fresh[@]}"
exit 0
