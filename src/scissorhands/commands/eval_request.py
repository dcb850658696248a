"""What one ``eval`` or ``record`` run is asked for (:class:`EvalRequest`,
:class:`RecordRequest`) and an ``eval`` run once its arguments are checked
(:class:`_EvalPlan`): plain data that :mod:`.evaluate` fills and runs and
:mod:`.eval_output` reports, so neither of those imports the other's data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scissorhands.options import MODEL_POLICIES, RECOMMENDED

__all__ = ["EvalRequest", "RecordRequest"]


@dataclass
class EvalRequest:
    """What one ``eval`` run measures.

    Attributes
    ----------
    tokens : int
        Tokens of text, prompt included (default 512).
    prompt_tokens : int, optional
        Tokens consumed by the first forward, the policies' prompt chunk (default 64).
    budgets : list of int, optional
        Default: N/8 and N/5, rounded down.
    policies : sequence of str
        Registry names (and presets); the full cache always runs (the reference).
    values : mapping
        Option name -> values to sweep (None or missing: each policy's default).
    head_mode : {"per-head", "mean"}
    cache_mode : {"reuse", "compact"}
    backend : {"native", "reference"}
    text, model : str, optional
        The text file (default: :func:`default_text`) and the model (default: the
        SmolLM2-135M GGUF).
    json_path, plot : str, optional
        Also write the results as JSON / draw perplexity against budget.
    progress : bool
        A progress bar on stderr.
    attention : {"eager", "sdpa"}
        The attention implementation the model is loaded with (default eager: its own
        weights reach the policies; under sdpa the cache computes them).
    threads : int or None
        torch threads (default 1: as fast as two for this memory-bound model on this
        machine's two cores, and immune to the 10x slowdown two threads suffer when
        another process shares the cores); None leaves torch's default.
    hindsight : int or None
        ``W`` >= 1: also run the hindsight reference at every budget, each decision
        reading the next ``W`` decode steps of the full run's attention (default None:
        not run).  A value below 1 or not an integer is refused before the model loads.
    """

    tokens: int = 512
    prompt_tokens: int | None = None
    budgets: list[int] | None = None
    policies: Sequence[str] = (*MODEL_POLICIES, RECOMMENDED.name)
    values: Mapping[str, Sequence[Any] | None] = field(default_factory=dict)
    head_mode: str = "per-head"
    cache_mode: str = "reuse"
    backend: str = "native"
    text: str | None = None
    model: str | None = None
    json_path: str | None = None
    plot: str | None = None
    progress: bool = True
    attention: str = "eager"
    threads: int | None = 1
    hindsight: int | None = None


@dataclass
class RecordRequest:
    """What one ``record`` run stores: ``tokens`` tokens of ``text`` (the first
    ``prompt_tokens`` in one forward), the attention of ``layers`` (None: all), to
    ``out``."""

    tokens: int = 512
    prompt_tokens: int | None = None
    layers: list[int] | None = None
    out: str = "trace.npz"
    text: str | None = None
    model: str | None = None
    progress: bool = True
    attention: str = "eager"
    threads: int | None = 1


@dataclass
class _EvalPlan:
    """An ``eval`` run, its arguments checked: the counts, budgets and configurations,
    and the batch after the full cache (each budget's runs, then its hindsight one as the
    budget itself)."""

    hf: Any
    tokens: int
    prompt_tokens: int
    window: int | None
    budgets: list[int]
    names: list[str]
    runs: list[Any]
    notes: list[str]
    batch: list[Any]
