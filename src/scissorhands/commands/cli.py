"""``python -m scissorhands``: the command line, which parses and dispatches.

Subcommands (``replay`` is the default, so ``python -m scissorhands`` alone replays the
canonical trace):

``replay``
    A trace (``decode-4096``, or a recorded real model's) through each policy at each
    budget: retained attention mass and heavy-hitter recall (:mod:`scissorhands.commands.replay`).
``eval``
    Teacher-forced perplexity of a real model under each policy and budget
    (:mod:`scissorhands.commands.evaluate`).
``record``
    A real model's full-cache attention, as a trace for ``replay --trace``.
``report``
    Several ``eval --json`` files as one table and one plot (:mod:`scissorhands.commands.report`).
``tasks``
    Retrieval accuracy through lm-eval under each policy and budget
    (:mod:`scissorhands.commands.retrieval.driver`).

The option flags (``--recent-window``, ``--sinks``, ``--history-window``,
``--vote-rate``) come from the option declarations of :mod:`scissorhands.options`;
each takes several values, and every combination a policy takes is run.

Exit status: 0 on success; 2 on a user error, a usage error (argparse) or an input the
library refuses (a path, a file, a configuration), each checked before the work it would
waste; 1 when the system fails during a run (an ``OSError``, such as a full disk). Every
command prints a user error as argparse prints its own: the command's usage, then one line
``scissorhands <command>: error: ...``; a failure of the system is that one line alone.
No traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from scissorhands.errors import ScissorhandsError
from scissorhands.models import DEFAULT_MODEL, MODEL_NAMES
from scissorhands.options import (
    BACKENDS,
    DEFAULT_BUDGET,
    MODEL_POLICIES,
    OPTIONS,
    POLICY_NAMES,
    PRESETS,
    RECOMMENDED,
    SPECS,
    flag_help,
    policy_spec,
)
from scissorhands.prompt_aware import PROMPT_AWARE_POLICIES, parse_odd

__all__ = ["build_parser", "main"]

COMMANDS = ("replay", "eval", "record", "report", "generate", "longctx", "tasks")
_PROG = "scissorhands"
#: The evicting policies' class names, in the registry's order (the top description).
_EVICTING = ", ".join(spec.class_name for spec in SPECS.values() if spec.evicts)


# --------------------------------------------------------------------------------------
# Argument types: each turns the library's InvalidInputError into a usage error.


def _argtype(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ScissorhandsError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name
    return convert


def _int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum {low}")
        return value

    parse.__name__ = "integer"
    return parse


_positive_int = _int_at_least(1)
_MODEL_HELP = (f"a model name ({', '.join(MODEL_NAMES)}) or a GGUF file or transformers checkpoint "
               f"directory (default: {DEFAULT_MODEL})")
_nonnegative_int = _int_at_least(0)


def _policy_list(text: str) -> list[str]:
    names: list[str] = []
    for raw in text.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if name not in POLICY_NAMES and name not in PRESETS:
            raise argparse.ArgumentTypeError(
                f"unknown policy {raw.strip()!r}; choose from {', '.join((*POLICY_NAMES, *PRESETS))}")
        if name not in names:
            names.append(name)
    if not names:
        raise argparse.ArgumentTypeError("no policy named")
    return names


_policy_list.__name__ = "policy list"


# --------------------------------------------------------------------------------------
# The parser


def _option_flags(group: Any, several: bool = True) -> None:
    """One flag per policy option (:data:`scissorhands.options.OPTIONS`): one or more
    values each in a sweep (``several``), else exactly one (so that a positional argument
    after the flag is not taken for a second value)."""
    for option in OPTIONS:
        group.add_argument(option.flag, dest=option.name, type=_argtype(option.parse, option.long),
                           nargs="+" if several else None, default=None, metavar=option.metavar,
                           help=flag_help(option, several))


def _common_parser() -> argparse.ArgumentParser:
    """The flags of every subcommand: ``--no-progress``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return common


