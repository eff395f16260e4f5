"""Integrations that run inside a training job (they import torch; nothing else in ckptdoctor does
unless asked): `dcp.ManifestWriter` (digests while DCP saves) and `distributed.publish_distributed`
(the part publish with the process group as the barrier)."""
