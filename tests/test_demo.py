"""`ckptdoctor demo` runs without torch and catches the faults it injects."""
import subprocess
import sys


def test_demo_runs_without_torch(tmp_path):
    code = ("import sys; sys.modules['torch'] = None; "  # any `import torch` now raises ImportError
            "sys.argv = ['ckptdoctor', 'demo', sys.argv[1]]; from ckptdoctor.__main__ import run; run()")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "CKD104 shard-truncated" in p.stdout and "CKD102 commit-interrupted" in p.stdout
    assert "newest complete checkpoint: iter_0000100" in p.stdout
    assert "CKD151 checksum-mismatch" in p.stdout  # the content scene (verify --checksums)
    assert "CKD513 contract-recipe-changed" in p.stdout  # the run contract scene
    assert "CKD601 first-failure" in p.stdout and "BROKEN - CKD104" in p.stdout  # the forensics scene


def test_demo_output_is_loadable_by_torch(tmp_path):
    import pytest
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp
    from ckptdoctor.demo import build_run
    build_run(str(tmp_path / "run"))
    sd = {f"decoder.layers.{i}.mlp.weight": torch.zeros(8, 8) for i in range(2)}
    sd["iteration"] = 0
    dcp.load(sd, checkpoint_id=str(tmp_path / "run" / "iter_0000100"))
    assert sd["iteration"] == 100
    assert sd["decoder.layers.0.mlp.weight"][0, 0].item() == 100.0
