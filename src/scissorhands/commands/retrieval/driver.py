"""``python -m scissorhands tasks``: the retrieval grid, a thin driver over lm-eval's
``simple_evaluate``.

The grid is tasks x lengths x configurations x budgets: each length's tasks are built
once (RULER's generators and the package's, :mod:`scissorhands.commands.retrieval.data`, at
that length, from the model's own tokenizer), then every configuration runs them through
the ``scissorhands`` lm-eval model (:mod:`scissorhands.commands.retrieval.model`) at every budget,
a fraction of the length (1/8, 1/4, 1/2 by default); the full cache runs once per
length, and comes first in every table: a configuration's *share* is its accuracy over
the full cache's on the same task and length, shown only where the full cache answers
at least half (:data:`FULL_FLOOR`): a cell the full cache fails is shown but not ranked.

RULER's tasks are prompted through the tokenizer's chat template when it has one
(lm-eval's ``apply_chat_template``); the package's own render their turns themselves.
Every answer is greedy, at most ``--max-gen-toks`` tokens.

Everything is checked before the model loads (each configuration at each budget
against the policy's rules, naming the flag); ``--json`` writes every sample's score,
and ``report`` merges such files (parts of one grid) into one table and plot.

This module imports lm-eval, torch and the model only when a run starts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from scissorhands.errors import InvalidInputError, ScissorhandsError
from scissorhands.options import RECOMMENDED, SPECS
from scissorhands.prompt_aware import PROMPT_AWARE_POLICIES

from .config import CacheConfig, pop_cache_config
from .data import ANSWER_ROOM, GENERATORS

__all__ = ["CONFIGS", "FORMAT", "OFFLINE_RULER", "add_parser", "format_tasks", "merge_documents", "plot_tasks",
           "run_tasks", "summarize"]

#: The ``format`` of ``tasks --json`` documents (what ``report`` recognises).
FORMAT = "scissorhands.tasks"
#: lm-eval 0.4.13's RULER tasks whose haystacks are generated (filler, or needles) and so
#: need only a tokenizer; niah_single_2/3, niah_multikey_1, niah_multivalue and
#: niah_multiquery use essays and the QA tasks data sets, which lm-eval downloads.
OFFLINE_RULER = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_cwe", "ruler_fwe")
KNOWN_TASKS = OFFLINE_RULER + GENERATORS
DEFAULT_TASKS = ("niah_single_1", "niah_multikey_2", *GENERATORS)
#: The grid's own values for a policy, and how its help says them (the others run at
#: their defaults).
TUNED: dict[str, tuple[dict[str, Any], str]] = {
    "scissorhands": ({"recent_window": "0.75x", "sinks": 4}, "recent window 0.75x and 4 sinks"),
}


def _grid_configs() -> dict[str, tuple[str, dict[str, Any]]]:
    """The grid's configurations from the registry, in its order: each policy (a tuned
    one also as ``<name>-seed``, its defaults), then each other policy taking
    prompt-aware eviction as ``<name>+pa``, then ``recommended`` (the preset,
    :data:`scissorhands.options.RECOMMENDED`) and ``recommended+archive``."""
    configs: dict[str, tuple[str, dict[str, Any]]] = {}
    for name in SPECS:
        configs[name] = (name, dict(TUNED[name][0]) if name in TUNED else {})
        if name in TUNED:
            configs[f"{name}-seed"] = (name, {})
    for name in PROMPT_AWARE_POLICIES:
        if name != RECOMMENDED.policy:
            configs[f"{name}+pa"] = (name, {**(TUNED[name][0] if name in TUNED else {}), "prompt_aware": True})
    recommended = {**RECOMMENDED.values, "prompt_aware": RECOMMENDED.prompt_aware}
    configs["recommended"] = (RECOMMENDED.policy, recommended)
    configs["recommended+archive"] = (RECOMMENDED.policy, {**recommended, "archive": "float32"})
    return configs


def _configs_help() -> str:
    """``--configs``' list of the grid, as :func:`_grid_configs` builds it."""
    plain = ", ".join(f"{name} = {TUNED[name][1]}, {name}-seed = its defaults" if name in TUNED else name
                      for name in SPECS)
    aware = ", ".join(name for name in CONFIGS if name.endswith("+pa"))
    return (f"{plain}; {aware} = those with prompt-aware eviction; {RECOMMENDED.describe()}; "
            "recommended+archive = it with the recall tier (archive=float32); their earlier names "
            "scissorhands+pa and scissorhands+archive are accepted")


