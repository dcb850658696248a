"""Benchmarks of scissorhands: ``python -m bench`` from the repository root.

Times the C core through the public Python API, per decode step and per eviction,
across budgets and head counts, beside the baselines that say whether the C is worth
it: the pure-Python reference (:mod:`scissorhands.reference`), a numpy-vectorised
implementation of the same policies (:mod:`bench.numpy_policy`), the no-op cffi call
with the same arguments (``lib.sh_noop_step``, the floor of the call overhead) and a
memory-bandwidth floor for the large batched calls. Reports ratios and the design's
targets (``DESIGN.md`` §7); nothing is asserted. ``--quick`` is a smoke run,
``--json PATH`` saves every figure with the machine's description, ``--case NAME``
selects, ``--list`` names the cases.
"""
