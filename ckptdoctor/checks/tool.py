"""Tool-level findings (9xx): things ckptdoctor could not do, reported as findings."""
from ..engine.registry import register_external

# a check crashed (a bug): Engine.run_scope, wherever checks run
register_external("CKD900", ("verify", "publish", "reconcile", "preflight", "contract", "digests"))
# a file or directory inside the target is unreadable: verify's and publish's checkpoint checks
register_external("CKD901", ("verify", "publish"))
# nothing recognisable at the target, or a forced layout that does not fit: verify
register_external("CKD902", ("verify",))
# an expired [[acknowledge]] entry of the config (Engine._acknowledged), wherever findings are made
register_external("CKD903", ("verify", "publish", "reconcile", "preflight"))
