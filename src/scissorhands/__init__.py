"""scissorhands: KV-cache eviction policies with a C core.

Decide, each decode step, which cached tokens an LLM forgets: Scissorhands (Liu et
al., NeurIPS 2023), H2O (Zhang et al., NeurIPS 2023), TOVA (Oren et al., 2024),
StreamingLLM (Xiao et al., ICLR 2024) and the Full baseline, all with one interface.
The pure-Python reference with the identical API is :mod:`scissorhands.reference`.
"""

from scissorhands._shared import RowVictims as RowVictims
from scissorhands.errors import InvalidInputError as InvalidInputError
from scissorhands.errors import InvalidTypeError as InvalidTypeError
from scissorhands.errors import ScissorhandsError as ScissorhandsError
from scissorhands.errors import UnknownPolicyError as UnknownPolicyError
from scissorhands.options import DefaultRefusedError as DefaultRefusedError
from scissorhands.policies import POLICIES
from scissorhands.policies.full import Full as Full
from scissorhands.policies.h2o import H2O as H2O
from scissorhands.policies.scissorhands import Scissorhands as Scissorhands
from scissorhands.policies.streaming_llm import StreamingLLM as StreamingLLM
from scissorhands.policies.tova import TOVA as TOVA

__version__ = "0.1.0"

# The documented classes are imported by name above, for type checkers; every registry
# class is an attribute here too, so a policy added later is ``scissorhands.<Class>``
# without an edit to this file.
globals().update({cls.__name__: cls for cls in POLICIES.values()})

__all__ = sorted({
    "POLICIES",
    "DefaultRefusedError",
    "InvalidInputError",
    "InvalidTypeError",
    "RowVictims",
    "ScissorhandsError",
    "UnknownPolicyError",
    "__version__",
    *(cls.__name__ for cls in POLICIES.values()),
})
