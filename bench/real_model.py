"""What the real-model benchmarks (``bench.decode``, ``bench.ttft``) share: their
``--json`` check before anything loads, and SmolLM2-135M on one torch thread with the
built-in text's token ids."""

from __future__ import annotations

import argparse
from typing import Any

from scissorhands.commands.paths import output_problem


def check_json(parser: argparse.ArgumentParser, path: str | None) -> None:
    """Exit through ``parser.error`` when ``--json path`` cannot be written."""
    problem = output_problem("--json", path)
    if problem:
        parser.error(problem)


def load_smollm2() -> tuple[Any, Any, Any]:
    """``(model, tokenizer, ids)``: SmolLM2-135M (sdpa, one torch thread), its tokenizer
    and the built-in text's token ids, a ``(1, N)`` int64 tensor."""
    import torch

    from scissorhands import hf
    from scissorhands.commands.evaluate import default_text

    torch.set_num_threads(1)
    model, tokenizer = hf.load_model(progress=False)
    return model, tokenizer, tokenizer(default_text(), return_tensors="pt")["input_ids"]
