"""A real Slurm cluster on loopback for the tests: munged, slurmctld and three slurmd daemons
emulating nodes n1..n3 on this host (Debian's slurm-wlm; no systemd).  Every daemon started here
is stopped by pid (slurmd first, then slurmctld, then munged) when the fixture ends."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

NODES = ["n1", "n2", "n3"]
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo")


def missing() -> str | None:
    if os.geteuid() != 0:
        return "the Slurm lab runs its daemons as root"
    gone = [b for b in BINARIES if not (shutil.which(b) or os.path.exists(f"/usr/sbin/{b}"))]
    if gone:
        return f"slurm-wlm/munge not installed ({', '.join(gone)} missing): apt-get install slurm-wlm munge"
    if not os.path.exists("/etc/munge/munge.key"):
        return "/etc/munge/munge.key missing (the munge package creates it)"
    return None


def _free_ports(n: int) -> int:
    """A base port with n consecutive free ports after it (slurmd Port=a-b needs a range)."""
    for base in range(17100, 30000, 37):
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port range")


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class Lab:
    def __init__(self, root: Path, prolog: str | None = None, prolog_ctld: str | None = None):
        self.root = root
        self.prolog = prolog
        self.prolog_ctld = prolog_ctld
        self.pids: list[tuple[str, int]] = []
        self.env = dict(os.environ)
        self.munged_pid: int | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> "Lab":
        r = self.root
        for d in ("etc", "state", "spool", "run", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
        self._munge()
        ports = _free_ports(len(NODES) + 1)
        ctld = ports
        conf = r / "etc" / "slurm.conf"
        prolog = f"Prolog={self.prolog}\nPrologFlags=Alloc,DeferBatch\nPrologEpilogTimeout=30\n" if self.prolog else ""
        if self.prolog_ctld:
            prolog += f"PrologSlurmctld={self.prolog_ctld}\n"
        conf.write_text(f"""ClusterName=ckdlab
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld}
SlurmdPort={ctld + 1}
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
{prolog}NodeName=n[1-3] NodeHostname=localhost NodeAddr=127.0.0.1 Port={ctld + 1}-{ctld + len(NODES)} CPUs=2 RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        self.env["SLURM_CONF"] = str(conf)
        for k in [k for k in self.env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del self.env[k]
        subprocess.run([_sbin("slurmctld"), "-f", str(conf), "-i"], check=True, env=self.env)
        self._wait(lambda: self.run(["scontrol", "ping"]).returncode == 0 and
                   "UP" in self.run(["scontrol", "ping"]).stdout, "slurmctld")
        self.pids.append(("slurmctld", int((r / "run" / "slurmctld.pid").read_text())))
        for n in NODES:
            (r / "spool" / n).mkdir(exist_ok=True)
            subprocess.run([_sbin("slurmd"), "-f", str(conf), "-N", n], check=True, env=self.env)
            self._wait(lambda: (r / "run" / f"slurmd-{n}.pid").exists(), f"slurmd {n}")
            self.pids.insert(0, (f"slurmd {n}", int((r / "run" / f"slurmd-{n}.pid").read_text())))
        self._wait(lambda: self.idle() == NODES, "nodes idle", timeout=30)
        return self

    def _munge(self):
        sock = Path("/run/munge/munge.socket.2")
        if sock.exists() and subprocess.run(["sh", "-c", "munge -n | unmunge"], capture_output=True).returncode == 0:
            return  # a munged is already serving; not ours to stop
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        pidfile = Path("/run/munge/munged.pid")
        subprocess.run(["runuser", "-u", "munge", "--", _sbin("munged"), "-f"], check=True)
        self._wait(lambda: pidfile.exists() and sock.exists(), "munged")
        self.munged_pid = int(pidfile.read_text())

    def stop(self):
        for name, pid in self.pids:  # slurmd first, then slurmctld
            _kill(pid)
        if self.munged_pid:
            _kill(self.munged_pid)

    # -- helpers ----------------------------------------------------------------------------
    def run(self, cmd, **kw):
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=kw.pop("timeout", 60), **kw)

    def idle(self) -> list[str]:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout.split("\n")
        return sorted(line.split()[0] for line in out if line.strip().endswith("idle"))

    def states(self) -> dict[str, str]:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout.split("\n")
        return {line.split()[0]: line.split()[1] for line in out if line.strip()}

    def job(self, jobid: str) -> dict[str, str]:
        out = self.run(["scontrol", "show", "job", jobid]).stdout
        fields = {}
        for tok in out.split():
            k, sep, v = tok.partition("=")
            if sep:
                fields.setdefault(k, v)
        ac = out.split("AdminComment=", 1)
        if len(ac) > 1:
            fields["AdminComment"] = ac[1].split("\n")[0].split(" Comment=")[0].strip()
        return fields

    def wait_job(self, jobid: str, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"),
                 timeout=60) -> dict[str, str]:
        end = time.time() + timeout
        while time.time() < end:
            j = self.job(jobid)
            held = j.get("JobState") == "PENDING" and "held" in j.get("Reason", "").lower()
            if (j.get("JobState") in states and j.get("JobState") != "PENDING") or (held and "HELD" in states):
                return j
            time.sleep(0.2)
        raise TimeoutError(f"job {jobid} still {self.job(jobid).get('JobState')}")

    def resume_all(self):
        self.run(["scontrol", "update", f"nodename={','.join(NODES)}", "state=resume"])

    @staticmethod
    def _wait(pred, what, timeout=20.0):
        end = time.time() + timeout
        while time.time() < end:
            try:
                if pred():
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {what}")


def _kill(pid: int):
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
