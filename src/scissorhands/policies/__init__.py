"""The C-backed policies: one module per policy, sharing :mod:`._base`."""

from scissorhands.policies.full import Full
from scissorhands.policies.h2o import H2O
from scissorhands.policies.scissorhands import Scissorhands
from scissorhands.policies.streaming_llm import StreamingLLM
from scissorhands.policies.tova import TOVA

#: Registry name -> class; every generic test and the CLI iterate it.
POLICIES = {
    "full": Full,
    "streaming-llm": StreamingLLM,
    "h2o": H2O,
    "tova": TOVA,
    "scissorhands": Scissorhands,
}

__all__ = ["H2O", "POLICIES", "TOVA", "Full", "Scissorhands", "StreamingLLM"]
