#!/bin/bash
# PrologSlurmctld hook (runs once on the controller, drains nothing).  Checks every node's copy
# through LOCATION's {node} placeholder as seen from the controller (e.g. /mnt/{node}/nvme/run7 or
# sftp://{node}/nvme/run7).  Exits 0 and holds the job on failure: a non-zero exit would requeue a
# batch job every 121 s forever.  Opt-in and absolute paths as in prolog-wrapper.sh.
CKPTDOCTOR=${CKPTDOCTOR:-/opt/ckptdoctor/bin/ckptdoctor}
SCONTROL=${SCONTROL:-/usr/bin/scontrol}
comment=${SLURM_JOB_COMMENT:-}
case "$comment" in *ckptdoctor=*) ;; *) exit 0 ;; esac
loc=${comment#*ckptdoctor=}; loc=${loc%% *}
rpn=1
case "$comment" in *ranks=*) rpn=${comment#*ranks=}; rpn=${rpn%% *} ;; esac
fresh=()
case " $comment " in *" fresh "*) fresh=(--allow-fresh) ;; esac
out=$(/usr/bin/timeout 60 "$CKPTDOCTOR" preflight "$loc" --nodelist "$SLURM_JOB_NODELIST" \
      --ranks-per-node "$rpn" --quiet "${fresh[@]}" 2>&1)
rc=$?
if [ "$rc" -ne 0 ]; then
  "$SCONTROL" update JobId="$SLURM_JOB_ID" AdminComment="ckptdoctor preflight rc=$rc: $(printf '%s' "$out" | grep -m2 ' error ' | tr -s ' \n' ' ' | cut -c1-300)"
  "$SCONTROL" requeuehold "$SLURM_JOB_ID"
fi
exit 0
