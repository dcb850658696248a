"""Real-model evaluation (``python -m scissorhands eval``) and trace recording (``record``).

Protocol (so that every number is comparable)
---------------------------------------------
* Teacher forcing on a real text: the first ``tokens`` tokens (default 512) of the text
  (default: the standard library's ``pydoc_data.topics``, Python license, concatenated
  in sorted key order, so it is available offline everywhere).
* The prompt, the first ``prompt_tokens`` tokens (default 64), is consumed in one
  forward and handed to each policy's ``prefill``; then one token per decode step.
* Perplexity, next-token agreement with the full cache (same arg-max) and top-1
  accuracy are reported over the **same** target tokens for every policy and budget:
  positions ``max(budgets) .. N-1`` (a target at position ``t`` is predicted from the
  logits of position ``t-1``).
* Per policy, budget and configuration, also: the KV positions held per layer after
  each step (max/mean), and per decode step the policy's own time, the cache's
  bookkeeping time (GQA mean, reordering the weights to kept order, slot or gather work)
  and the model's forward time, in milliseconds, with policy + bookkeeping as a
  percentage of the forward (``overhead_percent_of_forward``), and the part of the
  forward spent writing keys and values into the cache (``cache_update_ms_per_step``).
* A sweep runs every combination of the option values given
  (:func:`scissorhands.options.sweep`: a recent window in positions or as a fraction of
  each budget, the sinks of every policy taking them, ...) at every budget;
  combinations a policy refuses for a budget are skipped with a note.
* With ``hindsight=W`` (``--hindsight W``), one more configuration per budget: the
  hindsight reference of :mod:`scissorhands.hindsight` (evicting the held position the
  next ``W`` decode steps of the full run attend to least), its schedule computed from
  the full run's attention while it runs; and a gap-closed figure per configuration
  (:func:`scissorhands.hindsight.gap_closed`).

This module imports neither torch nor the command line: the model work is
:mod:`scissorhands.hf`'s, imported when a run starts; what a run reports (rows, table,
plot, JSON) is :mod:`scissorhands.commands.eval_output`'s.
"""

from __future__ import annotations

import numbers
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from scissorhands.errors import ScissorhandsError
from scissorhands.models import model_problem, trained_context_of
from scissorhands.options import OPTIONS, PRESETS, policy_classes, sweep, with_presets

from .eval_output import eval_document, eval_results, format_table, plot_results, print_eval, write_json
from .eval_request import EvalRequest, RecordRequest, _EvalPlan
from .paths import input_problem, output_problem, plot_problem

__all__ = [
    "EvalRequest",
    "RecordRequest",
    "default_budgets",
    "default_text",
    "format_table",
    "plot_results",
    "read_text",
    "run_eval",
    "run_record",
    "tokenize_prefix",
]

#: Tokens consumed by the first forward when not given.
DEFAULT_PROMPT_TOKENS = 64
_TEXT_SOURCE_DEFAULT = (
    "pydoc_data.topics (Python standard library, PSF license), topics in sorted key order"
)


# --------------------------------------------------------------------------- inputs


def default_text() -> str:
    """The default evaluation text: ``pydoc_data.topics`` concatenated in sorted key order.

    Real English prose with code, shipped with every CPython (PSF license), so the
    evaluation runs offline.  The text differs between Python versions; the JSON output
    records the Python version and a hash of the token ids.
    """
    from pydoc_data.topics import topics

    return "".join(topics[key] for key in sorted(topics))


def read_text(path: str | os.PathLike[str] | None) -> tuple[str, str]:
    """Return ``(text, source description)`` from a UTF-8 file, or the default text."""
    if path is None:
        return default_text(), _TEXT_SOURCE_DEFAULT
    with open(path, encoding="utf-8") as handle:
        return handle.read(), os.fspath(path)