def _policy_parser() -> argparse.ArgumentParser:
    """The sweeping commands' policy flags: policies, budgets, options, backend, JSON and plot."""
    policy_opts = argparse.ArgumentParser(add_help=False)
    group = policy_opts.add_argument_group("policies")
    group.add_argument(
        "--policies", type=_policy_list, default=None, metavar="NAMES",
        help=f"comma-separated registry names, and in eval {RECOMMENDED.name} ({RECOMMENDED.describe()}) "
        f"(default: replay {','.join(POLICY_NAMES)}; eval {','.join((*MODEL_POLICIES, RECOMMENDED.name))}, "
        f"without {RECOMMENDED.name} when an option flag is given; "
        f"longctx {','.join(MODEL_POLICIES)})")
    group.add_argument(
        "--budgets", type=_positive_int, nargs="+", default=None, metavar="N",
        help="cache budgets in positions (replay default: 256 512 1024 on decode-4096, "
        "N/8 N/4 N/2 on a recorded trace of N positions; eval default: N/8 and N/5 of "
        "--tokens, rounded down; longctx default: 1024 2048)")
    _option_flags(group)
    group.add_argument("--backend", choices=BACKENDS, default="native",
                       help="the C-backed policies or the pure-Python reference (default: native)")
    group.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    group.add_argument("--plot", metavar="PATH",
                       help="also draw the results to an image (needs matplotlib)")
    return policy_opts


def _model_parser() -> argparse.ArgumentParser:
    """The real-model flags of ``eval`` and ``record``: tokens, prompt, text, model,
    attention, threads."""
    model_opts = argparse.ArgumentParser(add_help=False)
    group = model_opts.add_argument_group("model")
    group.add_argument("--tokens", type=_positive_int, default=512, metavar="N",
                       help="tokens of text to run, prompt included (default: 512)")
    group.add_argument("--prompt-tokens", type=_positive_int, default=None, metavar="P",
                       help="tokens consumed by the first forward before decoding (default: 64)")
    group.add_argument("--text", metavar="PATH", help="text file to run (default: built-in text)")
    group.add_argument("--model", metavar="NAME|PATH", help=_MODEL_HELP)
    group.add_argument("--attention", choices=("eager", "sdpa"), default="eager",
                       help="the model's attention implementation (default: eager, whose "
                       "weights reach the policies as computed)")
    group.add_argument("--threads", type=_positive_int, default=1, metavar="T",
                       help="torch threads (default: 1, which holds up when other jobs share "
                       "the cores)")
    return model_opts


def _add_replay(sub: Any, common: Any, policy_opts: Any) -> None:
    replay = sub.add_parser(
        "replay", parents=[common, policy_opts],
        help="replay decode-4096 or a recorded trace through the policies (default)",
        description="Replay a trace through each policy at each budget; print retained "
        "attention mass and heavy-hitter recall.")
    replay.add_argument("--trace", metavar="PATH",
                        help="recorded .npz trace (from 'record'); default: the canonical "
                        "decode-4096, seed 7")


def _add_eval(sub: Any, common: Any, policy_opts: Any, model_opts: Any) -> None:
    evaluate = sub.add_parser(
        "eval", parents=[common, policy_opts, model_opts],
        help="perplexity of a real model under each policy and budget",
        description="Teacher-forced evaluation of a real model with each policy's cache.")
    evaluate.add_argument(
        "--head-mode", choices=("per-head", "mean"), default="per-head",
        help="one policy row per KV head, or one row fed the mean over heads (default: per-head)")
    evaluate.add_argument(
        "--cache-mode", choices=("reuse", "compact"), default="reuse",
        help="reuse: the new token takes the last victim's slot; compact: gather the whole "
        "cache every step (same results, slower) (default: reuse)")
    evaluate.add_argument(
        "--hindsight", type=_positive_int, default=None, metavar="W",
        help="also run the hindsight reference at every budget: evict the held position the next W "
        "decode steps of the full run attend to least (greedy, not a bound), and add a gap-closed "
        "column against streaming-llm (default: off; 256 was the best of 16-1024 measured in docs/eval.md)")


