"""scissorhands: KV-cache eviction policies with a C core.

Decide, each decode step, which cached tokens an LLM forgets: Scissorhands (Liu et
al., NeurIPS 2023), H2O (Zhang et al., NeurIPS 2023), TOVA (Oren et al., 2024),
StreamingLLM (Xiao et al., ICLR 2024) and the Full baseline, all with one interface.
The pure-Python reference with the identical API is :mod:`scissorhands.reference`.
"""

from scissorhands._shared import RowVictims
from scissorhands.errors import InvalidInputError, InvalidTypeError, ScissorhandsError, UnknownPolicyError
from scissorhands.options import DefaultRefusedError
from scissorhands.policies import POLICIES
from scissorhands.policies.full import Full
from scissorhands.policies.h2o import H2O
from scissorhands.policies.scissorhands import Scissorhands
from scissorhands.policies.streaming_llm import StreamingLLM
from scissorhands.policies.tova import TOVA

__version__ = "0.1.0"

__all__ = [
    "H2O",
    "POLICIES",
    "TOVA",
    "DefaultRefusedError",
    "Full",
    "InvalidInputError",
    "InvalidTypeError",
    "RowVictims",
    "Scissorhands",
    "ScissorhandsError",
    "StreamingLLM",
    "UnknownPolicyError",
    "__version__",
]
