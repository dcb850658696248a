"""``scissorhands`` with decode steps that never evict: an experiment, not a mode of the package.

Runs ``python -m scissorhands`` (any command and flags) with every decode step's eviction
budget made huge (``step_rows(pos, weights, 2**20)``), so that after a prompt the rows hold
what the prompt's end (or the prompt's chunks) left plus every generated token.  Comparing
a ``tasks`` grid run this way with the same grid run normally shows whether eviction during
the answer loses what the prompt's end kept: the command and its table are in
docs/tasks.md ("Does decoding lose the fact after the prompt's end?"), for example::

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 PYTHONPATH=src python scripts/decode_without_eviction.py tasks \\
        --tasks sh_fact_once --lengths 512 --budgets 1/4 --samples 10 --configs recommended
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from scissorhands.hf import rows

#: A per-call budget no row reaches: the decode step admits its token and evicts nothing.
UNBOUNDED = 1 << 20


def _step_without_eviction(self: rows.PolicyRows, pos: int, weights: np.ndarray | None) -> Any:
    """:meth:`PolicyRows.step` at a budget no row reaches (the votes and scores still
    update, as they would)."""
    parts = []
    for _, policy, group, _ in self._each():
        width = int(np.asarray(policy.counts).max(initial=0))
        w = None if weights is None else np.ascontiguousarray(weights[group][:, :width])
        parts.append((group, policy.step_rows(pos, w, UNBOUNDED)))
    return self._merge(parts)


if __name__ == "__main__":
    rows.PolicyRows.step = _step_without_eviction  # type: ignore[method-assign]
    from scissorhands.commands import cli

    sys.exit(cli.main(sys.argv[1:]))
