#!/bin/bash
# PrologSlurmctld hook (runs once on the controller, drains nothing).  Checks every node's copy
# through LOCATION's {node} placeholder as seen from the controller (e.g. /mnt/{node}/nvme/run7 or
# sftp://{node}/nvme/run7).  Exits 0 and holds the job on failure: a non-zero exit would requeue a
# batch job every 121 s forever.  Opt-in, the job's user, and what happens when preflight cannot
# run: as in prolog-wrapper.sh (prolog-lib.sh beside this file).  When SlurmctldUser is not root the
# hook cannot become the job's user and runs preflight as SlurmctldUser.
. "${BASH_SOURCE[0]%/*}/prolog-lib.sh" || { /usr/bin/logger -t ckptdoctor-prolog "prolog-lib.sh missing beside $0"; exit 0; }
ckd_parse || exit 0
ckd_judge "${CKPTDOCTOR_TIMEOUT:-60}" "$ckd_loc" --nodelist "$SLURM_JOB_NODELIST" --ranks-per-node "$ckd_rpn" \
  "${ckd_fresh[@]}"
exit 0
