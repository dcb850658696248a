"""``python -m scissorhands longctx``: what a bounded cache costs and buys as the context grows.

One long text (the standard library's ``pydoc_data.topics``: 113k tokens of prose and
code, offline everywhere) is read by the real model to growing context lengths (1k to
16k tokens by default).  At each length a window of tokens is decoded one per forward,
teacher-forced: milliseconds per decode step, KV bytes held, the process's resident
memory and the window's perplexity, for the full cache (transformers' own
``DynamicCache``, up to the model's trained context) and for each policy, budget and
position mode (:func:`scissorhands.hf.longctx.long_context_run`).

A command, not a ``python -m bench`` group: it needs the model and transformers, measures
perplexity as well as time, and its parts (``--policies full``, then each policy) are
separate runs that ``report`` merges, as it merges ``eval`` runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scissorhands.errors import ScissorhandsError
from scissorhands.models import trained_context_of
from scissorhands.options import config_label, sweep

from .evaluate import (
    _checkpoint_config,
    _fail,
    _paths_then_hf,
    in_flag_names,
    read_text,
    tokenize_prefix,
)
from .generate import peak_rss_bytes

__all__ = ["DEFAULT_LENGTHS", "LongContextRequest", "run_longctx"]

#: Context lengths measured when none are given.
DEFAULT_LENGTHS = (1024, 2048, 4096, 8192, 12288, 16384)


@dataclass
class LongContextRequest:
    """What one ``longctx`` run measures (see the module docstring).

    ``policies`` may include ``full`` (the stock cache, up to the trained context);
    ``values`` sweeps options as for ``eval``; ``positions`` lists the position modes each
    evicting configuration runs with."""

    lengths: Sequence[int] = DEFAULT_LENGTHS
    window: int = 128
    budgets: Sequence[int] = (1024, 2048)
    policies: Sequence[str] = ("full", "scissorhands", "streaming-llm")
    values: Mapping[str, Sequence[Any] | None] = field(default_factory=dict)
    positions: Sequence[str] = ("original",)
    chunk: int = 256
    text: str | None = None
    model: str | None = None
    attention: str = "sdpa"
    threads: int | None = 1
    backend: str = "native"
    json_path: str | None = None
    plot: str | None = None
    progress: bool = True


def _check_longctx(request: LongContextRequest) -> tuple[Any, list[int], list[Any], list[str]] | str:
    """Every argument checked before the model loads: ``(hf, lengths, runs, notes)``,
    or the message of the first problem."""
    lengths = sorted({int(n) for n in request.lengths})
    window = int(request.window)
    if window < 2:
        return f"--window must be at least 2, got {window}"
    if not lengths or lengths[0] <= window:
        return f"--lengths must exceed the window ({window}), got {lengths}"
    try:
        runs, notes = sweep(request.policies, request.budgets, request.values, by="policy")
    except ScissorhandsError as exc:
        return str(exc)
    if not runs:
        return "no configuration to run: " + "; ".join(notes)
    hf = _paths_then_hf(request.text, request.model, [("--json", request.json_path)], [("--plot", request.plot)],
                        lengths[-1])
    if isinstance(hf, str):
        return hf
    for mode in request.positions:
        if mode not in hf.POSITION_MODES:
            return f"--positions must be among {', '.join(hf.POSITION_MODES)}, got {mode!r}"
    config = _checkpoint_config(request.model)
    problem = None if config is None else _check_caches(hf, config, runs, request)
    return problem or (hf, lengths, runs, notes)


def _check_caches(hf: Any, config: Any, runs: list[Any], request: LongContextRequest) -> str | None:
    """Why an evicting configuration cannot run on a model of ``config`` in one of the
    position modes (a pool that does not divide its rows, a pool with ``cache``
    positions), or None: each cache is built, holding nothing."""
    for run in runs:
        for mode in ([] if run.policy == "full" else dict.fromkeys(request.positions)):
            try:
                hf.EvictingCache(config, run.policy, run.budget, run.options, backend=request.backend,
                                 positions=mode)
            except ScissorhandsError as exc:
                return in_flag_names(str(exc))
    return None


def _plan_lengths(runs: list[Any], request: LongContextRequest, lengths: list[int], trained: int,
                  notes: list[str]) -> list[tuple[Any, str, list[int]]]:
    """``(run, position mode, lengths)`` per run: the full cache once, at the lengths
    within the trained context (a note when none is), each policy in every mode."""
    plan = []
    for run in runs:
        for mode in (["original"] if run.policy == "full" else list(dict.fromkeys(request.positions))):
            usable = [n for n in lengths if run.policy != "full" or not trained or n <= trained]
            if usable:
                plan.append((run, mode, usable))
            else:
                notes.append(f"skipped the full cache: every length exceeds the trained context ({trained})")
    return plan


def _measure_lengths(hf: Any, model: Any, ids: list[int], plan: list[tuple[Any, str, list[int]]],
                     request: LongContextRequest) -> list[dict[str, Any]]:
    """Each planned run's rows (:func:`scissorhands.hf.long_context_run`), with its
    label, position mode, seconds and the peak resident memory after it."""
    from tqdm import tqdm

    total = sum(usable[-1] for _, _, usable in plan)
    bar = tqdm(total=total, disable=not request.progress, unit="token", file=sys.stderr)
    results = []
    for run, mode, usable in plan:
        label = config_label(run.policy, run.values, run.window_spec)
        bar.set_description(f"{run.policy}@{run.budget} {mode}" if run.budget else run.policy)
        started = time.perf_counter()
        rows = hf.long_context_run(model, ids, usable, policy=run.policy, budget=run.budget, options=run.options,
                                   positions=mode, window=int(request.window), chunk=int(request.chunk),
                                   backend=request.backend, progress=bar.update)
        results.append({**run.as_dict(), "label": label, "positions": mode, "rows": rows,
                        "seconds": time.perf_counter() - started, "peak_rss_bytes": peak_rss_bytes()})
    bar.close()
    return results


def run_longctx(request: LongContextRequest) -> int:
    """Run the configurations, print the table, write the JSON/plot. Every argument is
    checked before the model loads. Returns 0; raises :class:`~scissorhands.errors.ScissorhandsError`
    on a bad argument."""
    checked = _check_longctx(request)
    if isinstance(checked, str):
        return _fail(checked)
    hf, lengths, runs, notes = checked
    window, chunk = int(request.window), int(request.chunk)
    hf.set_threads(request.threads)
    try:
        text, source = read_text(request.text)
        start = time.perf_counter()
        model, tokenizer = hf.load_model(request.model, progress=request.progress,
                                         attn_implementation=request.attention)
        load_seconds = time.perf_counter() - start
        ids = tokenize_prefix(tokenizer, text, lengths[-1])
    except (ScissorhandsError, OSError, ValueError) as exc:
        return _fail(str(exc))
    problem = _check_caches(hf, model.config, runs, request)
    if problem:  # before any part runs
        return _fail(problem)
    trained = trained_context_of(model.config)
    plan = _plan_lengths(runs, request, lengths, trained, notes)
    results = _measure_lengths(hf, model, ids, plan, request)
    document: dict[str, Any] = {
        "format": "scissorhands.longctx",
        "version": 1,
        "config": {
            "lengths": lengths, "window": window, "chunk": chunk, "attention": request.attention,
            "trained_context": trained, "backend": request.backend,
            "text": {"source": source, "token_ids_sha256": hashlib.sha256(
                np.asarray(ids, dtype="<i8").tobytes()).hexdigest()},
            "model": hf.model_info(model, request.model), "environment": hf.environment(),
        },
        "model_load_seconds": load_seconds,
        "notes": notes,
        "results": results,
    }
    _print_longctx(document, request)
    if request.json_path:
        with open(request.json_path, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2)
            handle.write("\n")
    if request.plot:
        from .report import plot_longctx

        plot_longctx([document], request.plot)
    return 0


def _print_longctx(document: dict[str, Any], request: LongContextRequest) -> None:
    """The setup line, the table and the notes, on stdout."""
    from .report import format_longctx

    config = document["config"]
    print(f"{os.path.basename(config['model']['path'])}: windows of {config['window']} decoded tokens "
          f"ending at each length, prompt chunks of {config['chunk']}; attention {request.attention}; trained "
          f"context {config['trained_context']}; torch threads {config['environment']['torch_threads']}")
    print(format_longctx([document]))
    for note in document["notes"]:
        print(f"note: {note}")
