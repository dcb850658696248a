"""What an evicting cache counts of its time and actions (:class:`CacheStats`, ``cache.stats``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CacheStats:
    """Where a cache's time went, in seconds, and how often it acted.

    ``policy_seconds``: the policy calls (a steady decode step's measured inside its one
    C call, ``sh_cache_step_steady``, where for plain Scissorhands votes it includes
    gathering each row's weights and stepping its slot table row, done row by row in the
    policy's pass); ``bookkeeping_seconds``: the cache's own work
    around them (each layer's hand-over of its attention weights, GQA mean, gathering
    weights into kept order, masks, freeing slots, compactions; not, from a decode
    step's second layer on, handing over the mask its first layer built or
    transformers' own); ``rows_seconds``: computing the attention rows that the wrapped
    implementation does not return (``sdpa``); ``update_seconds``: planning the
    forward's slots and writing keys and values; ``rerotate_seconds``: moving keys and queries to their ranks
    (``positions="cache"``).  ``steps``: single-token forwards; ``chunks``: several-token forwards;
    ``compactions``: rebuilt layouts; ``prompt_ends``: prompt-end evictions
    (``prompt_aware``: the first decode step after a prompt), their time in
    ``policy_seconds`` and ``bookkeeping_seconds``; ``recalled``: archived positions
    held after a prompt's end (``archive``: brought back when the prompt began, or chosen
    over held ones at its end)."""

    policy_seconds: float = 0.0
    bookkeeping_seconds: float = 0.0
    rows_seconds: float = 0.0
    update_seconds: float = 0.0
    rerotate_seconds: float = 0.0
    steps: int = 0
    chunks: int = 0
    compactions: int = 0
    prompt_ends: int = 0
    recalled: int = 0