#: The configurations of the grid, by name: a policy and its option values (the rest
#: at the policy's defaults).  ``recommended`` is the recommendation
#: (:data:`scissorhands.options.RECOMMENDED`: the same options as ``from_model(model,
#: "recommended")``), ``scissorhands-seed`` the seed's defaults; a ``+pa`` name is the
#: configuration with prompt-aware eviction (the prompt held up to the cap, and decided
#: at its end by its last rows' attention: :mod:`scissorhands.prompt_aware`);
#: ``recommended+archive`` adds the recall tier (:mod:`scissorhands.hf.recall`).
CONFIGS = _grid_configs()
#: Earlier names of configurations, still accepted by ``--configs``: old -> new.
ALIASES = {"scissorhands+pa": "recommended", "scissorhands+archive": "recommended+archive"}
DEFAULT_LENGTHS = (512, 1024)
DEFAULT_BUDGETS = (Fraction(1, 8), Fraction(1, 4), Fraction(1, 2))
#: The least full-cache accuracy at which a cell ranks the policies.
FULL_FLOOR = 0.5
QUICK: dict[str, Any] = {"tasks": ("niah_single_1", "sh_prose_needle"), "lengths": (512,), "budgets": (Fraction(1, 4),),
         "samples": 5}


# ----------------------------------------------------------------------------- arguments


def _names(known: Sequence[str], what: str, aliases: Mapping[str, str] | None = None) -> Any:
    def parse(text: str) -> list[str]:
        names = [(aliases or {}).get(n.strip(), n.strip()) for n in text.split(",") if n.strip()]
        for name in names:
            if name not in known:
                raise argparse.ArgumentTypeError(f"unknown {what} {name!r}; choose from {', '.join(known)}")
        if not names:
            raise argparse.ArgumentTypeError(f"no {what} named")
        return list(dict.fromkeys(names))

    parse.__name__ = f"{what} list"
    return parse


def _fraction(text: str) -> Fraction:
    try:
        value = Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction like 1/4 or 0.25") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction of the length in (0, 1)")
    return value


_fraction.__name__ = "fraction"


def _integer(text: str) -> int:
    """A base-10 integer flag value, or argparse's error naming it."""
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _length(text: str) -> int:
    value = _integer(text)
    if value <= ANSWER_ROOM:
        raise argparse.ArgumentTypeError(f"{value} leaves no prompt: lengths count the {ANSWER_ROOM} tokens "
                                         "RULER keeps for the answer, so each must be above that")
    return value


_length.__name__ = "length"


