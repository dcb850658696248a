"""The registry: every policy's :class:`~scissorhands._policy_spec.PolicySpec` by
registry name (:data:`SPECS`, in table order), the names, the policies the real-model
commands run by default, the lookup of a name (:func:`policy_spec`) and of a backend's
classes (:func:`policy_classes`).  Re-exported by :mod:`scissorhands.options`.

No policy is named here: each module of :mod:`scissorhands.policies` whose name does not
start with ``_`` declares its policy as a module-level ``SPEC`` beside its class, and
:func:`discover` finds them (``pkgutil``), ordered by :attr:`PolicySpec.order
<scissorhands._policy_spec.PolicySpec.order>`.  :data:`SPECS`, :data:`POLICY_NAMES` and
:data:`MODEL_POLICIES` are built on first use (the package's import uses them: ``import
scissorhands`` builds them), since the policy modules import the shared machinery that
imports this module; no policy module may read them at its import.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import InvalidInputError, ScissorhandsError, UnknownPolicyError

if TYPE_CHECKING:
    from ._policy_spec import PolicySpec

    #: Every policy, by registry name, in table order (ascending ``order``).
    SPECS: dict[str, PolicySpec]
    #: The registry names, in table order.
    POLICY_NAMES: tuple[str, ...]
    #: What the real-model commands (``eval``, ``longctx``) run unless ``--policies``
    #: says otherwise: the policies whose spec sets ``model_runs``, in table order.
    MODEL_POLICIES: tuple[str, ...]

__all__ = ["BACKENDS", "MODEL_POLICIES", "POLICY_NAMES", "POLICY_PACKAGE", "SPECS", "PolicyRegistry",
           "backend_registry", "declared_spec", "discover", "policy_classes", "policy_spec"]

#: The two implementations of every policy: ``native`` (the C core) and ``reference``
#: (pure Python, :mod:`scissorhands.reference`).
BACKENDS = ("native", "reference")
#: The package whose public modules each declare one policy (``SPEC``).
POLICY_PACKAGE = "scissorhands.policies"
#: The tables built from the discovered specs, on first use.
DISCOVERED = ("SPECS", "POLICY_NAMES", "MODEL_POLICIES")
_discovering = False


def discover(package: str = POLICY_PACKAGE) -> dict[str, PolicySpec]:
    """Every policy ``package`` declares: the ``SPEC`` of each of its modules whose name
    does not start with ``_``, by registry name, in ascending ``order``.

    Raises
    ------
    ScissorhandsError
        A public module without a ``SPEC``, or two specs with the same name or order.
    ImportError
        A policy module cannot be imported (the native extension not built).
    """
    root = importlib.import_module(package)
    specs = []
    for info in pkgutil.iter_modules(root.__path__):
        if info.name.startswith("_"):
            continue
        spec = getattr(importlib.import_module(f"{package}.{info.name}"), "SPEC", None)
        if spec is None:
            raise ScissorhandsError(f"{package}.{info.name} declares no SPEC (a policy module declares its PolicySpec)")
        specs.append(spec)
    specs.sort(key=lambda spec: spec.order)
    for what in ("name", "order"):
        values = [getattr(spec, what) for spec in specs]
        if len(set(values)) != len(values):
            raise ScissorhandsError(f"two policies of {package} have the same {what}: {values}")
    return {spec.name: spec for spec in specs}


def __getattr__(name: str) -> Any:
    """:data:`SPECS`, :data:`POLICY_NAMES` and :data:`MODEL_POLICIES`, discovered on first use
    and kept as this module's attributes.

    Raises
    ------
    AttributeError
        Any other name.
    RuntimeError
        Asked for while the policy modules are being imported (a module of
        :data:`POLICY_PACKAGE` reading the registry at its import).
    """
    global _discovering
    if name not in DISCOVERED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _discovering:
        raise RuntimeError(f"{__name__}.{name} asked for while the policy modules are imported: a module of "
                           f"{POLICY_PACKAGE} must not read the registry at its import")
    _discovering = True
    try:
        specs = discover()
    finally:
        _discovering = False
    globals().update(SPECS=specs, POLICY_NAMES=tuple(specs),
                     MODEL_POLICIES=tuple(n for n, spec in specs.items() if spec.model_runs))
    return globals()[name]


def _table(name: str) -> Any:
    """This module's :data:`SPECS`, :data:`POLICY_NAMES` or :data:`MODEL_POLICIES` (as
    found by attribute lookup, so discovered if not yet)."""
    return globals()[name] if name in globals() else __getattr__(name)


def declared_spec(cls: type) -> PolicySpec:
    """The spec of the policy class ``cls`` (a class with a registry ``name``), readable
    as its class body ends, while the registry may still be discovering: the ``SPEC`` of
    the module defining ``cls`` when it has that name, else :func:`policy_spec`'s.

    Raises
    ------
    UnknownPolicyError
        Neither names the class's ``name``.
    """
    name = getattr(cls, "name", None)
    spec: PolicySpec | None = getattr(sys.modules.get(cls.__module__), "SPEC", None)
    if spec is not None and spec.name == name:
        return spec
    return policy_spec(name)  # type: ignore[arg-type]  # refused there when not a str


def policy_spec(name: str) -> PolicySpec:
    """The spec of registry name ``name``.

    Raises
    ------
    UnknownPolicyError
        Unknown name (an :class:`~scissorhands.errors.InvalidInputError`; the message
        lists the known ones).
    """
    try:
        return _table("SPECS")[name]
    except (KeyError, TypeError):
        raise _unknown_policy(name) from None


_P = TypeVar("_P")


def _unknown_policy(name: object) -> UnknownPolicyError:
    return UnknownPolicyError(f"unknown policy {name!r}; known: {', '.join(_table('POLICY_NAMES'))}")


class PolicyRegistry(dict[str, _P]):
    """Registry name -> policy class (``POLICIES`` of :mod:`scissorhands.policies` and of
    :mod:`scissorhands.reference`): a plain ``dict`` whose lookup of an unknown name
    raises :class:`~scissorhands.errors.UnknownPolicyError` (a ``KeyError``) listing the
    known names."""

    def __missing__(self, name: str) -> _P:
        raise _unknown_policy(name)

def backend_registry(package: str) -> PolicyRegistry[Any]:
    """A backend's ``POLICIES``: registry name -> the class each spec names
    (``class_name``) in ``package``'s module of the spec's ``module``, in table order;
    :mod:`scissorhands.policies` and :mod:`scissorhands.reference` build theirs with it."""
    return PolicyRegistry((name, getattr(importlib.import_module(f"{package}.{spec.module}"), spec.class_name))
                          for name, spec in _table("SPECS").items())


def policy_classes(backend: str = "native") -> Mapping[str, type]:
    """The registry of a backend: registry name -> class.

    Raises
    ------
    InvalidInputError
        Unknown backend.
    ScissorhandsError
        The native extension cannot be imported (not built).
    """
    if backend not in BACKENDS:
        raise InvalidInputError(f"backend must be 'native' or 'reference', got {backend!r}")
    module = "scissorhands.policies" if backend == "native" else "scissorhands.reference"
    try:
        registry: Mapping[str, type] = importlib.import_module(module).POLICIES
    except ImportError as exc:
        raise ScissorhandsError(
            f"the {backend} backend is not available ({exc}); build the extension "
            "(pip install -e .) or use the reference backend") from None
    return registry