def _add_record(sub: Any, common: Any, model_opts: Any) -> None:
    record = sub.add_parser(
        "record", parents=[common, model_opts],
        help="record a real model's attention as a trace for 'replay --trace'",
        description="Record full-cache attention per step, layer and KV head (float16 .npz).")
    record.add_argument("--layers", type=_nonnegative_int, nargs="+", default=None, metavar="L",
                        help="decoder layers to record (default: all)")
    record.add_argument("--out", default="trace.npz", metavar="PATH",
                        help="output file (default: trace.npz)")


_GENERATE_DESCRIPTION = (
    "Generate with the model's own generate() and an evicting cache; the text "
    "streams to stdout, one summary line (tokens/s, KV held against a full cache, peak RSS) "
    "goes to stderr. With a tokenizer that has a chat template (an instruct model, such as the "
    "default), the prompt is sent as one user message through it, as transformers' chat command "
    "and llama.cpp's conversation mode do; --no-chat sends it as written. "
    f"By default it runs the recommendation, {RECOMMENDED.describe()} (docs/configuration.md), "
    f"at budget {DEFAULT_BUDGET}, and says so on stderr. To chat across turns on one cache, give the "
    "later user turns with --chat-turns (each asked after the previous answer, the conversation rendered "
    "again each turn and its read prefix reused; --archive float32 keeps what each turn's end evicted, "
    "so a later question can bring it back), or in Python keep one EvictingCache and pass "
    "model.generate the whole conversation each turn (examples/chat.py; --pin-system keeps the system "
    "prompt).")


def _add_generate(sub: Any, common: Any) -> None:
    gen = sub.add_parser(
        "generate", parents=[common],
        help="generate text from a real model with a bounded KV cache, streamed to stdout",
        description=_GENERATE_DESCRIPTION)
    _add_generate_policy(gen)
    _add_generate_decoding(gen)
    aware = _add_prompt_aware(gen)
    gen.add_argument("--chat-turns", nargs="+", default=(), metavar="TURN",
                     help="later user turns, each asked on the same cache after the previous answer (a chat; "
                     "needs the chat template)")
    aware.add_argument("--archive", choices=("float32", "int8"), default=None,
                       help="the recall tier: archive what is evicted (host memory, never attended) and read it "
                       "again at a later turn's prompt (needs --prompt-aware; int8: about 0.28x the bytes)")
    gen.add_argument("--pin-system", action="store_true",
                     help="never evict what the chat template puts before the message (its system prompt "
                     "and the user turn's header)")
    gen.add_argument("--model", metavar="NAME|PATH", help=_MODEL_HELP)
    gen.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa",
                     help="the model's attention implementation (default: sdpa)")
    gen.add_argument("--threads", type=_positive_int, default=1, metavar="T", help="torch threads (default: 1)")
    gen.add_argument("--backend", choices=BACKENDS, default="native", help="policy backend (default: native)")
    gen.set_defaults(usage=gen.format_usage())  # printed before each of the command's own errors


def _add_generate_policy(gen: Any) -> None:
    """``generate``'s prompt, policy, budget and the policy's options (one value each)."""
    gen.add_argument("prompt", nargs="?", default=None,
                     help="the prompt (default: --file, or stdin)")
    gen.add_argument("--file", metavar="PATH", help="read the prompt from a UTF-8 file ('-': stdin)")
    gen.add_argument("--policy", default=RECOMMENDED.name, choices=(*PRESETS, *POLICY_NAMES),
                     help=f"eviction policy, or {RECOMMENDED.name}: {RECOMMENDED.describe()}, the flags "
                     f"given overriding it (default: {RECOMMENDED.name}; scissorhands alone is the paper's "
                     "seed defaults, recent window 32, no sinks)")
    gen.add_argument("--budget", type=_positive_int, default=None, metavar="N",
                     help=f"positions each layer and KV head keeps (default: {DEFAULT_BUDGET}, said on stderr; "
                     f"the recommendation's rule: {RECOMMENDED.budget_rule})")
    group = gen.add_argument_group("policy options (one value each)")
    _option_flags(group, several=False)


