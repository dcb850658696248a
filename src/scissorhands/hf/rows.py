"""The bank of policy rows a cache drives: one row per (layer, KV head), layer-major.

The rows are held either by one fused policy object (``heads = layers * heads per
layer``: one C call per step for the whole model) or by one policy object per layer;
rows are independent, so both decide exactly alike.  Policies are duck-typed (either
backend, or your own): ``prefill``, ``step(..., return_indices=True)``,
``evict(..., return_indices=True)``, ``kept_count`` and ``kept``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from ..options import PolicyOptions, make_policy

__all__ = ["PolicyRows"]


class PolicyRows:
    """One policy row per (layer, head), behind one call per step.

    Parameters
    ----------
    policies : one policy, or a sequence of one per layer
        Fresh (holding only position 0).  One policy: its rows are every layer's
        heads, layer-major (row ``layer * heads_per_layer + head``).  A sequence: one
        policy of ``heads_per_layer`` rows per layer.
    num_layers, heads_per_layer : int
    budget : int, optional
        Per-call budget for every ``step``/``evict``; None uses each policy's own.

    Raises
    ------
    InvalidInputError
        A policy that is not fresh or has the wrong number of rows, or a sequence
        without one policy per layer.
    """

    def __init__(self, policies: Sequence[Any] | Any, num_layers: int, heads_per_layer: int,
                 budget: int | None = None, head_mode: str = "per-head") -> None:
        self.fused = hasattr(policies, "step")
        self.policies = [policies] if self.fused else list(policies)
        self.num_layers = num_layers
        self.heads_per_layer = heads_per_layer
        self.rows = num_layers * heads_per_layer
        rows_expected = self.rows if self.fused else heads_per_layer
        if not self.fused and len(self.policies) != num_layers:
            raise InvalidInputError(
                f"need one policy per layer: {num_layers}, got {len(self.policies)}"
            )
        for index, policy in enumerate(self.policies):
            kept = np.asarray(policy.kept)
            rows = 1 if kept.ndim == 1 else kept.shape[0]
            if rows != rows_expected or policy.kept_count() != 1:
                what = "the fused policy" if self.fused else f"policy {index}"
                raise InvalidInputError(
                    f"{what} must be fresh with heads={rows_expected} "
                    f"(head_mode {head_mode!r}), got {rows} rows holding {policy.kept_count()}"
                )
        self.budget = budget

    @classmethod
    def build(cls, name: str, budget: int | None, options: PolicyOptions | None, *,
              num_layers: int, heads_per_layer: int, fused: bool = True,
              backend: str = "native", head_mode: str = "per-head") -> PolicyRows:
        """Rows of registry policy ``name`` configured by ``options``
        (:func:`scissorhands.options.make_policy`): one fused object, or one per layer."""
        def one(rows: int) -> Any:
            return make_policy(name, budget, options, heads=rows, backend=backend)

        policies = one(num_layers * heads_per_layer) if fused else [one(heads_per_layer) for _ in range(num_layers)]
        return cls(policies, num_layers, heads_per_layer, budget=budget, head_mode=head_mode)

    def budgets(self) -> set[Any]:
        """The budgets the rows evict to (the per-call one, or each policy's own)."""
        if self.budget is not None:
            return {self.budget}
        return {getattr(p, "budget", None) for p in self.policies}

    def kept(self, layer: int) -> np.ndarray:
        """Positions held by ``layer``'s rows: ``uint32``, ``(heads_per_layer, n)``."""
        if self.fused:
            kept = np.asarray(self.policies[0].kept, dtype=np.uint32)
            return kept.reshape(self.num_layers, self.heads_per_layer, -1)[layer]
        return np.asarray(self.policies[layer].kept, dtype=np.uint32).reshape(self.heads_per_layer, -1)

    def fresh(self) -> bool:
        """Whether every row holds only position 0."""
        return all(policy.kept_count() == 1 for policy in self.policies)

    def call(self, method: str, *args: Any) -> np.ndarray:
        """Call ``method(*args, budget, return_indices=True)`` on the policies; return the
        victims' kept-order slots as ``(rows, k)`` int64.

        ``args`` end with the attention as ``(rows, ...)`` when the method takes one.

        Raises
        ------
        InvalidInputError
            Layers evicting different counts (policies with different budgets).
        """
        budget = self.budget
        if self.fused:
            policy = self.policies[0]
            if self.rows == 1 and args:  # a single-row policy takes 1-D weights
                args = (*args[:-1], args[-1][0])
            out = getattr(policy, method)(*args, budget, return_indices=True)[1]
            return np.asarray(out, dtype=np.int64).reshape(self.rows, -1)
        heads = self.heads_per_layer
        slots = []
        if args:
            weights = args[-1].reshape(self.num_layers, heads, *args[-1].shape[1:])
            if heads == 1:
                weights = weights[:, 0]
            for policy, row in zip(self.policies, weights):
                call = getattr(policy, method)
                slots.append(call(*args[:-1], row, budget, return_indices=True)[1])
        else:
            for policy in self.policies:
                slots.append(getattr(policy, method)(budget, return_indices=True)[1])
        try:
            victims = np.array(slots, dtype=np.int64)
            if victims.size % self.rows:
                raise ValueError
        except ValueError:
            counts = sorted({np.asarray(s).reshape(heads, -1).shape[1] for s in slots})
            raise InvalidInputError(
                f"layers evicted different counts {counts}: every layer must keep the "
                "same number of positions (give all policies the same budget, or pass budget=)"
            ) from None
        return victims.reshape(self.rows, victims.size // self.rows)

    def prefill(self, means: np.ndarray) -> None:
        """Each row's ``prefill`` with its ``(q, q)`` prompt attention; ``means`` is
        ``(rows, q, q)``."""
        q = means.shape[-1]
        if self.fused:
            self.policies[0].prefill(means if self.rows > 1 else means[0])
            return
        per_layer = means.reshape(self.num_layers, self.heads_per_layer, q, q)
        for policy, mean in zip(self.policies, per_layer):
            policy.prefill(mean if self.heads_per_layer > 1 else mean[0])
