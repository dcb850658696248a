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

import math
import os
import resource
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from .errors import ScissorhandsError
from .models import model_problem
from .options import OPTIONS, PolicyOptions, make_policy, policy_spec

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
        The eviction policy and its budget (positions per layer and KV head).
    values : mapping
        Option name -> value (one value each, not a sweep).
    max_new_tokens : int
    sample : bool
        Sample (with ``temperature``, ``top_k``, ``top_p``, ``seed``) instead of greedy.
    chat : bool
        Wrap the prompt in the tokenizer's chat template as a user message.
    prefill_chunk : int
        Prompt tokens per forward (transformers' ``prefill_chunk_size``).
    positions : {"original", "cache"}
        How keys are positioned (:class:`~scissorhands.hf.EvictingCache`).
    model, attention, threads, backend
        As for ``eval``; ``attention`` defaults to sdpa, transformers' default.
    """

    prompt: str | None = None
    file: str | None = None
    policy: str = "scissorhands"
    budget: int | None = 512
    values: Mapping[str, Any] = field(default_factory=dict)
    max_new_tokens: int = 128
    sample: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    chat: bool = False
    prefill_chunk: int = 256
    positions: str = "original"
    model: str | None = None
    attention: str = "sdpa"
    threads: int | None = 1
    backend: str = "native"
    progress: bool = False


def _fail(message: str) -> int:
    print(f"scissorhands: error: {message}", file=sys.stderr)
    return 2


def _read_prompt(request: GenerateRequest, stdin: TextIO) -> str:
    if request.file is not None and request.prompt is not None:
        raise ScissorhandsError("give the prompt as an argument or with --file, not both")
    if request.prompt is not None:
        return request.prompt
    if request.file is None or request.file == "-":
        return stdin.read()
    if not os.path.isfile(request.file):
        raise ScissorhandsError(f"--file {request.file}: no such file")
    with open(request.file, encoding="utf-8") as handle:
        return handle.read()


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


def run_generate(request: GenerateRequest, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """``python -m scissorhands generate``. Every argument is checked before the model
    loads. Returns the process exit status: 0, or 2 on a bad argument."""
    stdin = sys.stdin if stdin is None else stdin
    stream = sys.stdout if stdout is None else stdout
    try:
        spec = policy_spec(request.policy)
        values = {k: v for k, v in request.values.items() if v is not None}
        unknown = [k for k in values if not spec.takes(k)]
        if unknown:
            flags = ", ".join("--" + k.replace("_", "-") for k in unknown)
            raise ScissorhandsError(f"{request.policy} takes no {flags}")
        options = PolicyOptions(**values)
        try:
            make_policy(request.policy, request.budget, options, backend=request.backend)
        except ScissorhandsError as exc:  # the constructor's message, in the flags' names
            message = str(exc)
            for option in OPTIONS:
                message = message.replace(option.name, option.flag)
            raise ScissorhandsError(f"{message} (--budget {request.budget})") from None
        prompt = _read_prompt(request, stdin)
    except ScissorhandsError as exc:
        return _fail(str(exc))
    if not prompt.strip():
        return _fail("the prompt is empty")
    if request.max_new_tokens < 1:
        return _fail(f"--max-new-tokens must be at least 1, got {request.max_new_tokens}")
    if request.prefill_chunk < 1:
        return _fail(f"--prefill-chunk must be at least 1, got {request.prefill_chunk}")
    sampling = {"--temperature": request.temperature, "--top-k": request.top_k, "--top-p": request.top_p}
    given = [flag for flag, value in sampling.items() if value is not None]
    if given and not request.sample:
        return _fail(f"{', '.join(given)} needs --sample (without it decoding is greedy)")
    if request.temperature is not None and not (math.isfinite(request.temperature) and request.temperature > 0):
        return _fail(f"--temperature must be a positive number, got {request.temperature}")
    if request.top_k is not None and request.top_k < 1:
        return _fail(f"--top-k must be at least 1, got {request.top_k}")
    if request.top_p is not None and not 0 < request.top_p <= 1:
        return _fail(f"--top-p must be in (0, 1], got {request.top_p}")
    problem = model_problem(request.model)
    if problem is not None:
        return _fail(problem if request.model is None else f"--model {problem}")
    try:
        from . import hf
    except ImportError as exc:
        return _fail(f"generate needs torch and the [hf] extra (see the README): {exc}")
    if request.positions not in hf.POSITION_MODES:
        return _fail(f"--positions must be one of {', '.join(hf.POSITION_MODES)}, got {request.positions!r}")
    import torch
    from transformers import TextStreamer

    hf.set_threads(request.threads)
    try:
        model, tokenizer = hf.load_model(request.model, progress=request.progress,
                                         attn_implementation=request.attention)
    except (ScissorhandsError, OSError) as exc:
        return _fail(str(exc))
    if request.chat:
        if getattr(tokenizer, "chat_template", None) is None:
            return _fail("--chat: the tokenizer has no chat template")
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)
    else:
        inputs = tokenizer(prompt, return_tensors="pt")
    cache = hf.EvictingCache.from_model(model, request.policy, request.budget, options, backend=request.backend,
                                        positions=request.positions)
    kwargs: dict[str, Any] = {"max_new_tokens": request.max_new_tokens, "do_sample": request.sample,
                              "prefill_chunk_size": request.prefill_chunk,
                              "pad_token_id": tokenizer.pad_token_id or tokenizer.eos_token_id}
    if request.sample:
        for name in ("temperature", "top_k", "top_p"):
            if getattr(request, name) is not None:
                kwargs[name] = getattr(request, name)
    if request.seed is not None:
        torch.manual_seed(request.seed)

    first_token: list[float] = []

    class _Streamer(TextStreamer):  # to the stream given, flushed as text arrives
        def put(self, value: Any) -> None:
            if not self.next_tokens_are_prompt and not first_token:  # the first generated token
                first_token.append(time.perf_counter())
            super().put(value)

        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            stream.write(text + ("\n" if stream_end else ""))
            stream.flush()

    prompt_tokens = int(inputs["input_ids"].shape[1])
    bar, hook = None, None
    if request.progress and prompt_tokens > request.prefill_chunk:
        # The prompt's chunks, counted as the model's forwards receive them (a forward
        # pre-hook, PyTorch's own extension point), so that a long prompt shows progress.
        from tqdm.auto import tqdm

        bar = tqdm(total=prompt_tokens, desc="prompt", unit="tok", leave=False, file=sys.stderr, mininterval=0)

        def _count(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            if bar is not None and ids is not None and bar.n < prompt_tokens:
                bar.update(min(int(ids.shape[-1]), prompt_tokens - bar.n))
                if bar.n >= prompt_tokens:
                    bar.close()

        hook = model.register_forward_pre_hook(_count, with_kwargs=True)
    start = time.perf_counter()
    try:
        with torch.no_grad():
            streamer = _Streamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
            out = model.generate(**inputs, cache=cache, streamer=streamer, **kwargs)
    finally:
        if hook is not None:
            hook.remove()
        if bar is not None:
            bar.close()
    end = time.perf_counter()
    new = int(out.shape[1]) - prompt_tokens
    first = (first_token[0] if first_token else end) - start
    rate = f"{(new - 1) / (end - start - first):.1f} tokens/s" if new > 1 and end - start > first else "-"
    seen = cache.get_seq_length()
    held = int(cache.held_counts().max(initial=0))
    held_bytes, full_bytes = cache.kv_bytes(held), cache.kv_bytes(seen)
    print(f"{new} tokens in {end - start:.1f} s: the first after {first:.2f} s (prompt of {prompt_tokens} "
          f"tokens), then {rate}; KV held: {held} of {seen} positions per layer and KV head, "
          f"{_bytes(held_bytes)} against a full cache's {_bytes(full_bytes)}; peak RSS "
          f"{_bytes(peak_rss_bytes())}", file=sys.stderr)
    return 0