def _add_generate_decoding(gen: Any) -> None:
    """``generate``'s decoding: length, sampling, the chat template, prefill chunks, positions."""
    gen.add_argument("--max-new-tokens", type=_positive_int, default=128, metavar="N",
                     help="tokens to generate (default: 128)")
    gen.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    gen.add_argument("--temperature", type=float, default=None, help="sampling temperature")
    gen.add_argument("--top-k", type=_positive_int, default=None, help="sample among the k likeliest")
    gen.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass")
    gen.add_argument("--seed", type=_nonnegative_int, default=None, help="torch seed (reproducible sampling)")
    chat = gen.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_const", const=True, default=None,
                      help="wrap the prompt in the model's chat template (default when the tokenizer has one)")
    chat.add_argument("--no-chat", "--raw", dest="chat", action="store_const", const=False,
                      help="send the prompt as written, without the chat template (text continuation)")
    gen.add_argument("--prefill-chunk", type=_positive_int, default=256, metavar="N",
                     help="prompt tokens per forward; the cache evicts after each (default: 256)")
    gen.add_argument("--positions", choices=("original", "cache"), default="original",
                     help="original: keys keep their rotation, tokens their true positions; cache: "
                     "held keys at ranks 0..n-1, the query at n (StreamingLLM; for text past the "
                     "trained context: with original positions a prompt past it is refused) (default: original)")


def _add_prompt_aware(gen: Any) -> Any:
    """``generate``'s prompt-aware group, titled with the policies that take it (the
    caller adds ``--archive`` to it after ``--chat-turns``, keeping the usage's order)."""
    aware = gen.add_argument_group(f"prompt-aware eviction ({', '.join(PROMPT_AWARE_POLICIES)})")
    aware.add_argument("--prompt-aware", action="store_true",
                       help="hold the prompt (up to --prefill-budget), then at its end keep per layer and KV "
                       "head what its last rows attend to (summed, max-pooled), the sinks and those rows; "
                       "decoding then evicts by the policy's own rule")
    aware.add_argument("--prefill-budget", type=_positive_int, default=None, metavar="N",
                       help="positions each layer and KV head may hold while the prompt is read, at least "
                       "--budget (default: 4096)")
    aware.add_argument("--observation-window", type=_positive_int, default=None, metavar="N",
                       help="the prompt's last rows whose attention decides at its end (default: 16)")
    aware.add_argument("--pool-kernel", type=_argtype(parse_odd, "--pool-kernel"), default=None, metavar="N",
                       help="max-pooling kernel over held positions, odd; 1: no pooling (default: 15)")
    return aware


def _add_longctx(sub: Any, common: Any, policy_opts: Any) -> None:
    long = sub.add_parser(
        "longctx", parents=[common, policy_opts],
        help="step time, KV memory and perplexity of a real model as the context grows",
        description="Read one long text to growing context lengths; at each, decode a window "
        "teacher-forced and measure ms per step, KV bytes held, resident memory and the "
        "window's perplexity, for the full cache (up to the trained context) and each policy.")
    long.add_argument("--lengths", type=_positive_int, nargs="+", default=None, metavar="N",
                      help="context lengths at the end of each window (default: 1024 2048 4096 8192 12288 16384)")
    long.add_argument("--window", type=_positive_int, default=128, metavar="W",
                      help="decoded tokens per length (default: 128)")
    long.add_argument("--positions", choices=("original", "cache"), nargs="+", default=["original"],
                      help="position modes of the evicting caches (default: original)")
    long.add_argument("--prefill-chunk", type=_positive_int, default=256, metavar="N",
                      help="text tokens per forward between windows (default: 256)")
    long.add_argument("--text", metavar="PATH", help="text file to read (default: built-in text)")
    long.add_argument("--model", metavar="NAME|PATH", help=_MODEL_HELP)
    long.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa",
                      help="the model's attention implementation (default: sdpa)")
    long.add_argument("--threads", type=_positive_int, default=1, metavar="T", help="torch threads (default: 1)")


def _add_tasks(sub: Any, common: Any) -> None:
    from .retrieval.driver import add_parser as add_tasks_parser

    add_tasks_parser(sub, [common])


