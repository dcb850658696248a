"""Exceptions raised by scissorhands.

Every error the library raises on bad input derives from :class:`ScissorhandsError`,
and also from the built-in class a caller would expect (``TypeError`` for a value of
the wrong kind, ``ValueError`` for a value out of range), so ``except ValueError``
keeps working in code that does not know this library.  A call that raises leaves the
policy exactly as it was.
"""

from __future__ import annotations

__all__ = ["InvalidInputError", "InvalidTypeError", "ScissorhandsError", "UnknownPolicyError"]


class ScissorhandsError(Exception):
    """Base class of every error raised by scissorhands."""


class InvalidTypeError(ScissorhandsError, TypeError):
    """A value of the wrong kind: a bool, float or str where an integer belongs,
    or attention weights that are not real numbers."""


class InvalidInputError(ScissorhandsError, ValueError):
    """A value of the right kind but out of range: a negative or out-of-order position,
    attention of the wrong length or rank, NaN/inf/negative weights, or an inconsistent
    budget, recent window or sink count."""


class UnknownPolicyError(InvalidInputError, KeyError):
    """A policy name the registry does not know, from :func:`~scissorhands.options.policy_spec`
    or a lookup in ``POLICIES``: an :class:`InvalidInputError` and also the ``KeyError``
    a mapping's lookup raises, with a message that lists the known names."""

    __str__ = BaseException.__str__  # the message as given, not quoted as KeyError's is