def default_budgets(tokens: int) -> list[int]:
    """The default budgets: ``N/8`` and ``N/5``, rounded down (64 and 102 at N = 512)."""
    return sorted({max(1, tokens // 8), max(1, tokens // 5)})


def tokenize_prefix(tokenizer: Any, text: str, tokens: int) -> list[int]:
    """The first ``tokens`` token ids of ``text``.

    Only a prefix of the text is tokenised (growing until it yields comfortably more
    than ``tokens`` ids, so the cut cannot change the ids kept).

    Raises
    ------
    ScissorhandsError
        The whole text has fewer than ``tokens`` tokens.
    """
    chars = max(1024, tokens * 8)
    while True:
        ids = list(tokenizer(text[:chars], add_special_tokens=True)["input_ids"])
        if len(ids) >= tokens + 64 or chars >= len(text):
            break
        chars *= 2
    if len(ids) < tokens:
        raise ScissorhandsError(f"the text has only {len(ids)} tokens, {tokens} requested")
    return ids[:tokens]


# --------------------------------------------------------------------------- commands


def _fail(message: str) -> NoReturn:
    """Refuse the user's input: the command line prints ``message`` under the command's usage."""
    raise ScissorhandsError(message)


def _import_hf() -> Any:
    """Import :mod:`scissorhands.hf`, turning a missing torch/transformers into a message."""
    try:
        from scissorhands import hf
    except ImportError as exc:
        raise ScissorhandsError(
            f"the real-model commands need torch and the [hf] extra (see the README): {exc}"
        ) from None
    return hf


def _paths_then_hf(text: str | None, model: str | None, outputs: Sequence[tuple[str, str | None]],
                   plots: Sequence[tuple[str, str | None]] = (), tokens: int | None = None) -> Any:
    """The user's paths checked (:func:`check_paths`), then :mod:`scissorhands.hf`
    imported: the module, or the message of the first problem (a ``str``)."""
    problem = check_paths(text, model, outputs, plots, tokens)
    if problem:
        return problem
    try:
        return _import_hf()
    except ScissorhandsError as exc:
        return str(exc)


def _load_inputs(hf: Any, text_path: str | None, model_path: str | None, tokens: int, progress: bool,
                 attention: str) -> tuple[str, Any, Any, float, list[int]] | str:
    """Read the text, load the model and tokenize the first ``tokens`` tokens:
    ``(source, model, tokenizer, load_seconds, ids)``, or the message of what failed."""
    try:
        text, source = read_text(text_path)
    except (OSError, ValueError) as exc:
        return f"cannot read --text: {exc}"
    try:
        start = time.perf_counter()
        model, tokenizer = hf.load_model(model_path, progress=progress, attn_implementation=attention)
        load_seconds = time.perf_counter() - start
        ids = tokenize_prefix(tokenizer, text, tokens)
    except (ScissorhandsError, OSError) as exc:
        return str(exc)
    return source, model, tokenizer, load_seconds, ids


def check_paths(text: str | None, model: str | None, outputs: Sequence[tuple[str, str | None]],
                plots: Sequence[tuple[str, str | None]] = (), tokens: int | None = None) -> str | None:
    """Why the user's paths cannot work (before any model loads), or None: ``--text``
    must be a readable UTF-8 file holding more than whitespace (and, with ``tokens``,
    not too short for them: :func:`text_too_short`), ``--model`` must exist, each output
    (flag, path) must go into an existing, writable directory, and each plot also needs
    matplotlib and a format it writes (:mod:`scissorhands.commands.paths`)."""
    problem = input_problem("--text", text, text=True) or (
        None if tokens is None else text_too_short("--text", text, tokens))
    if problem:
        return problem
    problem = model_problem(model)
    if problem is not None:
        return problem if model is None else f"--model {problem}"
    for flag, path in outputs:
        problem = output_problem(flag, path)
        if problem:
            return problem
    for flag, path in plots:
        problem = plot_problem(flag, path)
        if problem:
            return problem
    return None


def text_too_short(flag: str, path: str | None, tokens: int) -> str | None:
    """Why the text file ``path`` cannot hold ``tokens`` tokens whatever the tokenizer,
    or None: a tokenizer gives at most about one token per byte (a byte-level BPE one
    byte per token at worst, SentencePiece's byte fallback the same) and a few special
    ones, so fewer than ``tokens / 2 - 8`` bytes is refused before the model loads
    (and its tokenizer with it); a text between that and ``tokens`` is counted after."""
    if path is None or not os.path.isfile(path):
        return None
    size = os.path.getsize(path)
    if 2 * size + 16 < tokens:
        return f"{flag} {path}: {size} bytes cannot hold {tokens} tokens"
    return None


def _check_counts(tokens: int, prompt_tokens: int, prompt_given: bool, least: int) -> str | None:
    """Why ``--tokens``/``--prompt-tokens`` cannot work, naming the flag the user gave."""
    if tokens < least:
        return f"--tokens must be at least {least}, got {tokens}"
    if prompt_tokens >= tokens:
        if prompt_given:
            return f"--prompt-tokens {prompt_tokens} must be below --tokens ({tokens})"
        return (f"--tokens {tokens} leaves nothing to decode after the prompt (--prompt-tokens, "
                f"default {prompt_tokens}): give more tokens or a shorter --prompt-tokens")
    return None


#: The largest ``--hindsight`` window (the scheduler's limit, in decode steps).
MAX_HINDSIGHT = 2**31


def _check_hindsight(window: Any, tokens: int, prompt_tokens: int) -> str | None:
    """Why ``--hindsight`` cannot work, or None (None is off)."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
        return f"--hindsight must be a whole number of decode steps, at least 1, got {window!r}"
    if int(window) > MAX_HINDSIGHT:
        return f"--hindsight must be at most {MAX_HINDSIGHT} decode steps, got {window}"
    if tokens - 1 - prompt_tokens < 1:
        return (f"--hindsight {window} reads the decode steps, and --tokens {tokens} leaves none after the "
                f"prompt of {prompt_tokens} (the last token is only a target): give more tokens")
    return None


def _check_modes(hf: Any, request: EvalRequest) -> str | None:
    """Why ``--head-mode``, ``--cache-mode`` or ``--attention`` cannot work, or None."""
    if request.head_mode not in hf.HEAD_MODES:
        return f"--head-mode must be one of {', '.join(hf.HEAD_MODES)}, got {request.head_mode!r}"
    if request.cache_mode not in hf.CACHE_MODES:
        return f"--cache-mode must be one of {', '.join(hf.CACHE_MODES)}, got {request.cache_mode!r}"
    if request.attention not in hf.WRAPPED:
        return f"--attention must be one of {', '.join(hf.WRAPPED)}, got {request.attention!r}"
    return None


def _plan_eval(request: EvalRequest) -> _EvalPlan | str:
    """Every argument of ``eval`` checked, in the order the flags are explained: the
    plan, or the message of the first problem."""
    tokens = int(request.tokens)
    prompt_given = request.prompt_tokens is not None
    prompt_tokens = DEFAULT_PROMPT_TOKENS if request.prompt_tokens is None else int(request.prompt_tokens)
    window = request.hindsight
    problem = _check_counts(tokens, prompt_tokens, prompt_given, 3) or _check_hindsight(window, tokens, prompt_tokens)
    if problem:
        return problem
    budgets = sorted(set(request.budgets)) if request.budgets else default_budgets(tokens)
    if min(budgets) < 1 or max(budgets) > tokens - 1:
        given = "--budgets" if request.budgets else f"the default budgets (N/8, N/5 of --tokens {tokens})"
        return f"{given} must be in [1, {tokens - 1}] (targets are max(budgets)..N-1), got {budgets}"
    hf = _paths_then_hf(request.text, request.model, [("--json", request.json_path)], [("--plot", request.plot)],
                        tokens)
    if isinstance(hf, str):
        return hf
    problem = _check_modes(hf, request)
    if problem:
        return problem
    names = list(dict.fromkeys(request.policies))
    presets = [PRESETS[name] for name in names if name in PRESETS]
    try:
        runs, notes = sweep([name for name in names if name not in PRESETS], budgets, request.values)
        runs = with_presets(runs, presets, budgets, notes)
        for chosen in presets:
            if chosen.prompt_aware:
                fits = ("which every budget holds, so its end would evict nothing" if min(budgets) >= prompt_tokens
                        else "longer than some budgets: those rows evict while it is read")
                notes.append(f"{chosen.name} runs here without prompt_aware (eval reads a prompt of {prompt_tokens} "
                             f"tokens, {fits})")
        policy_classes(request.backend)
    except ScissorhandsError as exc:
        return str(exc)
    # The batch: each budget's configurations, then (with --hindsight) its hindsight one, by budget.
    batch: list[Any] = []
    for budget in budgets:
        batch += [run for run in runs[1:] if run.budget == budget]
        if window is not None:
            batch.append(budget)
    plan = _EvalPlan(hf, tokens, prompt_tokens, window, budgets, names, runs, notes, batch)
    config = _checkpoint_config(request.model)
    return plan if config is None else (_check_batch(plan, config, request) or plan)


def _checkpoint_config(model: str | None) -> Any:
    """The model's configuration when reading it costs nothing (a checkpoint
    directory's ``config.json``), else None (a GGUF file: its configuration comes with
    the model)."""
    if model is None or not os.path.isfile(os.path.join(model, "config.json")):
        return None
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model)
    except (OSError, ValueError):
        return None  # the model load reports it


def in_flag_names(message: str) -> str:
    """A library message in the command line's terms: each option's name
    (``recent_window``, ``pool``) as its flag (``--recent-window``, ``--pool``)."""
    for option in OPTIONS:
        message = re.sub(rf"\b{option.name}\b", option.flag, message)
    return message


def _check_batch(plan: _EvalPlan, config: Any, request: EvalRequest) -> str | None:
    """Why the evicting configurations cannot run on a model of ``config`` (a pool that
    does not divide a sequence's rows, ...), or None: the cache the batch will run is
    built, holding nothing; or a text past the model's trained context, which the full
    cache, the reference, cannot read with true positions."""
    trained = trained_context_of(config)
    if 0 < trained < plan.tokens:
        return (f"--tokens {plan.tokens} is past the model's trained context ({trained} tokens), where the full "
                "cache, eval's reference, reads positions it never learned: measure longer texts with "
                "`python -m scissorhands longctx --lengths N --positions cache`")
    configs = [plan.hf.PolicyConfig(run.policy, run.budget, run.options, request.backend)
               for run in plan.batch if not isinstance(run, int)]
    if not configs:
        return None
    try:
        plan.hf.EvictingCache(config, configs=configs, head_mode=request.head_mode, cache_mode=request.cache_mode)
    except ScissorhandsError as exc:
        return in_flag_names(str(exc))
    return None


def _measure(plan: _EvalPlan, model: Any, ids: list[int], request: EvalRequest) -> tuple[list[dict[str, Any]], float]:
    """The full cache and the batch in one pass of the model (one sequence each), or,
    with hindsight, the full cache alone first (its attention gives the schedules the
    batch replays): each sequence's measurements (the full cache's first) and the
    seconds the hindsight schedules took."""
    from tqdm import tqdm

    hf, window, prompt_tokens, backend = plan.hf, plan.window, plan.prompt_tokens, request.backend
    steps = plan.tokens - 1 - prompt_tokens + 1
    scheduler = None
    if window is not None:
        from scissorhands.hindsight import HindsightScheduler

        # The decode steps are positions prompt_tokens .. tokens - 2 (the last token is only a target).
        scheduler = HindsightScheduler(plan.budgets, int(window), prompt_tokens, plan.tokens - 2)
    batches = [plan.runs[:1], plan.batch] if scheduler is not None else [plan.runs[:1] + plan.batch]
    bar = tqdm(total=steps * len(batches), disable=not request.progress, unit="step", file=sys.stderr)
    measured: list[dict[str, Any]] = []
    schedule_seconds = 0.0
    for index, batch in enumerate(batches):
        bar.set_description("full cache" if len(batch) == 1 else f"{len(batch)} configurations")
        start = time.perf_counter()
        if index == 0:
            configs = [hf.PolicyConfig(run.policy, run.budget, run.options, backend) for run in batch]
            sink: dict[str, Any] = {} if scheduler is None else {"attention_sink": scheduler.push}
        else:
            finishing = time.perf_counter()
            schedules: dict[int, Any] = {} if scheduler is None else scheduler.finish()
            # The last W decisions (all of them when W covers the text) wait for the end.
            schedule_seconds += time.perf_counter() - finishing
            configs = [hf.HindsightConfig.of(schedules[item], backend) if isinstance(item, int)
                       else hf.PolicyConfig(item.policy, item.budget, item.options, backend) for item in batch]
            sink = {}
        out = hf.evaluate_batch(model, ids, configs, prompt_tokens=prompt_tokens, head_mode=request.head_mode,
                                cache_mode=request.cache_mode, progress=bar.update, **sink)
        wall = time.perf_counter() - start
        if index == 0 and scheduler is not None:
            schedule_seconds += out[0].get("tap_seconds", 0.0)
        for one in out:
            one["wall_seconds"] = wall
        measured.extend(out)
    bar.close()
    return measured, schedule_seconds


def run_eval(request: EvalRequest) -> int:
    """``python -m scissorhands eval``: perplexity and agreement per policy and budget.

    Every argument (counts, budgets, policies and options, paths, matplotlib and the
    format of a plot) is checked before the model loads; the configurations' fit to
    the model (a ``pool`` dividing a sequence's rows; ``tokens`` within its trained
    context) before it loads when the model is a checkpoint directory, else right
    after, before any run.  The full cache (the
    reference for agreement) and every other configuration run in one batch, each
    sequence with its own policy.  With ``hindsight``, the full cache runs alone first
    and also computes every budget's hindsight schedule from its attention, and the
    batch replays them (one more sequence per budget).
    Prints the table (and the notes).

    Returns the process exit status, 0.

    Raises
    ------
    ScissorhandsError
        A bad argument, before the work it would waste (the command line prints it
        under the command's usage, exit 2).
    """
    plan = _plan_eval(request)
    if isinstance(plan, str):
        return _fail(plan)
    plan.hf.set_threads(request.threads)
    loaded = _load_inputs(plan.hf, request.text, request.model, plan.tokens, request.progress, request.attention)
    if isinstance(loaded, str):
        return _fail(loaded)
    source, model, _tokenizer, load_seconds, ids = loaded
    problem = _check_batch(plan, model.config, request)
    if problem:
        return _fail(problem)
    measured, schedule_seconds = _measure(plan, model, ids, request)
    results = eval_results(plan, measured, schedule_seconds, ids)
    model_info = plan.hf.model_info(model, request.model)
    notes = plan.notes
    if plan.window is not None:
        notes = [*notes, (
            f"hindsight W={plan.window}: its schedule (every budget's) was computed from the full run's attention "
            f"during and right after the full run, {1e3 * schedule_seconds / max(measured[0]['decode_steps'], 1):.3f} "
            "ms per decode step, "
            "left out of the full row's model ms; its policy ms is only the replay of the schedule")]
    print_eval(plan, request, results, model_info, load_seconds, notes)
    if request.json_path:
        write_json(request.json_path,
                   eval_document(plan, request, results, model_info, source, ids, load_seconds, notes))
    if request.plot:
        plot_results(results, request.plot, title=f"N={plan.tokens}, head mode {request.head_mode}, scored "
                     f"{max(plan.budgets)}..{plan.tokens - 1}")
    return 0


def _check_layers(layers: Sequence[int], count: int) -> str | None:
    """Why ``--layers`` cannot be recorded from a model of ``count`` layers, or None."""
    layers = [int(i) for i in layers]
    if not layers or any(not 0 <= i < count for i in layers):
        return f"--layers must be in [0, {count - 1}], got {layers}"
    return None


def _save_trace(out: str, weights: Any, layers: list[int], prompt_tokens: int, model_info: dict[str, Any],
                source: str, ids: list[int], environment: dict[str, Any]) -> None:
    """Write ``record``'s trace with its metadata (:func:`scissorhands.commands.traces.save_recorded_trace`)."""
    from .traces import save_recorded_trace

    metadata = {
        "model": model_info,
        "text_source": source,
        "token_ids": [int(i) for i in ids],
        "head_reduction": "mean over the GQA group's query heads; the token's weight on itself "
        "excluded; not renormalised",
        "environment": environment,
    }
    # weights: float16 (len(layers), kv_heads, N (N - 1) / 2), step t at offset t (t - 1) / 2.
    save_recorded_trace(out, weights, layers, prompt_tokens=prompt_tokens,
                        model=os.path.basename(model_info["path"]), metadata=metadata)


def run_record(request: RecordRequest) -> int:
    """``python -m scissorhands record``: store a real model's full-cache attention trace.

    Per step ``t = 1..N-1``, per selected layer and KV head: the new token's attention
    over positions ``0..t-1`` (mean over the GQA group's query heads, its weight on
    itself excluded), float16, written through ``scissorhands.commands.traces.save_recorded_trace``.

    Returns the process exit status, 0.

    Raises
    ------
    ScissorhandsError
        A bad argument, before the work it would waste.
    """
    from tqdm import tqdm

    tokens = int(request.tokens)
    prompt_tokens = DEFAULT_PROMPT_TOKENS if request.prompt_tokens is None else int(request.prompt_tokens)
    if tokens < 2:
        return _fail(f"--tokens must be at least 2, got {tokens}")
    if prompt_tokens < 1:
        return _fail(f"--prompt-tokens must be at least 1, got {prompt_tokens}")
    hf = _paths_then_hf(request.text, request.model, [("--out", request.out)], tokens=tokens)
    if isinstance(hf, str):
        return _fail(hf)
    config = _checkpoint_config(request.model)
    if config is not None and request.layers is not None:  # the model's layers known before it loads
        problem = _check_layers(request.layers, int(config.get_text_config(decoder=True).num_hidden_layers))
        if problem:
            return _fail(problem)
    hf.set_threads(request.threads)
    progress = request.progress
    loaded = _load_inputs(hf, request.text, request.model, tokens, progress, request.attention)
    if isinstance(loaded, str):
        return _fail(loaded)
    source, model, _tokenizer, load_seconds, ids = loaded
    model_info = hf.model_info(model, request.model)
    layers = (list(range(model_info["layers"])) if request.layers is None
              else [int(i) for i in request.layers])
    problem = _check_layers(layers, model_info["layers"])
    if problem:
        return _fail(problem)
    bar = tqdm(total=tokens, disable=not progress, unit="token", desc="record", file=sys.stderr)
    start = time.perf_counter()
    weights = hf.record_attention(
        model, ids, layers=layers, prompt_tokens=prompt_tokens, progress=bar.update
    )
    bar.close()
    seconds = time.perf_counter() - start
    _save_trace(request.out, weights, layers, min(prompt_tokens, tokens), model_info, source, ids, hf.environment())
    print(
        f"recorded {tokens} tokens x {len(layers)} layers x {model_info['kv_heads']} KV heads "
        f"in {seconds:.1f} s (model load {load_seconds:.1f} s) -> {request.out}"
    )
    return 0
