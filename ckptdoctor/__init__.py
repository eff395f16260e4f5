"""ckptdoctor: find broken checkpoints before the relaunch; publish them whole or not at all.

The Python API mirrors the CLI: ``ckptdoctor.verify(path) -> Report`` and friends run the
same rule engine the commands use.  Heavy modules (torch, s3fs) are imported lazily.
"""
__version__ = "0.1.0"

__all__ = ["__version__", "verify", "reconcile", "publish", "save_and_publish", "publish_distributed", "Report",
           "Finding"]


def __getattr__(name):  # lazy: keep `import ckptdoctor` cheap
    if name in ("verify", "reconcile", "publish", "save_and_publish"):
        from . import api
        return getattr(api, name)
    if name == "publish_distributed":  # imports torch.distributed when called, not here
        from .integrations.distributed import publish_distributed
        return publish_distributed
    if name in ("Report", "Finding"):
        from .engine import finding
        return getattr(finding, name)
    raise AttributeError(name)
