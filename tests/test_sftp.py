"""preflight through fsspec's ssh support: each node's node-local copy read over sftp://{node}/...,
against a real sshd on loopback (127.0.0.1 and 127.0.0.2 stand for two nodes).  Skipped, with a
warning, only where openssh-server or paramiko is missing; .ci/run installs both."""
import os
import shutil
import socket
import subprocess
import time
import warnings

import pytest

from helpers import assert_fires_json, node_local_dcp
from test_preflight import pre

SSHD = "/usr/sbin/sshd"
WHY = None
if os.geteuid() != 0 or not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None:
    WHY = "openssh-server not installed (or not root)"
else:
    try:
        import paramiko  # noqa: F401
    except ImportError:
        WHY = "paramiko not installed"
if WHY:
    warnings.warn(f"SFTP TESTS SKIPPED: {WHY}")
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"SFTP TESTS SKIPPED: {WHY}")
NODES = ["127.0.0.1", "127.0.0.2"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    d = tmp_path_factory.mktemp("sshd")
    os.chmod(d, 0o755)
    for k in ("hostkey", "userkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / k)], check=True)
    shutil.copy(d / "userkey.pub", d / "authorized_keys")
    port = _free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\n" + "".join(f"ListenAddress {n}\n" for n in NODES) +
        f"HostKey {d}/hostkey\nAuthorizedKeysFile {d}/authorized_keys\nPermitRootLogin prohibit-password\n"
        f"PasswordAuthentication no\nPubkeyAuthentication yes\nStrictModes no\nUsePAM no\n"
        f"PidFile {d}/sshd.pid\nSubsystem sftp internal-sftp\n")
    os.makedirs("/run/sshd", exist_ok=True)
    subprocess.run([SSHD, "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")], check=True)
    pid_text = ""
    for _ in range(100):  # the pid file appears before its content is written: wait for a number
        pid_text = (d / "sshd.pid").read_text().strip() if (d / "sshd.pid").exists() else ""
        if pid_text.isdigit():
            break
        time.sleep(0.1)
    assert pid_text.isdigit(), f"sshd did not start: {(d / 'sshd.log').read_text()[-500:]}"
    pid = int(pid_text)
    try:
        yield {"port": port, "env": {"FSSPEC_SFTP_KEY_FILENAME": str(d / "userkey")}}
    finally:
        os.kill(pid, 15)


def test_preflight_over_sftp(sshd, tmp_path):
    node_local_dcp(tmp_path, NODES, 2)
    loc = f"sftp://root@{{node}}:{sshd['port']}{tmp_path}/nodes/{{node}}/run7"
    rc, rep, err = pre(loc, "--nodelist", ",".join(NODES), "--ranks-per-node", "2", env=sshd["env"])
    assert rc == 0, (rep and rep["findings"], err)
    assert rep["facts"]["newest_reachable"] == "iter_0000100"
    os.remove(tmp_path / "nodes" / NODES[1] / "run7" / "iter_0000100" / "__3_0.distcp")
    rc, rep, err = pre(loc, "--nodelist", ",".join(NODES), "--ranks-per-node", "2", env=sshd["env"])
    hits = assert_fires_json(rep, "CKD401", path_contains=f"sftp://root@{NODES[1]}")
    assert hits[0]["details"]["ranks"] == [3] and hits[0]["details"]["node"] == NODES[1]
