"""The C-backed policies: one module per policy, sharing :mod:`._base`.

Each module whose name does not start with ``_`` is one policy: its class and, beside
it, its :class:`~scissorhands.options.PolicySpec` as ``SPEC``, which the registry
discovers (:func:`scissorhands._registry.discover`); nothing here names a policy.
"""

from scissorhands._registry import PolicyRegistry, backend_registry
from scissorhands.policies._base import NativePolicy

#: Registry name -> class, in the registry's order, each found where its
#: :class:`~scissorhands.options.PolicySpec` says (``module``, ``class_name``); every
#: generic test and the CLI iterate it; an unknown name raises
#: :class:`~scissorhands.errors.UnknownPolicyError` listing the known ones.
POLICIES: PolicyRegistry[type[NativePolicy]] = backend_registry(__name__)
# Each class is also an attribute of this package (``scissorhands.policies.H2O``).
globals().update({cls.__name__: cls for cls in POLICIES.values()})

__all__ = sorted(["POLICIES", *(cls.__name__ for cls in POLICIES.values())])
