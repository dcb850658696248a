"""``python -m scissorhands generate``: text from a real model with a bounded KV cache.

The model's own ``generate`` runs with an :class:`~scissorhands.hf.EvictingCache`;
the text streams to stdout as it is produced, and one summary line goes to stderr:
the time to the first token (the prompt's prefill), tokens per second after it, the KV
positions and bytes held against what a full cache would hold at that length, and the
process's peak resident memory.  A prompt longer than the
budget is consumed in chunks (``--prefill-chunk``), the cache evicting after each, so
memory stays bounded during the prompt too.

This module imports neither torch nor the model until a run starts.
"""

from __future__ import annotations

import dataclasses
import math
import resource
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from scissorhands.errors import ScissorhandsError
from scissorhands.models import context_problem, model_problem, trained_context_of
from scissorhands.options import DEFAULT_BUDGET, PolicyOptions, flag_text, make_policy, policy_spec, preset

from .evaluate import _checkpoint_config
from .paths import input_problem

__all__ = ["GenerateRequest", "run_generate"]


@dataclass
class GenerateRequest:
    """What one ``generate`` run does.

    Attributes
    ----------
    prompt : str, optional
        The prompt; with ``file`` None and ``prompt`` None, stdin is read.
    file : str, optional
        A UTF-8 file holding the prompt (``-``: stdin).
    policy, budget : str, int
        The eviction policy, or a preset (``"recommended"``: its options and
        ``prompt_aware`` beneath any given here), and its budget (positions per layer
        and KV head).
    budget_defaulted : bool
        The budget was not given (the summary line says it is the default).
    values : mapping
        Option name -> value (one value each, not a sweep).
    max_new_tokens : int
    sample : bool
        Sample (with ``temperature``, ``top_k``, ``top_p``, ``seed``) instead of greedy.
    chat : bool or None
        Wrap the prompt in the tokenizer's chat template as a user message: True
        (refused when the tokenizer has none), False (the prompt as written), or None,
        the default: when the tokenizer has a chat template (an instruct model), as
        transformers' ``chat`` command and llama.cpp's conversation mode do.
    prefill_chunk : int
        Prompt tokens per forward (transformers' ``prefill_chunk_size``).
    positions : {"original", "cache"}
        How keys are positioned (:class:`~scissorhands.hf.EvictingCache`).
    prompt_aware : bool
        Hold the prompt (up to ``prefill_budget``) and evict at its end by its last
        ``observation_window`` rows' attention, max-pooled over ``pool_kernel``
        (:mod:`scissorhands.prompt_aware`); the three None: their defaults.
    pin_system : bool
        Pin what the chat template puts before the user's message (its system message
        and the user turn's header): no eviction takes those positions.
    chat_turns : sequence of str
        Later user turns, each asked after the previous answer on the same cache: the
        whole conversation is rendered through the chat template again each turn (the
        cache reuses what it has read of it: its longest common prefix), as a chat server
        does.  Needs the chat template.
    archive : {None, "float32", "int8"}
        The recall tier (:mod:`scissorhands.hf.recall`: what is evicted is archived and
        read again at a later turn); needs ``prompt_aware``.
    model, attention, threads, backend
        As for ``eval``; ``attention`` defaults to sdpa, transformers' default.
    """

    prompt: str | None = None
    file: str | None = None
    policy: str = "scissorhands"
    budget: int | None = DEFAULT_BUDGET
    values: Mapping[str, Any] = field(default_factory=dict)
    budget_defaulted: bool = False
    max_new_tokens: int = 128
    sample: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    chat: bool | None = None
    prefill_chunk: int = 256
    positions: str = "original"
    prompt_aware: bool = False
    prefill_budget: int | None = None
    observation_window: int | None = None
    pool_kernel: int | None = None
    pin_system: bool = False
    chat_turns: Sequence[str] = ()
    archive: str | None = None
    model: str | None = None
    attention: str = "sdpa"
    threads: int | None = 1
    backend: str = "native"
    progress: bool = False


#: The program name every ``generate`` error is printed under (argparse's for the subcommand).
PROG = "scissorhands generate"


class _Refused(Exception):
    """An argument ``generate`` cannot run with (its message names the flag)."""


