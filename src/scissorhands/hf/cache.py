"""The transformers cache whose layers keep only the positions their policies hold.

:class:`EvictingCache` is a transformers ``Cache`` that ``model.generate`` (or a plain
``model(...)`` forward) drives like any other; :meth:`EvictingCache.from_model` also
installs what the model needs so that the cache sees each new query row's attention
(:mod:`scissorhands.hf.attention`).  Per forward:

1. transformers asks the cache for the tokens seen (``get_seq_length``: the true
   position of the next token, so positions need no help from the caller) and the mask
   sizes (the held slots);
2. every full-attention layer writes its new keys and values into the cache
   (:mod:`scissorhands.hf.storage`) and attends over the held ones, with the cache's own
   mask per (sequence, KV head) once positions have been evicted;
3. the attention weights of the new query rows reach the cache; after the last layer,
   one call per configuration (one for a plain cache) hands every row's weights to the
   policies (the GQA mean over each KV head's query heads, without the token's weight
   on itself, not renormalised): ``step_rows`` for one token, ``extend`` then
   ``evict_rows`` for several (a prompt, a new turn); the victims' slots are freed.

What one forward owns (which layers wrote and handed over their weights, the weights
gathered, which new tokens are padding, the rotary positions and rotations of
``positions="cache"``) is one object, created at the first evicting layer's write and
dropped after the step or by ``reset()``; observers (:meth:`EvictingCache.add_observer`)
see every layer's weights as they come.

Keys keep their original rotary rotation and the model its true positions (as H2O
does), unless ``positions="cache"``.  Padding is never admitted: a left-padded sequence's rows hold fewer positions.
Sliding-window layers (Gemma-2's every other layer) are transformers' own, already
bounded, and not evicted.

Scissorhands: Liu et al., NeurIPS 2023, arXiv 2305.17118; every other policy's paper is
its registry entry's ``paper`` (:data:`scissorhands.options.SPECS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from transformers.cache_utils import Cache

from .._native import ffi
from .._shared import partial_repr
from ..errors import InvalidInputError, InvalidTypeError
from ..options import PolicyOptions, expand_preset, preset
from . import attention, copies, forward, guards, inspection, layer, observers, positions, prompt_end, step
from . import prefix as _prefix
from ._cache_state import CacheState
from .archive import Archive, check_archive
from .flight import _Forward
from .gqa import DecodeWeights
from .guards import _outside_graph
from .layer import EvictingLayer
from .observers import AttentionObserver, ObserverHandle
from .pins import _check_pins_leave_room, _checked_pins, _spans
from .pins import pin as _pin
from .recall import WindowQueries
from .rope import rotary_frequencies
from .rows import PolicyConfig, PolicyRows, check_pools
from .settings import (
    HEAD_MODES,
    POSITION_MODES,
    _check_modes,
    _check_prompt_aware,
    _policy_configs,
    _prompt_settings,
)
from .shape import ModelShape, shape_of
from .stats import CacheStats
from .storage import make_storage

__all__ = ["HEAD_MODES", "POSITION_MODES", "AttentionObserver", "CacheStats", "EvictingCache", "EvictingLayer",
           "ObserverHandle"]


class EvictingCache(Cache):
    """A transformers cache that keeps, per (sequence, layer, KV head), only the
    positions an eviction policy holds.

    Use :meth:`from_model`, which also installs the attention the cache needs::

        cache = EvictingCache.from_model(model, "scissorhands", budget=256, recent_window=0.75, sinks=4)
        out = model.generate(**inputs, cache=cache, max_new_tokens=200)

    Parameters
    ----------
    config : transformers.PretrainedConfig
        The model's configuration (layers, layer types, query and KV heads).
    policy : str, default "scissorhands"
        A registry name (a key of :data:`scissorhands.options.SPECS`, e.g. ``"h2o"``);
        or a preset (:data:`scissorhands.options.PRESETS`): ``"recommended"`` is
        Scissorhands with ``recent_window=0.75, sinks=4, prompt_aware=True``, any of which
        a keyword given beside it overrides.
    budget : int or None, default 512
        Positions each (sequence, layer, KV head) holds after every step; above the
        recent window plus the sinks, so at least 33 with the default recent window of
        32 (``DefaultRefusedError``, an ``InvalidInputError``, says so and how to pass
        a smaller one, such as ``recent_window=0.75``).  ``full`` never evicts: it
        takes None, or an integer checked as the others check theirs (>= 1).
    options : PolicyOptions, optional
        The policy's options; or give them as keywords (``recent_window=0.75``, ...).
    head_mode : {"per-head", "mean"}, default "per-head"
    cache_mode : {"reuse", "compact"}, default "reuse"
        How the keys and values are laid out (:mod:`scissorhands.hf.storage`); both keep
        the same positions.
    backend : {"native", "reference"}, default "native"
    positions : {"original", "cache"}, default "original"
        ``original``: keys keep their rotary rotation, tokens their true positions;
        ``cache``: per row the held keys at ranks 0..n-1 and the query at n (see Notes).
    configs : sequence of PolicyConfig, optional
        One configuration per sequence of the batch instead (``eval`` runs every
        configuration as one batch); excludes ``policy``/``budget``/``options``.
    prompt_aware : bool or None, default None
        (None: False, or the preset's.) Hold the prompt and decide at its end (see
        Notes): the policies of :data:`scissorhands.prompt_aware.PROMPT_AWARE_POLICIES`
        only (StreamingLLM reads no attention, Full never evicts), not with pooled
        budgets nor ``configs``.
    prefill_budget : int, default 4096
        ``prompt_aware``: positions each (sequence, layer, KV head) may hold while a
        prompt is read, at least ``budget``; each chunk evicts to it by the policy's
        own rule (memory is bounded by it, not by the prompt).
    observation_window : int, default 16
        ``prompt_aware``: the prompt's last rows whose attention scores the held
        positions at its end; with the policy's sinks below ``budget``.
    pool_kernel : int, default 15
        ``prompt_aware``: the max-pooling kernel over held positions (odd, >= 1; 1: no
        pooling).  Defaults measured in ``docs/prompt-aware-research.md``.  These three
        are refused without ``prompt_aware=True`` (rather than silently unused).
    pins : sequence of (start, stop), default ()
        Spans of positions no row ever evicts (a system prompt; :meth:`pin`), checked
        by the policies' ``pin`` at construction.
    prefix : {"reuse", "refuse"}, default "reuse"
        A prompt that does not continue the token ids the cache has read: reuse the
        longest common prefix, dropping what is held from the first difference on, or
        refuse it, nothing changed (:meth:`reuse_prefix`).
    archive : {None, "float32", "int8"}, default None
        The recall tier (:mod:`scissorhands.hf.recall`): what the policies evict is
        archived (host memory, never attended) and, at every prompt's end, the window
        scores held and archived positions together, so that a later turn's question
        can bring back what an earlier prompt's end dropped.  Needs
        ``prompt_aware=True``, ``positions="original"``, ``head_mode="per-head"``,
        one unpooled configuration of a policy of ``PROMPT_AWARE_POLICIES``.  Its bytes:
        :meth:`archive_bytes` (not in :meth:`memory_bytes`, which is what attention reads).

    Raises
    ------
    InvalidInputError, InvalidTypeError
        Before anything is built: a ``config`` that is not a transformers model config,
        an unknown policy, head or cache mode, a budget or option the policy refuses, a
        model without a full-attention layer or with layers the cache cannot hold.

    Notes
    -----
    ``get_seq_length()`` is the number of tokens seen (padding included), so
    transformers derives each token's true position itself; ``get_mask_sizes`` reports
    the held slots.  ``reorder_cache`` (beam search), ``batch_repeat_interleave`` and
    ``batch_select_indices`` move the policy rows with the keys and values;
    ``copy.deepcopy`` gives an independent cache; ``reset()`` makes it ready for a new
    prompt.

    A forward that raises leaves the cache as it was before it: at once when the
    exception comes from the cache's own work (a policy refusing non-finite attention,
    an observer), else when transformers next asks for the length or the mask sizes, at
    the next write, ``reset`` or change of the batch (reads in between show what was
    held before it).  A sequence whose attention is not finite while others' are
    (an inf or NaN in a padded token's embedding spreads through its sequence) hands
    its policies zero attention and the batch goes on, as the stock cache's does;
    attention finite in no sequence is refused.

    ``crop`` (other than ``crop(0)``) and ``early_initialization`` raise: an evicted
    position is gone.

    ``prompt_aware`` (SnapKV's observation window, Li et al., 2024, arXiv 2404.14469):
    a *prompt* is every forward of more than one token (the first forward too, and a
    new turn after decode steps); its chunks evict to ``prefill_budget`` instead of the
    budget.  The cache keeps the GQA-reduced attention (as the policies get it) of the
    last ``observation_window`` held positions' rows, over each row's held positions in
    kept order, across chunk boundaries (a last chunk shorter than the window takes
    rows of the chunks before; padding is never a row; a position whose row the cache
    no longer has, such as a decode token before a new turn, gives a zero row).  When
    the first decode step begins (a forward of one token: at its ``get_mask_sizes``, or
    its first write, before its attention is computed), every row evicts to the budget
    by the policy's ``evict_observed_rows`` (the window's summed attention, max-pooled
    over ``pool_kernel`` held positions; the sinks and the window's own positions
    protected) and the victims' slots are freed; decoding then goes on by the policy's
    own rule (``stats.prompt_ends`` counts these evictions).  A prompt never followed
    by a decode step stays as read.  A chunked prefill whose last chunk is a single
    token reads that token as the first decode step.  Beams, ``batch_select_indices``
    and ``batch_repeat_interleave`` move the window with their sequences;
    ``copy.deepcopy`` copies it, ``reset()`` forgets it.  A first decode step that fails
    after its mask was sized keeps the prompt-end eviction (it is not part of the
    forward) and undoes only the step.

    ``positions="cache"`` (needs :meth:`from_model`, which finds the model's rotary
    embedding) puts, once positions were evicted, each held key at its rank and the
    query at the rank after them, in the installed attention (``stats.rerotate_seconds``).
    Float32 keys are kept rotated at their ranks (plus one offset per row, which the
    logits do not see) and only those whose rank changed turn, in place
    (:mod:`scissorhands.hf.rope`: after a one-victim step, the keys before the victim,
    none of the recent window); other dtypes are turned from their stored rotation each
    step, on copies.  Either way the attention logits equal those of keys rotated at
    their ranks from scratch to float32 rounding (about 1e-6 relative).
    """

    def __init__(self, config: Any, policy: str = "scissorhands", budget: int | None = 512,
                 options: PolicyOptions | None = None, *, head_mode: str = "per-head",
                 cache_mode: str = "reuse", backend: str = "native", positions: str = "original",
                 configs: Sequence[PolicyConfig] | None = None, prompt_aware: bool | None = None,
                 prefill_budget: int | None = None, observation_window: int | None = None,
                 pool_kernel: int | None = None, pins: Sequence[tuple[int, int]] = (), prefix: str = "reuse",
                 archive: str | None = None, **option_values: Any) -> None:
        _check_modes(positions, head_mode, cache_mode)
        #: What a prompt that does not continue what the cache read does (:meth:`reuse_prefix`).
        self.prefix = _prefix.check_mode(prefix)
        #: The preset the policy was named by (``"recommended"``), or None.
        self.preset = preset(policy) if configs is None else None
        policy, options, option_values, prompt_aware = expand_preset(policy, options, option_values, prompt_aware)
        configs, self.per_sequence = _policy_configs(policy, budget, options, backend, positions, configs,
                                                     option_values)
        self.prompt_aware = _check_prompt_aware(
            _prompt_settings(prompt_aware, prefill_budget, observation_window, pool_kernel), configs,
            self.per_sequence)
        #: ``archive``: what the policies evict is kept here and recalled at a prompt's end.
        self.archive = check_archive(archive, prompt_aware=self.prompt_aware.enabled, positions=positions,
                                     head_mode=head_mode, configs=configs, per_sequence=self.per_sequence)
        #: The pinned spans every policy row gets, merged (:meth:`pin`).
        self._pins: list[tuple[int, int]] = _checked_pins(configs, [], _spans(pins))
        #: The spans given to the constructor: every row's policy is built with them.
        self._initial_pins = list(self._pins)
        _check_pins_leave_room(self._pins, self.prompt_aware, configs)
        # The options first (the command line checks them with no model yet), then the model.
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        if not isinstance(getattr(text, "num_attention_heads", None), int):
            raise InvalidTypeError(f"EvictingCache needs the model's transformers config (model.config), not "
                                   f"{type(config).__name__}; EvictingCache.from_model(model, ...) passes it")
        self.num_heads = int(text.num_attention_heads)
        self.num_kv_heads = int(getattr(text, "num_key_value_heads", None) or self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise InvalidInputError(f"{self.num_heads} query heads do not split into {self.num_kv_heads} KV heads")
        self.groups = self.num_heads // self.num_kv_heads
        layers, evicting = self._build_layers(text)
        super().__init__(layers=layers)
        #: The model's shape the cache is laid out for (:mod:`scissorhands.hf.shape`).
        self.shape: ModelShape = shape_of(text)
        self.configs = configs
        #: Whether any policy reads attention (else the cache gathers no weights).
        self._policies_read = any(c.reads_attention for c in configs)
        self.positions = positions
        self.rotary: Any = None  # the model's rotary embedding (positions="cache"; from_model)
        self.head_mode = head_mode
        self.cache_mode = cache_mode
        self.evicting_layers = evicting
        self.policy_heads = self.num_kv_heads if head_mode == "per-head" else 1
        check_pools(configs, evicting, self.policy_heads)
        budgets = [c.budget for c in configs if c.evicts and c.budget is not None]
        # Pools let a layer's KV heads hold different counts: they share one buffer a layer.
        share = self.policy_heads > 1 and any(c.pooled for c in configs)
        self.storage = make_storage(cache_mode, evicting, (max(budgets) + 1) if budgets else 64, share)
        self.bank: PolicyRows | None = None
        self.seen = 0
        self.stats = CacheStats()
        #: The forward in flight (None between forwards): what it owns, dropped whole.
        self._forward: _Forward | None = None
        #: transformers' own layers (sliding windows) as they were before this forward
        #: wrote to them: model layer index -> (keys, values, tokens seen, initialized).
        self._slid: dict[int, tuple[Any, ...]] = {}
        self._observers: list[AttentionObserver] = []
        #: Where a decode step's gathered weights go (flat float32, and its C view), kept
        #: from step to step and grown only when the rows' count outgrows it.
        self._gathered: tuple[np.ndarray, Any] | None = None
        #: What collects a forward's weights layer by layer (reused from forward to forward).
        self._pending: DecodeWeights | None = None
        #: The steady step's outputs (how far it went, the policy's seconds).
        self._steady_out = (ffi.new("int *"), ffi.new("double *"))
        #: ``prompt_aware``: the attention of the last held positions' rows, ``(rows,
        #: observation_window, width)`` float32 over each policy row's held positions in
        #: kept order (row ``j`` is kept index ``count - window + j``; zeros where the
        #: cache has no row), kept from the prompt's chunks until the first decode step
        #: consumes it; None otherwise.
        self._window: np.ndarray | None = None
        #: The token ids read, per sequence (:mod:`scissorhands.hf.prefix`).
        self._read_ids = _prefix.TokenIds()
        #: ``archive``: the evicted keys and values, and the prompt's last query rows per layer.
        self._archive = None if self.archive is None else Archive(self.archive)
        #: Per row, the positions :func:`~scissorhands.hf.recall.restore` brought back at this prompt's start.
        self._restored: list[np.ndarray] | None = None
        self._queries = (None if self.archive is None else
                         WindowQueries(evicting, self.prompt_aware.observation_window))

    @classmethod
    def from_model(cls, model: Any, policy: str = "scissorhands", budget: int | None = 512,
                   options: PolicyOptions | None = None, **kwargs: Any) -> EvictingCache:
        """Build a cache for ``model`` and install the library's attention in it (see
        :mod:`scissorhands.hf.attention`: an implementation registered with transformers,
        wrapping the model's ``sdpa`` or ``eager`` one and selected with
        ``model.set_attn_implementation``).  Under ``eager`` it costs nothing beyond the
        model's own attention.  Under ``sdpa`` it costs one matmul and a softmax per layer
        beside sdpa until the first eviction (``stats.rows_seconds``), then computes the
        attention itself, eager's arithmetic per KV head's group of query heads, whose
        weights come with the output (about sdpa's cost at one query row on a CPU;
        measured in ``docs/longctx.md``).  Undo it with
        ``model.set_attn_implementation("sdpa")`` or :func:`scissorhands.hf.uninstall`.

        The parameters are the constructor's; the cache is checked before the model is
        touched.

        Raises
        ------
        InvalidInputError
            What the constructor refuses; with ``positions="cache"``, a model without a
            rotary embedding, or whose rotary type is not one of
            :data:`scissorhands.hf.rope.EXACT_ROPE_TYPES` (``dynamic``, ``longrope``:
            their frequencies change with the length, so keys cannot be turned exactly).
        """
        if not hasattr(getattr(model, "config", None), "get_text_config"):
            raise InvalidTypeError(f"from_model needs a transformers model (one with a .config), "
                                   f"got {type(model).__name__}")
        cache = cls(model.config, policy, budget, options, **kwargs)
        if cache.positions == "cache":
            cache.rotary = next((m for name, m in model.named_modules() if name.endswith("rotary_emb")), None)
            if cache.rotary is None:
                raise InvalidInputError(f"positions='cache' needs a rotary embedding; {type(model).__name__} has none")
            cache._rope_freq = rotary_frequencies(cache.rotary)
        attention.install(model)
        _prefix.install(model)
        return cache

    @property
    def pins(self) -> list[tuple[int, int]]:
        """The pinned spans ``(start, stop)`` (half-open, merged, ascending) every row
        of every configuration holds pinned."""
        return list(self._pins)

    @property
    def reads_attention(self) -> bool:
        """Whether the installed attention must hand this cache each evicting layer's
        weights: a policy reads them, or an observer is attached (under ``sdpa`` the rows
        are then computed beside it, in ``stats.rows_seconds``)."""
        return self._policies_read or bool(self._observers)

    @property
    def observed_layers(self) -> list[int]:
        """The model layer indices an observer is called with (the full-attention layers),
        in the order it is called within a forward."""
        return [layer.layer for layer in self.layers if isinstance(layer, EvictingLayer)]

    #: Whether an observer is being called (its reads of the cache leave the forward be).
    _observing = False

    #: The last model config found to fit :attr:`shape` (:func:`~scissorhands.hf.shape.check_module`).
    _fitted: Any = None

    @property
    def policies(self) -> list[Any]:
        """The policy objects (one per configuration; built at the first forward)."""
        return [] if self.bank is None or not self._holds() else self.bank.policies

    @property
    def batch(self) -> int:
        """Sequences held (0 before the first forward)."""
        return self.storage.batch if self._holds() else 0

    @_outside_graph
    def reuse_prefix(self, input_ids: Any, attention_mask: Any = None) -> int:
        """Compare a prompt's full ids with what the cache has read, per sequence, and
        return how many of its tokens the cache holds: the caller reads
        ``input_ids[:, n:]`` next (with the full ``attention_mask``).  ``generate`` calls
        it for every prompt once :meth:`from_model` installed the comparison
        (:mod:`scissorhands.hf.prefix`); a hand-written loop serving requests calls it.

        A prompt that continues what was read (every sequence's ids, padding included,
        equal over every position read, and longer) returns ``get_seq_length()`` and
        changes nothing.  Otherwise, with ``prefix="reuse"``: the sequences' longest
        common prefix ``p`` with what was read, the shortest over the batch and at most
        the prompt's length minus one (its last token is read again for its logits),
        stays; every (sequence, layer, KV head) row forgets what it holds from ``p`` on,
        its policy state and what it archived with it (the positions before keep theirs, votes and scores
        included), and ``p`` tokens count as seen.  Nothing is reused (the cache is
        ``reset()``, 0 returned) when ``p < 2``, the batch differs, the prompt comes
        without ids, or a sliding-window layer no longer holds what ``p`` needs.  With
        ``prefix="refuse"`` such a prompt raises instead, nothing changed.

        Parameters
        ----------
        input_ids : array-like of int
            ``(batch, L)`` or ``(L,)``: every token of the prompt, from position 0.
        attention_mask : array-like, optional
            ``(batch, L)``, 0 for padding (compared as padding, not as its token id).

        Returns
        -------
        int
            The positions reused: tokens the cache now counts as seen.

        Raises
        ------
        InvalidTypeError
            ``input_ids`` are not integers.
        InvalidInputError
            A shape that is not ``(batch, L)`` with ``L >= 1``, a mask of another shape;
            with ``prefix="refuse"`` a prompt that does not continue what was read,
            naming the sequence, the first differing position and ``reset()``; a cache
            with one configuration per sequence given another batch.  Nothing changes.
        """
        return _prefix.reuse_prefix(self, input_ids, attention_mask)

    #: The rotary module's attribute holding the frequencies the keys turn with (from_model).
    _rope_freq = "inv_freq"

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    @property
    def is_compileable(self) -> bool:
        return False

    def __repr__(self) -> str:
        """Never raises (also for a cache whose constructor was refused part-way)."""
        try:
            names = ", ".join(f"{c.policy}@{c.budget}" for c in self.configs)
            return (f"EvictingCache({names}, layers={self.evicting_layers}, batch={self.batch}, "
                    f"seen={self.seen}, head_mode={self.head_mode!r}, cache_mode={self.cache_mode!r})")
        except Exception:  # a partly built object: what it has
            return partial_repr(self)

    # Pinned spans (pins.py).
    pin = _pin

    # Refusals (guards.py).
    _unchanged_by_observers = guards._unchanged_by_observers
    crop = guards.crop
    activate_past_recording = guards.activate_past_recording
    early_initialization = guards.early_initialization

    # The layers (layer.py).
    _build_layers = layer._build_layers

    # Observers (observers.py).
    add_observer = observers.add_observer

    # The forward in flight: its beginning, settling and rollback (forward.py).
    update = forward.update
    _start = forward._start
    _begin = forward._begin
    _settle = forward._settle
    _rollback = forward._rollback

    # Positions and positions="cache"'s rotations (positions.py).
    _mask_sizes = positions._mask_sizes
    _rotations = positions._rotations
    get_seq_length = positions.get_seq_length
    get_mask_sizes = positions.get_mask_sizes

    # The prompt's end (prompt_end.py).
    end_prompt = prompt_end.end_prompt
    _prompt_end = prompt_end._prompt_end
    _prompt_start = prompt_end._prompt_start
    _window_only = prompt_end._window_only

    # The step that hands the policies their rows (step.py).
    _decodes = step._decodes
    _decode_buffer = step._decode_buffer
    _decode_target = step._decode_target
    _gather_target = step._gather_target
    _finish = step._finish
    _archive_chunk = step._archive_chunk
    _finished = step._finished
    _steady_step = step._steady_step
    _contained = step._contained

    # Beams, copies, reset and serialisation (copies.py).
    __getstate__ = copies.state_of
    __setstate__ = copies.set_state
    reset = copies.reset
    _select = copies._select
    reorder_cache = copies.reorder_cache
    batch_repeat_interleave = copies.batch_repeat_interleave
    batch_select_indices = copies.batch_select_indices
    __copy__ = copies.copy_of

    # What the cache holds (inspection.py).
    _holds = inspection._holds
    _row = inspection._row
    _layer_index = inspection._layer_index
    _evicting_index = inspection._evicting_index
    held_counts = inspection.held_counts
    kept_positions = inspection.kept_positions
    kept_keys_values = inspection.kept_keys_values
    kv_bytes = inspection.kv_bytes
    memory_bytes = inspection.memory_bytes
    archive_bytes = inspection.archive_bytes
    archived_positions = inspection.archived_positions


if TYPE_CHECKING:  # what the cache's modules take: mypy checks that a cache is one
    _STATE: type[CacheState] = EvictingCache
