"""Imported by the engine environment's last step (services/launcher/engine_env.py): the adapter's
SGLang-facing modules and the SGLang classes its tests build import together, on a CPU too.

``services.workers.sglang.engine`` is not among them: SGLang's model registry imports torchvision,
and PyPI's torchvision does not load against the CPU torch. It imports where the engine runs.
"""

from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

from services.workers.sglang import config, kv_events, sampling

__all__ = ["SamplingParams", "ServerArgs", "config", "kv_events", "sampling"]