def _fail(message: str, usage: str | None = None) -> int:
    if usage:
        sys.stderr.write(usage if usage.endswith("\n") else usage + "\n")
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _read_prompt(request: GenerateRequest, stdin: TextIO) -> str:
    if request.file is not None and request.prompt is not None:
        raise ScissorhandsError("give the prompt as an argument or with --file, not both")
    if request.prompt is not None:
        return request.prompt
    if request.file is None or request.file == "-":
        return stdin.read()
    problem = input_problem("--file", request.file)
    if problem:
        raise ScissorhandsError(problem)
    try:
        with open(request.file, encoding="utf-8") as handle:
            return handle.read()
    except UnicodeDecodeError as exc:
        raise ScissorhandsError(f"--file {request.file}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ScissorhandsError(f"--file {request.file}: cannot be read ({exc.strerror or exc})") from None


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def peak_rss_bytes() -> int:
    """The process's peak resident memory so far (Linux reports kilobytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) * (1 if sys.platform == "darwin" else 1024)


def _check_options(request: GenerateRequest) -> PolicyOptions:
    """The policy's options, checked by building the policy (a pool named by scope as
    one row, since the model's rows are not known yet), in the flags' names."""
    spec = policy_spec(request.policy)
    values = {k: v for k, v in request.values.items() if v is not None}
    unknown = [k for k in values if not spec.takes(k)]
    if unknown:
        flags = ", ".join("--" + k.replace("_", "-") for k in unknown)
        raise ScissorhandsError(f"{request.policy} takes no {flags}")
    options = PolicyOptions(**values)
    pool = options.pool
    try:
        make_policy(request.policy, request.budget, options, backend=request.backend,
                    heads=pool if isinstance(pool, int) and pool > 1 else 1, pools={"layer": 1, "model": 1})
    except ScissorhandsError as exc:  # the constructor's message, in the flags' names
        raise ScissorhandsError(f"{flag_text(exc)} (--budget {request.budget})") from None
    return options


_PROMPT_FLAGS = {"prefill_budget": "--prefill-budget", "observation_window": "--observation-window",
                 "pool_kernel": "--pool-kernel"}


def _prompt_kwargs(request: GenerateRequest, options: PolicyOptions) -> dict[str, Any]:
    """The cache's prompt-aware keywords, checked against the policy and budget (in
    the flags' names)."""
    from scissorhands.prompt_aware import PromptAware

    given = {name: getattr(request, name) for name in _PROMPT_FLAGS if getattr(request, name) is not None}
    if not request.prompt_aware:
        if given:
            raise ScissorhandsError(f"{', '.join(_PROMPT_FLAGS[n] for n in given)} needs --prompt-aware")
        return {}
    try:
        checked = PromptAware(True, **given).check(request.policy, request.budget, options)
    except ScissorhandsError as exc:
        text = str(exc).replace("prompt_aware", "--prompt-aware")
        for name, flag in _PROMPT_FLAGS.items():
            text = text.replace(name, flag)
        raise ScissorhandsError(f"{flag_text(type(exc)(text))} (--budget {request.budget})") from None
    return {"prompt_aware": True, "prefill_budget": checked.prefill_budget,
            "observation_window": checked.observation_window, "pool_kernel": checked.pool_kernel}


def _check_sampling(request: GenerateRequest) -> str | None:
    """Why the decoding flags cannot work, or None."""
    if request.max_new_tokens < 1:
        return f"--max-new-tokens must be at least 1, got {request.max_new_tokens}"
    if request.prefill_chunk < 1:
        return f"--prefill-chunk must be at least 1, got {request.prefill_chunk}"
    sampling = {"--temperature": request.temperature, "--top-k": request.top_k, "--top-p": request.top_p}
    given = [flag for flag, value in sampling.items() if value is not None]
    if given and not request.sample:
        return f"{', '.join(given)} needs --sample (without it decoding is greedy)"
    if request.temperature is not None and not (math.isfinite(request.temperature) and request.temperature > 0):
        return f"--temperature must be a positive number, got {request.temperature}"
    if request.top_k is not None and request.top_k < 1:
        return f"--top-k must be at least 1, got {request.top_k}"
    if request.top_p is not None and not 0 < request.top_p <= 1:
        return f"--top-p must be in (0, 1], got {request.top_p}"
    return None


def _check_request(request: GenerateRequest, stdin: TextIO) -> tuple[Any, PolicyOptions, str]:
    """Every argument checked before the model loads: ``(hf, options, prompt)``.

    Raises
    ------
    _Refused
        The first problem, naming its flag.
    """
    try:
        options = _check_options(request)
        _prompt_kwargs(request, options)
        prompt = _read_prompt(request, stdin)
    except ScissorhandsError as exc:
        raise _Refused(str(exc)) from None
    if not prompt.strip():
        raise _Refused("the prompt is empty")
    problem = _check_sampling(request)
    if problem:
        raise _Refused(problem)
    if request.pin_system and request.chat is False:
        raise _Refused("--pin-system pins the chat template's system message: drop --no-chat")
    if request.chat_turns and request.chat is False:
        raise _Refused("--chat-turns renders the conversation through the chat template: drop --no-chat")
    if request.archive is not None and not request.prompt_aware:
        raise _Refused(f"--archive {request.archive} needs --prompt-aware (what is archived comes back at a "
                       "prompt's end; the recommendation has it)")
    empty = [i for i, turn in enumerate(request.chat_turns, 2) if not turn.strip()]
    if empty:
        raise _Refused(f"--chat-turns: turn {empty[0]} is empty")
    problem = model_problem(request.model)
    if problem is not None:
        raise _Refused(problem if request.model is None else f"--model {problem}")
    try:
        from scissorhands import hf
    except ImportError as exc:
        raise _Refused(f"generate needs torch and the [hf] extra (see the README): {exc}") from None
    if request.positions not in hf.POSITION_MODES:
        raise _Refused(f"--positions must be one of {', '.join(hf.POSITION_MODES)}, got {request.positions!r}")
    config = _checkpoint_config(request.model)
    if config is not None:  # the model's rows known before it loads: the cache checked whole
        _build_cache(hf, config, request, options)
    elif request.positions == "cache" and hf.PolicyConfig(request.policy, request.budget, options).pooled:
        _build_cache(hf, None, request, options)  # refused before the model is read
    return hf, options, prompt


def _build_cache(hf: Any, target: Any, request: GenerateRequest, options: PolicyOptions) -> Any:
    """The evicting cache for ``target`` (a model, or a model's configuration).

    Raises
    ------
    _Refused
        The cache refuses the configuration for this model (a pool that does not divide
        its rows, ``--positions cache`` with a pool, ...).
    """
    kwargs: dict[str, Any] = dict(backend=request.backend, positions=request.positions)
    if request.archive is not None:
        kwargs["archive"] = request.archive
    try:
        kwargs.update(_prompt_kwargs(request, options))
        if hasattr(target, "generate"):
            return hf.EvictingCache.from_model(target, request.policy, request.budget, options, **kwargs)
        return hf.EvictingCache(target, request.policy, request.budget, options, **kwargs)
    except ScissorhandsError as exc:
        raise _Refused(flag_text(exc)) from None


def _uses_chat(request: GenerateRequest, tokenizer: Any) -> bool:
    """Whether the prompt goes through the chat template: ``chat`` True (refused
    without a template), False, or None: when the tokenizer has one, as an instruct
    model's command line does (transformers' ``chat`` command, llama.cpp's conversation
    mode)."""
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if request.chat and not has_template:
        raise _Refused("--chat: the tokenizer has no chat template")
    return has_template if request.chat is None else bool(request.chat)


def system_span(tokenizer: Any) -> tuple[int, int]:
    """The positions the chat template puts before a user's message, ``(0, n)``: its
    system message (the template's default when none is given) and the user turn's
    header; found as the tokens two renderings with different messages share."""
    rendered = [_inputs(tokenizer, text, True)["input_ids"][0].tolist() for text in ("0", "Z")]
    n = 0
    for a, b in zip(*rendered):
        if a != b:
            break
        n += 1
    return 0, n


def _pin_system(cache: Any, tokenizer: Any, chat: bool) -> None:
    """``--pin-system``: pin the chat template's system span in every row.

    Raises
    ------
    _Refused
        No chat template, a template that puts nothing before the message, or pins
        the budget cannot hold.
    """
    if not chat:
        raise _Refused("--pin-system: the tokenizer has no chat template")
    start, stop = system_span(tokenizer)
    if stop <= start:
        raise _Refused("--pin-system: the chat template puts nothing before the user's message")
    try:
        cache.pin(start, stop)
    except ScissorhandsError as exc:
        raise _Refused(f"--pin-system (positions {start}..{stop - 1}): {flag_text(exc)}") from None


def _inputs(tokenizer: Any, prompt: str | list[dict[str, str]], chat: bool) -> Any:
    """The model's inputs for a prompt, or (``chat``) a conversation of messages."""
    if chat:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                             return_dict=True)
    assert isinstance(prompt, str)
    return tokenizer(prompt, return_tensors="pt")


