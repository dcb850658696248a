"""The C-backed policies: one module per policy, sharing :mod:`._base`."""

import importlib

from scissorhands.options import SPECS, PolicyRegistry
from scissorhands.policies._base import NativePolicy
from scissorhands.policies.full import Full
from scissorhands.policies.h2o import H2O
from scissorhands.policies.scissorhands import Scissorhands
from scissorhands.policies.streaming_llm import StreamingLLM
from scissorhands.policies.tova import TOVA

#: Registry name -> class, in the registry's order, each found where its
#: :class:`~scissorhands.options.PolicySpec` says (``module``, ``class_name``); every
#: generic test and the CLI iterate it; an unknown name raises
#: :class:`~scissorhands.errors.UnknownPolicyError` listing the known ones.
POLICIES: PolicyRegistry[type[NativePolicy]] = PolicyRegistry(
    (name, getattr(importlib.import_module(f"{__name__}.{spec.module}"), spec.class_name))
    for name, spec in SPECS.items()
)

__all__ = ["H2O", "POLICIES", "TOVA", "Full", "Scissorhands", "StreamingLLM"]