def _add_report(sub: Any) -> None:
    report = sub.add_parser(
        "report", help="combine 'eval --json' (or 'longctx --json') files into one table and plot",
        description="One row per configuration, one column per (text, budget): perplexity "
        "and its change against the full cache, from any number of 'eval --json' files "
        "measured with the same tokens, prompt, head mode and model; or, from 'longctx --json' "
        "files (its parts), one row per configuration and context length.")
    report.add_argument("files", nargs="+", metavar="JSON",
                        help="'eval --json' or 'longctx --json' output files (not mixed)")
    report.add_argument("--markdown", action="store_true",
                        help="print a Markdown table (eval: the best of each column in bold)")
    report.add_argument("--plot", metavar="PATH",
                        help="also draw the grid (eval) or step time, KV memory and window "
                        "perplexity against context length (longctx) to an image (needs matplotlib)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m scissorhands``."""
    common, policy_opts, model_opts = _common_parser(), _policy_parser(), _model_parser()
    parser = argparse.ArgumentParser(
        prog=_PROG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"KV-cache eviction policies ({_EVICTING}): replay\n"
        "attention traces, evaluate on a real model.",
        epilog="Without a subcommand the arguments are replay's ('python -m scissorhands\n"
        "--budgets 512' replays decode-4096 at budget 512); each subcommand lists its own\n"
        "with --help.\n\n"
        "lm-eval's own command line, with this package's model and tasks (docs/tasks.md):\n"
        "  python -m scissorhands.commands.retrieval --model scissorhands \\\n"
        "      --model_args policy=recommended,budget=128 --tasks niah_single_1 \\\n"
        "      --apply_chat_template --device cpu --limit 10 --metadata '{\"max_seq_lengths\": [512]}'\n"
        "(every lm-eval argument works; 'tasks' above runs a grid of them).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    _add_replay(sub, common, policy_opts)
    _add_eval(sub, common, policy_opts, model_opts)
    _add_record(sub, common, model_opts)
    _add_generate(sub, common)
    _add_longctx(sub, common, policy_opts)
    _add_tasks(sub, common)
    _add_report(sub)
    return parser


def _version() -> str:
    from scissorhands import __version__

    return __version__


def _with_default_command(argv: list[str]) -> list[str]:
    """Insert ``replay`` when no subcommand is named (top-level help and version excepted)."""
    if argv and (argv[0] in COMMANDS or argv[0] in ("-h", "--help", "--version")):
        return argv
    return ["replay", *argv]


def option_values(args: argparse.Namespace) -> dict[str, Any]:
    """The option flags' values, by option name (None: not given): a list of values each
    in a sweeping command, one value each in ``generate``."""
    return {option.name: getattr(args, option.name, None) for option in OPTIONS}


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ScissorhandsError("--plot needs matplotlib: pip install 'scissorhands[plot]'") from None


# --------------------------------------------------------------------------------------
# Dispatch


def _no_presets(args: argparse.Namespace) -> None:
    """Refuse a preset in ``--policies`` of a command that sweeps registry names only."""
    named = [name for name in args.policies or () if name in PRESETS]
    if named:
        raise ScissorhandsError(f"--policies {named[0]} is a preset of eval, generate and tasks; {args.command} "
                                f"takes registry names ({', '.join(POLICY_NAMES)}) with option flags, such as "
                                "--policies scissorhands --recent-window 75%% --sinks 4".replace("%%", "%"))


def _run_replay(args: argparse.Namespace) -> int:
    from .replay import run_replay

    _no_presets(args)

    return run_replay(args.policies or list(POLICY_NAMES), args.budgets, option_values(args), backend=args.backend,
                      trace=args.trace, json_path=args.json, plot=args.plot,
                      progress=not args.no_progress)


def _run_tasks(args: argparse.Namespace) -> int:
    from .retrieval.driver import run_tasks

    return run_tasks(args)


def _run_report(args: argparse.Namespace) -> int:
    from .report import run_report

    return run_report(args.files, markdown=args.markdown, plot=args.plot)


def _run_generate(args: argparse.Namespace) -> int:
    from .generate import GenerateRequest, run_generate

    one_each = {name: value for name, value in option_values(args).items() if value is not None}
    return run_generate(GenerateRequest(
        prompt=args.prompt, file=args.file, policy=args.policy,
        budget=DEFAULT_BUDGET if args.budget is None else args.budget, budget_defaulted=args.budget is None,
        values=one_each, max_new_tokens=args.max_new_tokens, sample=args.sample,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
        chat=args.chat, prefill_chunk=args.prefill_chunk, positions=args.positions,
        prompt_aware=args.prompt_aware, prefill_budget=args.prefill_budget,
        observation_window=args.observation_window, pool_kernel=args.pool_kernel, pin_system=args.pin_system,
        chat_turns=tuple(args.chat_turns), archive=args.archive, model=args.model,
        attention=args.attention, threads=args.threads, backend=args.backend,
        progress=not args.no_progress), usage=args.usage)


def _run_longctx(args: argparse.Namespace) -> int:
    from .longctx import DEFAULT_LENGTHS, LongContextRequest, run_longctx

    _no_presets(args)
    return run_longctx(LongContextRequest(
        lengths=args.lengths or DEFAULT_LENGTHS, window=args.window,
        budgets=args.budgets or (1024, 2048), policies=args.policies or list(MODEL_POLICIES),
        values=option_values(args),
        positions=args.positions, chunk=args.prefill_chunk, text=args.text, model=args.model,
        attention=args.attention, threads=args.threads, backend=args.backend, json_path=args.json,
        plot=args.plot, progress=not args.no_progress))


def _run_eval(args: argparse.Namespace) -> int:
    from . import evaluate

    # The main job (no option flags) shows the recommendation beside the seed's defaults;
    # a sweep of option flags runs the registry's policies with them.
    swept = any(value is not None for value in option_values(args).values())
    policies = args.policies or list(MODEL_POLICIES if swept else evaluate.EvalRequest.policies)
    for name in policies:
        if name not in PRESETS:
            policy_spec(name)
    request = evaluate.EvalRequest(
        tokens=args.tokens, prompt_tokens=args.prompt_tokens, budgets=args.budgets,
        policies=policies, values=option_values(args), head_mode=args.head_mode,
        cache_mode=args.cache_mode, backend=args.backend, text=args.text, model=args.model,
        json_path=args.json, plot=args.plot, progress=not args.no_progress,
        attention=args.attention, threads=args.threads, hindsight=args.hindsight)
    return evaluate.run_eval(request)


def _run_record(args: argparse.Namespace) -> int:
    from . import evaluate

    request_record = evaluate.RecordRequest(
        tokens=args.tokens, prompt_tokens=args.prompt_tokens, layers=args.layers, out=args.out,
        text=args.text, model=args.model, progress=not args.no_progress,
        attention=args.attention, threads=args.threads)
    return evaluate.run_record(request_record)


_RUNNERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "replay": _run_replay, "eval": _run_eval, "record": _run_record, "report": _run_report,
    "generate": _run_generate, "longctx": _run_longctx, "tasks": _run_tasks,
}


def _run(args: argparse.Namespace) -> int:
    if getattr(args, "plot", None):
        _require_matplotlib()
    return _RUNNERS[args.command](args)


def _command_parser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The subcommand's parser (its ``prog`` is ``scissorhands <command>``), else ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def _status(exc: SystemExit) -> int:
    return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m scissorhands`` and the ``scissorhands`` script.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        0 on success; 2 on a user error: a usage error (argparse) or an input the
        library refuses (a :class:`~scissorhands.errors.ScissorhandsError`: a path, a
        file, a configuration), each reported before the work it would waste; 1 when
        the system fails during a run (an ``OSError``, such as a full disk); 130 on an
        interrupt.  A user error is printed as argparse prints its own, the subcommand's
        usage then ``scissorhands <command>: error: <message>``; a failure of the system
        is that last line alone; never a traceback.
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(_with_default_command(args_list))
        if extra:  # as parse_args, but under the subcommand's usage rather than the top level's
            _command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # --help, --version, usage errors
        return _status(exc)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return _run(args)
    except ScissorhandsError as exc:  # the library refused an input: a usage error, as argparse prints it
        try:
            _command_parser(parser, args.command).error(str(exc))
        except SystemExit as usage_error:
            return _status(usage_error)
    except OSError as exc:
        print(f"{_command_parser(parser, args.command).prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted", file=sys.stderr)
        return 130