def _positive(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below the minimum 1")
    return value


_positive.__name__ = "integer"


def _odd(text: str) -> int:
    from scissorhands.prompt_aware import parse_odd

    try:
        return parse_odd(text)
    except ScissorhandsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_odd.__name__ = "odd integer"


def add_parser(sub: Any, parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    """Add the ``tasks`` subcommand to ``sub`` (the CLI's subparsers)."""
    p = sub.add_parser(
        "tasks", parents=list(parents),
        help="retrieval accuracy (lm-eval: RULER and the package's tasks) under each policy and budget",
        description="Run lm-eval tasks (RULER's offline ones and the package's: a question in a later turn, "
        "a fact stated once or restated, needles in prose) at each length with the full cache and each "
        "configuration at each budget (a fraction of the length); print accuracy and its share of the "
        "full cache's. See docs/tasks.md.")
    p.add_argument("--tasks", type=_names(KNOWN_TASKS, "task"), default=None, metavar="NAMES",
                   help=f"comma-separated task names (default: {','.join(DEFAULT_TASKS)}; also "
                   f"{','.join(t for t in KNOWN_TASKS if t not in DEFAULT_TASKS)})")
    p.add_argument("--lengths", type=_length, nargs="+", default=None, metavar="L",
                   help="RULER lengths: prompt plus 128 answer tokens (default: 512 1024)")
    p.add_argument("--budgets", type=_fraction, nargs="+", default=None, metavar="F",
                   help="budgets as fractions of each length (default: 1/8 1/4 1/2)")
    p.add_argument("--configs", type=_names(tuple(CONFIGS), "configuration", ALIASES), default=None, metavar="NAMES",
                   help=f"comma-separated configurations (default: all: {_configs_help()})")
    p.add_argument("--prefill-budget", type=_positive, default=None, metavar="N",
                   help="the prompt-aware configurations: positions held while a prompt is read (default: 4096)")
    p.add_argument("--observation-window", type=_positive, default=None, metavar="N",
                   help="the prompt-aware configurations: the prompt's last rows that decide at its end (default: 16)")
    p.add_argument("--pool-kernel", type=_odd, default=None, metavar="N",
                   help="the prompt-aware configurations: max-pooling kernel over held positions, odd (default: 15)")
    p.add_argument("--samples", type=_positive, default=None, metavar="N",
                   help="samples per task and length (lm-eval's limit; default 20)")
    p.add_argument("--quick", action="store_true",
                   help="a small grid: niah_single_1 and sh_prose_needle at 512, budget 1/4, 5 samples "
                   "(flags given explicitly still apply)")
    p.add_argument("--prefill-chunk", type=_positive, default=64, metavar="N",
                   help="prompt tokens per forward of an evicting cache, which evicts after each "
                   "(default: 64; the full cache reads in one forward)")
    p.add_argument("--max-gen-toks", type=_positive, default=32, metavar="N",
                   help="most tokens generated per answer (default: 32)")
    p.add_argument("--seed", type=int, default=1234, help="the package's tasks' seed (default: 1234)")
    p.add_argument("--model", metavar="NAME_OR_PATH",
                   help="a model scissorhands.hf.load_model takes (default: SmolLM2-135M-Instruct)")
    p.add_argument("--threads", type=_positive, default=1, metavar="T", help="torch threads (default: 1)")
    p.add_argument("--json", metavar="PATH", help="also write every sample's score as JSON (for report)")
    p.add_argument("--plot", metavar="PATH",
                   help="also draw accuracy against length per configuration to PATH, and the needle "
                   "depth x length heat map beside it (PATH's stem + '-depth') (needs matplotlib)")
    p.add_argument("--markdown", action="store_true", help="print Markdown tables")
    return p


@dataclass(frozen=True)
class Run:
    """One configuration at one budget fraction (None: the full cache)."""

    name: str
    fraction: Fraction | None

    def config(self, length: int, chunk: int, prompt: Mapping[str, Any] | None = None) -> CacheConfig:
        """The cache's configuration at ``length`` (``prompt``: prompt-aware settings
        given on the command line, for the configurations that are prompt-aware).

        Raises
        ------
        InvalidInputError
            The policy refuses its options at this budget."""
        policy, values = CONFIGS[self.name]
        args: dict[str, Any] = {"policy": policy, **values, "prefill_chunk": chunk}
        if values.get("prompt_aware"):
            args.update({k: v for k, v in (prompt or {}).items() if v is not None})
        if self.fraction is not None:
            args["budget"] = int(self.fraction * length)
        return pop_cache_config(args)


def plan(args: argparse.Namespace) -> dict[str, Any]:
    """The grid the arguments ask for, every configuration checked at every budget and
    length (before anything loads).

    Raises
    ------
    ScissorhandsError
        A configuration a policy refuses, naming ``--budgets`` and ``--lengths``.
    """
    quick = bool(getattr(args, "quick", False))
    tasks = args.tasks or list(QUICK["tasks"] if quick else DEFAULT_TASKS)
    lengths = list(dict.fromkeys(args.lengths or (QUICK["lengths"] if quick else DEFAULT_LENGTHS)))
    budgets = list(dict.fromkeys(args.budgets or (QUICK["budgets"] if quick else DEFAULT_BUDGETS)))
    samples = args.samples or (QUICK["samples"] if quick else 20)
    names = args.configs or list(CONFIGS)
    runs = [Run("full", None)] if "full" in names else []
    runs += [Run(n, f) for f in budgets for n in names if n != "full"]
    prompt = _prompt_settings(args)
    for run in runs:
        for length in lengths:
            try:
                run.config(length, args.prefill_chunk, prompt)
            except ScissorhandsError as exc:
                text = str(exc)
                for name in ("prefill_budget", "observation_window", "pool_kernel"):
                    text = text.replace(name, "--" + name.replace("_", "-"))
                raise InvalidInputError(f"--configs {run.name} at --budgets {run.fraction} of --lengths {length} "
                                        f"(budget {int((run.fraction or 0) * length)}): {text}") from None
    return {"tasks": tasks, "lengths": lengths, "budgets": budgets, "samples": samples, "runs": runs,
            "prompt": prompt}


def _prompt_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The prompt-aware flags given (``prefill_budget``, ...), None where not given."""
    return {name: getattr(args, name, None) for name in ("prefill_budget", "observation_window", "pool_kernel")}


# ----------------------------------------------------------------------------- running


def _sample_score(task: str, sample: Mapping[str, Any], length: int) -> float:
    """A logged sample's score: RULER's metric is named by the length, ours ``score``."""
    for key in ("score", str(length)):
        if key in sample:
            return float(sample[key])
    raise ScissorhandsError(f"{task}: lm-eval logged no score for a sample (keys {sorted(sample)})")


def run_tasks(args: argparse.Namespace) -> int:
    """``python -m scissorhands tasks``: run the grid, print it, write ``--json`` and
    ``--plot``. Returns 0.

    Raises
    ------
    ScissorhandsError
        A bad value (before the model loads), or lm-eval not installed.
    """
    grid = plan(args)
    _check_outputs(args)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager  # noqa: F401  (refused here, before the model loads)
    except ImportError as exc:
        raise ScissorhandsError(f"tasks needs lm-eval: pip install 'scissorhands[tasks]' ({exc})") from None
    from tqdm import tqdm

    from scissorhands import hf

    hf.set_threads(args.threads)
    import logging

    for name in ("lm_eval", "lm-eval", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)
    started = time.time()
    model, tokenizer = hf.load_model(args.model, progress=False)
    chat = bool(getattr(tokenizer, "chat_template", None))
    total = len(grid["runs"]) * len(grid["lengths"]) * len(grid["tasks"]) * grid["samples"]
    bar = tqdm(total=total, unit="sample", desc="tasks", disable=args.no_progress, file=sys.stderr)
    rows = _run_grid(args, grid, model, tokenizer, chat, bar)
    bar.close()
    document = {
        "format": FORMAT, "version": 1, "model": hf.model_info(model, args.model), "environment": hf.environment(),
        "grid": {"tasks": grid["tasks"], "lengths": grid["lengths"], "budgets": [str(b) for b in grid["budgets"]],
                 "samples": grid["samples"], "configs": list(dict.fromkeys(r.name for r in grid["runs"])),
                 "prefill_chunk": args.prefill_chunk, "max_gen_toks": args.max_gen_toks, "seed": args.seed,
                 "chat_template": chat, "lm_eval": lm_eval.__version__,
                 "prompt_aware": {k: v for k, v in grid["prompt"].items() if v is not None}},
        "seconds": round(time.time() - started, 1), "rows": rows}
    print(format_tasks([document], markdown=args.markdown))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
    if args.plot:
        plot_tasks([document], args.plot)
    return 0


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse ``--plot`` without matplotlib and a ``--json``/``--plot`` file in no directory."""
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ScissorhandsError("--plot needs matplotlib: pip install 'scissorhands[plot]'") from None
    for path in (args.json, args.plot):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise ScissorhandsError(f"{path}: the directory does not exist")


def _run_grid(args: argparse.Namespace, grid: Mapping[str, Any], model: Any, tokenizer: Any, chat: bool,
              bar: Any) -> list[dict[str, Any]]:
    """Evaluate every length, configuration and task of the grid; one row per sample."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from . import TASKS_DIR
    from .model import ScissorhandsLM, quiet_lm_eval

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tokenizer_dir, quiet_lm_eval():
        tokenizer.save_pretrained(tokenizer_dir)
        for length in grid["lengths"]:
            manager = TaskManager(include_path=TASKS_DIR, metadata={
                "max_seq_lengths": [length], "tokenizer": tokenizer_dir, "num_samples": grid["samples"],
                "seed": args.seed})
            loaded = manager.load(list(grid["tasks"]))["tasks"]
            groups = [([t for n, t in loaded.items() if n in OFFLINE_RULER], chat),
                      ([t for n, t in loaded.items() if n not in OFFLINE_RULER], False)]
            for run in grid["runs"]:
                config = run.config(length, args.prefill_chunk, grid.get("prompt"))
                bar.set_postfix_str(f"{length} {run.name} {run.fraction or ''}".strip())
                lm = ScissorhandsLM(pretrained=model, tokenizer=tokenizer, quiet=True, policy=config.policy,
                                    budget=config.budget, prefill_chunk=config.prefill_chunk, **config.values,
                                    **config.prompt_args())
                for task_objects, with_chat in groups:
                    if not task_objects:
                        continue
                    out = lm_eval.simple_evaluate(
                        model=lm, tasks=task_objects, limit=grid["samples"], log_samples=True,
                        apply_chat_template=with_chat, gen_kwargs={"max_gen_toks": args.max_gen_toks},
                        task_manager=manager, verbosity="ERROR", bootstrap_iters=0)
                    for task, samples in (out or {}).get("samples", {}).items():
                        for sample in samples:
                            rows.append(_sample_row(task, sample, length, run, config))
                            bar.update(1)
    return rows


def _sample_row(task: str, sample: Mapping[str, Any], length: int, run: Run, config: CacheConfig) -> dict[str, Any]:
    """One ``tasks --json`` row: a sample lm-eval logged, with its run and score."""
    doc = sample["doc"]
    return {
        "task": task, "length": length, "config": run.name,
        "fraction": None if run.fraction is None else str(run.fraction),
        "policy": config.policy, "budget": config.budget, "label": config.label(),
        "index": int(sample.get("doc_id", 0)), "depth": doc.get("depth"),
        "mentions": doc.get("mentions"), "prompt_tokens": doc.get("length"),
        "answer": list(doc.get("outputs") or []),
        "response": (sample.get("filtered_resps") or [""])[0],
        "score": _sample_score(task, sample, length)}


# ----------------------------------------------------------------------------- tables


def merge_documents(documents: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every sample row of ``tasks --json`` documents measured on one model, a sample
    measured twice (same task, length, configuration, budget, index) kept once (the
    first).

    Raises
    ------
    ScissorhandsError
        A document of another kind, or of another model or seed.
    """
    rows: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    first: Mapping[str, Any] | None = None
    for doc in documents:
        if doc.get("format") != FORMAT:
            raise ScissorhandsError("not a 'scissorhands tasks --json' result")
        if first is None:
            first = doc
        for fact in ("architecture", "layers", "kv_heads"):
            if doc["model"].get(fact) != first["model"].get(fact):
                raise ScissorhandsError(f"the files measure different models ({fact} "
                                        f"{first['model'].get(fact)} against {doc['model'].get(fact)})")
        for name in ("seed", "prefill_chunk", "max_gen_toks"):
            if doc["grid"].get(name) != first["grid"].get(name):
                raise ScissorhandsError(f"the files differ in {name} ({first['grid'].get(name)} against "
                                        f"{doc['grid'].get(name)}): their cells do not compare")
        for row in doc["rows"]:
            key = (row["task"], row["length"], row["config"], row["fraction"], row["index"])
            if key not in seen:
                seen.add(key)
                rows.append(dict(row))
    return rows


def summarize(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One cell per (task, length, configuration, budget fraction): ``accuracy`` (mean
    score), ``n`` (samples), ``full`` (the full cache's accuracy on that task and length)
    and ``share`` (accuracy / full, None where the full cache is below
    :data:`FULL_FLOOR` or absent)."""
    cells: dict[tuple[Any, ...], list[float]] = {}
    for row in rows:
        cells.setdefault((row["task"], row["length"], row["config"], row["fraction"]), []).append(row["score"])
    out = []
    for (task, length, config, fraction), scores in cells.items():
        full = cells.get((task, length, "full", None))
        full_accuracy = sum(full) / len(full) if full else None
        accuracy = sum(scores) / len(scores)
        share = (accuracy / full_accuracy if full_accuracy is not None and full_accuracy >= FULL_FLOOR
                 and config != "full" else None)
        out.append({"task": task, "length": length, "config": config, "fraction": fraction,
                    "accuracy": accuracy, "n": len(scores), "full": full_accuracy, "share": share})
    return out


def _order(cell: Mapping[str, Any]) -> tuple[Any, ...]:
    names = list(CONFIGS)
    return (names.index(cell["config"]) if cell["config"] in names else len(names), cell["config"])


def format_tasks(documents: Sequence[Mapping[str, Any]], markdown: bool = False) -> str:
    """The grid as text: per task, the full cache's accuracy per length first, then one
    row per configuration and a column per (length, budget), each cell the accuracy and
    (in brackets) its share of the full cache's; ``-`` where not ranked."""
    cells = summarize(merge_documents(documents))
    lines: list[str] = []
    for task in dict.fromkeys(c["task"] for c in cells):
        mine = [c for c in cells if c["task"] == task]
        lengths = sorted({c["length"] for c in mine})
        fractions = sorted({Fraction(c["fraction"]) for c in mine if c["fraction"] is not None})
        full = {c["length"]: c for c in mine if c["config"] == "full"}
        header = "full cache: " + ", ".join(
            f"{length}: {full[length]['accuracy']:.2f} (n={full[length]['n']})" + (
                "" if full[length]["accuracy"] >= FULL_FLOOR else " fails: not ranked")
            for length in lengths if length in full)
        missing = [str(length) for length in lengths if length not in full]
        if missing:  # a part run without `full` (--configs): shares need it merged in
            header += ("; " if full else "") + (f"not run at {', '.join(missing)}: no shares until a part "
                                                "with it is merged (report)")
        columns = [(length, f) for length in lengths for f in fractions]
        titles = ["configuration", *(f"{length} @ {f}" for length, f in columns)]
        body = []
        for config in sorted({c["config"] for c in mine if c["config"] != "full"}, key=lambda n: _order({"config": n})):
            row = [config]
            for length, f in columns:
                cell = next((c for c in mine if c["config"] == config and c["length"] == length
                             and c["fraction"] is not None and Fraction(c["fraction"]) == f), None)
                if cell is None:
                    row.append("")
                else:
                    share = "-" if cell["share"] is None else f"{100 * cell['share']:.0f}%"
                    row.append(f"{cell['accuracy']:.2f} ({share})")
            body.append(row)
        lines.append(f"{'### ' if markdown else ''}{task}: {header}")
        lines.append("")
        lines.extend(_table(titles, body, markdown))
        lines.append("")
    return "\n".join(lines).rstrip()


def _table(titles: Sequence[str], body: Sequence[Sequence[str]], markdown: bool) -> list[str]:
    if markdown:
        return ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles),
                *("| " + " | ".join(r) + " |" for r in body)]
    widths = [max(len(str(x)) for x in col) for col in zip(titles, *body)]
    return ["  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip() for r in [titles, *body]]


# ----------------------------------------------------------------------------- plots


def plot_tasks(documents: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> list[str]:
    """Draw accuracy against length (one panel per task and budget, a line per
    configuration, the full cache dashed) to ``path``, and, where samples record a
    needle depth, accuracy per depth and length (one heat map per configuration and
    budget) to ``<stem>-depth<suffix>``. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = merge_documents(documents)
    cells = summarize(rows)
    tasks = list(dict.fromkeys(c["task"] for c in cells))
    fractions: list[Fraction | None] = [*sorted({Fraction(c["fraction"]) for c in cells
                                                 if c["fraction"] is not None})] or [None]
    _plot_lengths(plt, cells, tasks, fractions, path)
    written = [os.fspath(path)]
    deep = [r for r in rows if r.get("depth") is not None and r["task"] in ("sh_prose_needle", "sh_later_turn")]
    if deep:
        written.append(_plot_depths(plt, deep, path))
    return written


def _plot_lengths(plt: Any, cells: Sequence[Mapping[str, Any]], tasks: Sequence[str],
                  fractions: Sequence[Fraction | None], path: str | os.PathLike[str]) -> None:
    """Draw accuracy against length, one panel per task and budget, to ``path``."""
    fig, axes = plt.subplots(len(tasks), len(fractions), figsize=(4 * len(fractions), 2.8 * len(tasks)),
                             squeeze=False, sharey=True)
    for i, task in enumerate(tasks):
        for j, fraction in enumerate(fractions):
            ax = axes[i][j]
            for config in sorted({c["config"] for c in cells}, key=lambda n: _order({"config": n})):
                points = sorted((c["length"], c["accuracy"]) for c in cells if c["task"] == task
                                and c["config"] == config and (c["fraction"] is None if config == "full" else
                                                               fraction is not None and c["fraction"] is not None
                                                               and Fraction(c["fraction"]) == fraction))
                if points:
                    ax.plot(*zip(*points), marker="o", label=config, linestyle="--" if config == "full" else "-")
            ax.set_title(f"{task}, budget {fraction} of the length", fontsize=9)
            ax.set_ylim(-0.05, 1.05)
            ax.set_xlabel("length (tokens)")
            ax.set_ylabel("accuracy")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_depths(plt: Any, deep: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> str:
    """Draw accuracy per needle depth and length, a heat map per configuration and budget,
    to ``<stem>-depth<suffix>``; returns that file."""
    stem, suffix = os.path.splitext(os.fspath(path))
    keys = sorted({(r["config"], r["fraction"]) for r in deep},
                  key=lambda k: (_order({"config": k[0]}), Fraction(k[1]) if k[1] else Fraction(0)))
    lengths = sorted({r["length"] for r in deep})
    depths = sorted({r["depth"] for r in deep})
    cols = min(len(keys), 4)
    lines = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(lines, cols, figsize=(3.2 * cols, 2.8 * lines), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.axis("off")
    for ax, (config, fraction) in zip(axes.flat, keys):
        grid = [[_mean([r["score"] for r in deep if r["config"] == config and r["fraction"] == fraction
                        and r["length"] == length and r["depth"] == depth]) for length in lengths]
                for depth in depths]
        image = ax.imshow([[math.nan if v is None else v for v in line] for line in grid], vmin=0, vmax=1,
                          cmap="RdYlGn", aspect="auto", origin="upper")
        ax.set_xticks(range(len(lengths)), [str(v) for v in lengths])
        ax.set_yticks(range(len(depths)), [f"{100 * d:.0f}%" for d in depths])
        ax.set_title(f"{config}" + (f" @ {fraction}" if fraction else ""), fontsize=9)
        ax.set_xlabel("length")
        ax.set_ylabel("needle depth")
    fig.subplots_adjust(wspace=0.6, hspace=0.6)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="accuracy")
    depth_path = f"{stem}-depth{suffix}"
    fig.savefig(depth_path, dpi=110)
    plt.close(fig)
    return depth_path


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