def _generate_kwargs(request: GenerateRequest, tokenizer: Any) -> dict[str, Any]:
    """The keywords of ``model.generate`` besides the inputs, the cache and the streamer."""
    kwargs: dict[str, Any] = {"max_new_tokens": request.max_new_tokens, "do_sample": request.sample,
                              "prefill_chunk_size": request.prefill_chunk,
                              "pad_token_id": tokenizer.pad_token_id or tokenizer.eos_token_id}
    if request.sample:
        for name in ("temperature", "top_k", "top_p"):
            if getattr(request, name) is not None:
                kwargs[name] = getattr(request, name)
    return kwargs


def _streamer(tokenizer: Any, stream: TextIO, first_token: list[float]) -> Any:
    """A ``TextStreamer`` writing to ``stream`` as text arrives, noting in
    ``first_token`` when the first generated token came."""
    from transformers import TextStreamer

    class _Streamer(TextStreamer):  # to the stream given, flushed as text arrives
        def put(self, value: Any) -> None:
            if not self.next_tokens_are_prompt and not first_token:  # the first generated token
                first_token.append(time.perf_counter())
            super().put(value)

        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            stream.write(text + ("\n" if stream_end else ""))
            stream.flush()

    return _Streamer(tokenizer, skip_prompt=True, skip_special_tokens=True)


