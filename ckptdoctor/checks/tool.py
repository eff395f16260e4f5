"""Tool-level findings (9xx): things ckptdoctor could not do, reported as findings."""
from ..engine.registry import register_external

register_external("CKD900", "tool")   # a check crashed (bug): see Engine.run_scope
register_external("CKD901", "tool")   # a file or directory inside the target is unreadable
register_external("CKD902", "tool")   # nothing recognisable at the target