def _prompt_progress(model: Any, prompt_tokens: int, chunk: int, show: bool) -> tuple[Any, Any]:
    """A progress bar over the prompt's chunks, counted as the model's forwards receive
    them (a forward pre-hook, PyTorch's own extension point): ``(bar, hook)``, both
    None when the prompt fits one chunk or ``show`` is off.  The bar redraws at every
    chunk (``miniters=1``: tqdm's adaptive count would skip a last, shorter chunk and
    leave the bar short of the prompt's length)."""
    if not show or prompt_tokens <= chunk:
        return None, None
    from tqdm.auto import tqdm

    bar = tqdm(total=prompt_tokens, desc="prompt", unit="tok", leave=False, file=sys.stderr, mininterval=0,
               miniters=1)

    def _count(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and bar.n < prompt_tokens:
            bar.update(min(int(ids.shape[-1]), prompt_tokens - bar.n))
            if bar.n >= prompt_tokens:
                bar.close()

    return bar, model.register_forward_pre_hook(_count, with_kwargs=True)


def _summary(cache: Any, new: int, prompt_tokens: int, start: float, end: float, first_token: list[float]) -> str:
    """The summary line: tokens, time to the first and rate after it, KV held, peak RSS."""
    first = (first_token[0] if first_token else end) - start
    rate = f"{(new - 1) / (end - start - first):.1f} tokens/s" if new > 1 and end - start > first else "-"
    seen = cache.get_seq_length()
    held = int(cache.held_counts().max(initial=0))
    held_bytes, full_bytes = cache.kv_bytes(held), cache.kv_bytes(seen)
    return (f"{new} token{'' if new == 1 else 's'} in {end - start:.1f} s: the first after {first:.2f} s "
            f"(prompt of {prompt_tokens} token{'' if prompt_tokens == 1 else 's'}), then {rate}; "
            f"KV held: {held} of {seen} positions per layer and KV head, "
            f"{_bytes(held_bytes)} against a full cache's {_bytes(full_bytes)}; peak RSS "
            f"{_bytes(peak_rss_bytes())}")


def _nothing_came(tokenizer: Any, generated: Any, chat: bool) -> str | None:
    """Why the streamed text is empty, when it is (every token generated a special
    one, such as the end of a turn), with what to pass; else None."""
    ids = [int(i) for i in generated]
    if tokenizer.decode(ids, skip_special_tokens=True).strip():
        return None
    shown = tokenizer.decode(ids[:3], skip_special_tokens=False)
    advice = ("the model ended its chat turn at once; try another prompt, or --no-chat to continue the text "
              "as written" if chat else "a raw prompt to an instruct model is often answered by an end of "
              "turn; drop --no-chat (or pass --chat) to send it as a chat message")
    return f"note: no text came: the model generated only special tokens ({shown!r}): {advice}"


def resolve_preset(request: GenerateRequest) -> tuple[GenerateRequest, str | None]:
    """``request`` with a preset named as its policy resolved (the preset's option
    values beneath those given, its ``prompt_aware`` unless given), and the line that
    says what runs (None when it is a policy at a given budget)."""
    chosen = preset(request.policy)
    defaulted = " (the default; --budget N to change it)" if request.budget_defaulted else ""
    if chosen is None:
        return request, (f"configuration: {request.policy}, budget {request.budget}{defaulted}"
                         if defaulted and policy_spec(request.policy).evicts else None)
    values = {**chosen.values, **request.values}
    resolved = dataclasses.replace(request, policy=chosen.policy, values=values,
                                   prompt_aware=request.prompt_aware or chosen.prompt_aware)
    shown = " ".join(f"--{name.replace('_', '-')} {f'{value:.0%}' if isinstance(value, float) else value}"
                     for name, value in values.items())
    return resolved, (f"configuration: {chosen.name} = --policy {chosen.policy} {shown}"
                      f"{' --prompt-aware' if resolved.prompt_aware else ''}, budget {request.budget}{defaulted}")


def run_generate(request: GenerateRequest, stdin: TextIO | None = None, stdout: TextIO | None = None,
                 usage: str | None = None) -> int:
    """``python -m scissorhands generate``. Every argument is checked before the model
    loads (and, for a checkpoint directory, the cache against its configuration).
    Every error is one line under :data:`PROG` (after ``usage``, the command's usage,
    when given). Returns the process exit status: 0, or 2 on a bad argument."""
    stdin = sys.stdin if stdin is None else stdin
    stream = sys.stdout if stdout is None else stdout
    request, said = resolve_preset(request)
    try:
        hf, options, prompt = _check_request(request, stdin)
        if said:
            print(said + ("" if request.archive is None else f", --archive {request.archive}"), file=sys.stderr)
        hf.set_threads(request.threads)
        try:
            model, tokenizer = hf.load_model(request.model, progress=request.progress,
                                             attn_implementation=request.attention)
        except (ScissorhandsError, OSError) as exc:
            raise _Refused(str(exc)) from None
        chat = _uses_chat(request, tokenizer)
        cache = _build_cache(hf, model, request, options)
        if request.pin_system:
            _pin_system(cache, tokenizer, chat)
        if request.chat_turns and not chat:
            raise _Refused("--chat-turns: the tokenizer has no chat template")
        messages = [{"role": "user", "content": prompt}]
        for turn in (None, *request.chat_turns):
            if turn is not None:  # the next turn, the whole conversation rendered again
                stream.write(f"\n>>> {turn}\n")  # after the answer's own newline
                messages.append({"role": "user", "content": turn})
            inputs = _inputs(tokenizer, messages if chat else prompt, chat)
            _check_context(request, model, inputs)
            messages.append({"role": "assistant", "content": _generate(request, model, tokenizer, cache, inputs,
                                                                        chat, stream)})
        return 0
    except _Refused as exc:
        return _fail(str(exc), usage)
    except ScissorhandsError as exc:  # refused by the cache while generating
        return _fail(str(exc), usage)


def _check_context(request: GenerateRequest, model: Any, inputs: Any) -> None:
    """Refuse a prompt past the model's trained context (with true positions); a note
    when only the generated tokens pass it."""
    problem = context_problem(trained_context_of(model.config),
                              int(inputs["input_ids"].shape[1]), request.max_new_tokens, request.positions,
                              policy_spec(request.policy).evicts)
    if problem and problem[1]:
        raise _Refused(problem[0])
    if problem:
        print(problem[0], file=sys.stderr)


def _generate(request: GenerateRequest, model: Any, tokenizer: Any, cache: Any, inputs: Any, chat: bool,
              stream: TextIO) -> str:
    """Stream the answer to ``stream``, then the summary line (and why nothing came,
    when nothing did) to stderr; returns the answer's text."""
    import torch

    kwargs = _generate_kwargs(request, tokenizer)
    if request.seed is not None:
        torch.manual_seed(request.seed)
    first_token: list[float] = []
    prompt_tokens = int(inputs["input_ids"].shape[1])
    bar, hook = _prompt_progress(model, prompt_tokens, request.prefill_chunk, request.progress)
    start = time.perf_counter()
    try:
        with torch.no_grad():
            streamer = _streamer(tokenizer, stream, first_token)
            out = model.generate(**inputs, cache=cache, streamer=streamer, **kwargs)
    finally:
        if hook is not None:
            hook.remove()
        if bar is not None:
            bar.close()
    end = time.perf_counter()
    new = int(out.shape[1]) - prompt_tokens
    print(_summary(cache, new, prompt_tokens, start, end, first_token), file=sys.stderr)
    note = _nothing_came(tokenizer, out[0, prompt_tokens:], chat) if new >= 1 else None
    if note:
        print(note, file=sys.stderr)
    return str(tokenizer.decode(out[0, prompt_tokens:], skip_special_tokens=True))
