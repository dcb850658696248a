"""What the cache computes beside the model, computed at less cost: the same numbers.

The C reduction of attention rows to policy rows against the NumPy statement it
replaces; the cheaper forms of the masks against the dense ones; float16 rows that
stay finite where sdpa does; storage that grows with what is held, not the budget.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")

from c_paths import PATHS, on_path  # noqa: E402

from scissorhands import hf  # noqa: E402
from scissorhands.errors import InvalidInputError, InvalidTypeError  # noqa: E402
from scissorhands.hf.attention import attention_rows  # noqa: E402
from scissorhands.hf.gqa import gather_group_mean, group_mean  # noqa: E402
from scissorhands.hf.storage import ChunkMask  # noqa: E402

pytestmark = pytest.mark.hf


class _Module:
    head_dim = 16


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("row_step", [1, 2])
@pytest.mark.parametrize(("layers", "batch", "heads", "rows", "extent"),
                         [(3, 2, 6, 3, 17), (2, 1, 9, 1, 30), (2, 1, 4, 2, 64), (1, 1, 3, 3, 5)])
def test_gather_of_every_layer_equals_the_gather_of_their_stack(layers, batch, heads, rows, extent, row_step, path):
    """sh_gqa_gather_layers (a decode step's layers read where they are) gives bit for bit
    sh_gqa_gather's weights over the layers stacked, strided columns (every
    ``row_step``-th row of a wider table) and columns past the extent included, with
    its AVX2 row kernel and with the scalar one (extents with and without a tail past
    the last 8 columns)."""
    from scissorhands.hf.gqa import gather_layers

    gen = torch.Generator().manual_seed(layers * 7 + extent)
    weights = [torch.softmax(torch.randn(batch, heads, 1, extent, generator=gen) * 3, -1) for _ in range(layers)]
    total = layers * batch * rows
    table = torch.randint(-1, extent + 2, (total * row_step, extent + 5), generator=gen).numpy().astype(np.int32)
    columns = table[::row_step, :extent]  # strided rows of a wider table
    stacked = torch.stack(weights).reshape(layers * batch, heads, 1, extent)
    expect = gather_group_mean(stacked, rows, columns)
    got = np.full((total, 1, extent), np.nan, dtype=np.float32)
    with on_path(path):
        finite = gather_layers(weights, rows, table, row_step, extent, got)
    assert np.array_equal(got, expect)
    assert finite


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("extent", "at"), [(6, 2), (21, 2), (21, 17)])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_the_gather_of_every_layer_says_when_a_weight_it_wrote_is_not_finite(bad, extent, at, path):
    """sh_gqa_gather_layers' finiteness flag: false exactly when a gathered weight is
    inf or NaN; a non-finite weight in a column no row reads leaves it true (in the
    AVX2 kernel's blocks of 8 columns and in its tail, and in the scalar kernel)."""
    from scissorhands.hf.gqa import gather_layers

    weights = [torch.full((1, 4, 1, extent), 0.25) for _ in range(2)]
    columns = np.tile(np.arange(extent - 1, dtype=np.int32), (4, 1))  # the last column is never read
    out = np.empty((4, 1, extent - 1), dtype=np.float32)
    with on_path(path):
        weights[1][0, 3, 0, extent - 1] = bad
        assert gather_layers(weights, 2, columns, 1, extent - 1, out)
        weights[1][0, 3, 0, at] = bad
        finite = gather_layers(weights, 2, columns, 1, extent - 1, out)
    assert not finite
    assert np.isfinite(out[:3]).all() and not np.isfinite(out[3, 0, at])


def test_the_steady_slot_step_equals_the_general_one():
    """SlotStorage.apply_steady (one C pass) leaves the slot table, free slots and
    validity of apply_step's general path, for every row's victim at any kept index."""
    from scissorhands.hf.storage import SlotStorage

    rng = np.random.default_rng(3)
    states = []
    for steady in (True, False):
        storage = SlotStorage(2, 8)
        storage.start(1, 3)
        storage.capacity = 9
        storage.slots = np.tile(rng.permutation(9)[None], (6, 1)).astype(np.int32) if steady else states[0][3].copy()
        storage.counts = np.full(6, 8, dtype=np.int64)
        storage.free = storage.slots[:, 8].astype(np.int64)
        storage.valid = np.ones((6, 9), dtype=bool)
        storage.rope = np.zeros((6, 9), dtype=np.int64)
        storage.aligned = False
        storage.extent = 9
        start = storage.slots.copy()
        victims = np.array([0, 8, 3, 5, 1, 7]) if steady else states[0][4]
        if steady:
            assert storage.apply_steady(victims)
        else:
            storage.compact_every_step = False
            storage._apply_ragged(np.ones(6, dtype=np.int64), victims, storage.free.copy())
        states.append((storage.slots[:, :8].copy(), storage.free.copy(), storage.valid.copy(), start, victims))
    (a_slots, a_free, a_valid, _, _), (b_slots, b_free, b_valid, _, _) = states
    assert np.array_equal(a_slots, b_slots) and np.array_equal(a_free, b_free) and np.array_equal(a_valid, b_valid)


@pytest.mark.parametrize("seed", range(6))
def test_one_victim_a_row_of_rows_holding_different_counts_leaves_what_a_list_per_row_leaves(seed):
    """SlotStorage.apply_step when every row evicts one position but rows hold different
    counts (eval's batch of several budgets): its one C pass (sh_slots_step_rows) leaves
    each row's kept slots, the counts, the free slots and the validity that a list per row
    leaves (the token appended, the victim's kept index popped, its slot freed), for
    victims at any kept index (the new token's included)."""
    from scissorhands.hf.storage import SlotStorage

    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 9, size=6)
    storage = SlotStorage(2, 8)
    storage.start(1, 3)
    storage.capacity = storage.extent = 9
    order = np.random.default_rng(seed + 100)
    storage.slots = np.stack([order.permutation(9) for _ in range(6)]).astype(np.int32)
    storage.counts = counts.astype(np.int64)
    storage.free = storage.slots[np.arange(6), counts].astype(np.int64)
    storage.valid = np.zeros((6, 9), dtype=bool)
    for r, n in enumerate(counts):
        storage.valid[r, storage.slots[r, : n + 1]] = True  # held, and the token's slot (the plan's)
    storage.rope = np.zeros((6, 9), dtype=np.int64)
    storage.aligned = False
    victims = np.array([np.random.default_rng(seed + 200 + r).integers(0, n + 1) for r, n in enumerate(counts)])
    lists = [[int(x) for x in storage.slots[r, :n]] + [int(storage.free[r])] for r, n in enumerate(counts)]
    valid = storage.valid.copy()
    freed = np.array([kept.pop(int(v)) for kept, v in zip(lists, victims, strict=True)])
    valid[np.arange(6), freed] = False

    storage.apply_step(np.ones(6, dtype=np.int64), victims)
    assert np.array_equal(storage.counts, counts)
    assert np.array_equal(storage.free, freed)
    assert np.array_equal(storage.valid, valid)
    assert [storage.slots[r, :n].tolist() for r, n in enumerate(counts)] == lists


def _ragged_by_sorting(table: np.ndarray, valid: np.ndarray, n: np.ndarray, victims: np.ndarray,
                       slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ragged slot step as array operations (the form before sh_slots_evict_rows): the
    survivors of each row to its front by a stable sort; returns the freed slots."""
    rows = np.arange(len(n))
    width = int(n.max()) + 1
    layout = table[:, :width]
    keep = np.arange(width)[None, :] < (n + 1)[:, None]
    owner = np.repeat(rows, victims)
    keep[owner, slots] = False
    freed = layout[owner, slots].astype(np.int64)
    table[:, :width] = np.take_along_axis(layout, np.argsort(~keep, axis=1, kind="stable"), axis=1)
    valid[owner, freed] = False
    return table, freed


@pytest.mark.parametrize("seed", range(8))
def test_any_number_of_victims_a_row_leaves_what_the_stable_sort_left(seed):
    """SlotStorage.apply_step for rows sharing a budget (any number of victims a row, some
    none): its C pass (sh_slots_evict_rows) leaves each row's kept slots, the counts, the
    free slots and the validity that sorting each row's survivors to its front left."""
    from scissorhands.hf.storage import SlotStorage

    rng = np.random.default_rng(seed)
    rows, capacity = 6, 12
    counts = rng.integers(1, 10, size=rows)
    victims = np.array([rng.integers(0, n + 2) for n in counts])  # up to every held slot and the token
    victims[rng.integers(0, rows)] = max(victims.max(), 2)  # one row evicts several
    victims = np.minimum(victims, counts + 1)
    index = np.concatenate([np.sort(rng.choice(n + 1, size=k, replace=False)) for n, k in zip(counts, victims)])
    storage = SlotStorage(2, 8)
    storage.start(1, 3)
    storage.capacity = storage.extent = capacity
    storage.slots = np.stack([rng.permutation(capacity) for _ in range(rows)]).astype(np.int32)
    storage.counts = counts.astype(np.int64)
    storage.free = storage.slots[np.arange(rows), counts].astype(np.int64)
    storage.valid = np.zeros((rows, capacity), dtype=bool)
    for r, n in enumerate(counts):
        storage.valid[r, storage.slots[r, : n + 1]] = True
    storage.rope = np.zeros((rows, capacity), dtype=np.int64)
    storage.aligned = False
    table, valid = storage.slots.copy(), storage.valid.copy()
    table[np.arange(rows), counts] = storage.free
    table, freed = _ragged_by_sorting(table, valid, counts, victims, index)
    storage.apply_step(victims.astype(np.int64), index)
    assert np.array_equal(storage.counts, counts + 1 - victims)
    for r, n in enumerate(storage.counts):
        assert np.array_equal(storage.slots[r, :n], table[r, :n])
    assert np.array_equal(storage.valid, valid)
    first = np.concatenate(([0], np.cumsum(victims)[:-1]))
    for r in range(rows):  # the first victim's slot, else the lowest hole
        want = freed[first[r]] if victims[r] else np.argmin(valid[r]) if not valid[r].all() else capacity
        assert storage.free[r] == want


def test_the_ragged_slot_step_refuses_bad_victims_and_changes_nothing():
    """sh_slots_evict_rows refuses an index outside its row, one given twice, more victims
    than held or than given in all, and a count past the stride, with nothing written."""
    from scissorhands._native import ffi, lib

    slots = np.array([[3, 1, 2, 0], [0, 1, 2, 3]], dtype=np.int32)
    valid = np.ones((2, 4), dtype=bool)
    freed = np.zeros(4, dtype=np.int64)
    i64 = "int64_t *"

    def evict(held, victims, index, total=None):
        h, v, i = (np.array(x, dtype=np.int64) for x in (held, victims, index))
        return lib.sh_slots_evict_rows(ffi.cast("int32_t *", slots.ctypes.data), 2, 4, ffi.cast(i64, h.ctypes.data),
                                       ffi.cast(i64, v.ctypes.data), ffi.cast(i64, i.ctypes.data),
                                       len(i) if total is None else total, ffi.cast("uint8_t *", valid.ctypes.data),
                                       4, ffi.cast(i64, freed.ctypes.data))

    assert evict([3, 4], [1, 1], [3, 0]) == lib.SH_ERR_ARG  # index 3 past row 0's 3
    assert evict([3, 4], [2, 0], [1, 1]) == lib.SH_ERR_ARG  # index 1 twice
    assert evict([1, 4], [2, 0], [0, 0]) == lib.SH_ERR_ARG  # 2 victims of 1 held
    assert evict([3, 4], [1, 1], [0, 0], total=1) == lib.SH_ERR_ARG  # 2 victims, 1 given
    assert evict([5, 4], [1, 0], [0]) == lib.SH_ERR_ARG  # a count past the stride of 4
    assert np.array_equal(slots, [[3, 1, 2, 0], [0, 1, 2, 3]]) and valid.all() and not freed.any()
    assert evict([3, 4], [2, 1], [0, 2, 3]) == lib.SH_OK
    assert slots[0, 0] == 1 and np.array_equal(slots[1, :3], [0, 1, 2]) and list(freed[:3]) == [3, 2, 3]
    assert np.array_equal(valid, [[True, True, False, False], [True, True, True, False]])


def test_a_mixed_banks_groups_take_turns_to_be_stepped_first_and_give_what_each_policy_gives_alone():
    """PolicyRows.step over several configurations starts each decode step at the next group
    (the first call after the model's forward runs cold: its cost is shared alike), and
    every row's victims are the ones its configuration's policy gives stepped on its own."""
    from scissorhands.hf.rows import PolicyConfig, PolicyRows
    from scissorhands.options import PolicyOptions

    configs = [PolicyConfig("scissorhands", 6, PolicyOptions(recent_window=2)),
               PolicyConfig("h2o", 5, PolicyOptions(recent_window=2)),
               PolicyConfig("scissorhands", 4, PolicyOptions(recent_window=1, sinks=1))]
    layers, heads, sizes = 2, 3, [1, 2, 1]
    bank = PolicyRows(configs, sizes, layers, heads)
    alone = PolicyRows(configs, sizes, layers, heads)
    order: list[int] = []
    for g, policy in enumerate(bank.policies):
        step_rows = policy.step_rows

        def recorded(*args, _g=g, _step=step_rows, **kwargs):
            order.append(_g)
            return _step(*args, **kwargs)

        policy.step_rows = recorded
    rng = np.random.default_rng(7)
    for pos in range(1, 13):
        width = max(int(np.asarray(p.counts).max()) for p in bank.policies)  # the held positions
        weights = rng.random((bank.rows, width), dtype=np.float32)
        counts, slots = bank.step(pos, weights)
        for _, policy, rows, config in alone._each():  # each group's policy on its own rows
            n = int(np.asarray(policy.counts).max())
            victims = policy.step_rows(pos, np.ascontiguousarray(weights[rows][:, :n]), config.budget)
            assert np.array_equal(counts[rows], victims.counts)
            starts = np.concatenate(([0], np.cumsum(counts)))[rows]
            mine = np.concatenate([slots[a:a + k] for a, k in zip(starts, counts[rows], strict=True)])
            assert np.array_equal(mine, victims.slots)
    assert [order[3 * k] for k in range(12)] == [k % 3 for k in range(12)]  # the first group of each step
    assert sorted(order[:3]) == [0, 1, 2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_kept_decode_masks_changed_at_their_slots_equal_masks_built_anew(dtype):
    """SlotStorage._decode_masks updated where slots were filled or freed (through NumPy's
    view of the store for the dtypes NumPy has, torch's indexing for bfloat16) equals the
    masks built from the validity table afresh, bit for bit."""
    from scissorhands.hf.storage import SlotStorage

    rng = np.random.default_rng(5)
    storage = SlotStorage(2, 8)
    storage.start(2, 3)
    storage.capacity = storage.extent = 9
    storage.valid = rng.random((12, 9)) < 0.7
    storage.aligned = False
    storage._mask_stale = True
    storage._decode_masks(3, dtype)  # built, and kept
    for valid in (True, False):
        rows, slots = rng.integers(0, 12, size=5), rng.integers(0, 9, size=5)
        storage.valid[rows, slots] = valid
        storage._note_valid(rows, slots, valid)
    kept = [m.clone() for m in storage._decode_masks(3, dtype)]
    storage._mask_stale = True
    anew = storage._decode_masks(3, dtype)
    assert all(torch.equal(a, b) for a, b in zip(kept, anew, strict=True))
    assert any(bool((m != 0).any()) for m in anew) and any(bool((m == 0).any()) for m in anew)


@pytest.mark.parametrize("aligned", [True, False])
def test_a_decode_step_that_evicts_nothing_appends_each_rows_token(aligned):
    """SlotStorage.apply_step with no victim: each row's token (at the extent's end
    while aligned, else at its free slot) goes last in its kept order, the rest of the
    table is untouched, the token's slot is valid, and the next free slot is the end
    (aligned) or each row's lowest invalid one; rows of different counts included."""
    from scissorhands.hf.storage import SlotStorage

    storage = SlotStorage(1, 8)
    storage.start(1, 3)
    storage.capacity, storage.extent, storage.aligned = 8, 6, aligned
    rng = np.random.default_rng(5)
    storage.slots = np.stack([rng.permutation(8) for _ in range(3)]).astype(np.int32)
    storage.counts = np.array([5, 4, 5], dtype=np.int64)
    storage.valid = np.zeros((3, 8), dtype=bool)
    for r in range(3):
        storage.valid[r, storage.slots[r, : storage.counts[r]]] = True
    storage.free = np.array([storage.slots[r, storage.counts[r]] for r in range(3)], dtype=np.int64)
    storage.rope = np.zeros((3, 8), dtype=np.int64)
    before, counts = storage.slots.copy(), storage.counts.copy()
    new = np.full(3, 5) if aligned else storage.free.copy()
    storage.apply_step(np.zeros(3, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert np.array_equal(storage.counts, counts + 1) and storage.most() == 6
    for r in range(3):
        c = counts[r]
        assert np.array_equal(storage.slots[r, :c], before[r, :c]) and storage.slots[r, c] == new[r]
        assert storage.valid[r, new[r]]
    if aligned:
        assert np.array_equal(storage.free, np.full(3, 6))
    else:
        assert np.array_equal(storage.free, [int(np.argmin(v)) for v in storage.valid])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("batch", "heads", "rows", "q", "extent"),
                         [(2, 6, 3, 5, 17), (1, 9, 1, 1, 30), (3, 4, 4, 1, 8)])
def test_gather_group_mean_equals_group_mean_then_gather(dtype, batch, heads, rows, q, extent):
    """sh_gqa_gather gives bit for bit group_mean's weights at each row's columns (strided
    views of a wider slot table too), 0 for a column outside the extent."""
    gen = torch.Generator().manual_seed(extent)
    weights = torch.softmax(torch.randn(batch, heads, q, extent, generator=gen), -1).to(dtype)
    reference = group_mean(weights, rows).reshape(batch * rows, q, extent)
    rng = np.random.default_rng(q)
    table = np.stack([rng.permutation(extent + 3)[: extent - 2] for _ in range(2 * batch * rows)])
    columns = table[::2]  # every other row of the table: a strided view
    got = gather_group_mean(weights, rows, columns)
    inside = (columns < extent)[:, None, :]
    expected = np.take_along_axis(reference, np.minimum(columns, extent - 1)[:, None, :].repeat(q, 1), 2)
    assert np.array_equal(got, np.where(inside, expected, 0.0))
    held = rng.integers(0, extent, size=batch * rows)
    later = np.arange(columns.shape[1])[None, None, :] > (held[:, None, None] + np.arange(q)[None, :, None])
    chunk = gather_group_mean(weights, rows, columns, held=held)
    assert np.array_equal(chunk, np.where(inside & ~later, expected, 0.0))


def _dense(valid: torch.Tensor, start: int, q: int, group: int) -> torch.Tensor:
    """The additive mask SlotStorage.mask builds for a chunk: (batch, heads * group, q, start + q)."""
    batch, kv_heads, _ = valid.shape
    held = valid[:, :, None, :].expand(-1, -1, q, -1)
    chunk = torch.ones(q, q, dtype=torch.bool).tril().expand(batch, kv_heads, q, q)
    allowed = torch.cat((held, chunk), -1).repeat_interleave(group, dim=1)
    return torch.zeros(allowed.shape).masked_fill_(~allowed, torch.finfo(torch.float32).min)


@pytest.mark.parametrize("all_held", [True, False])
def test_chunk_mask_gives_the_dense_masks_weights(all_held):
    """A ChunkMask (the causal block and the held slots' column bias) gives bit for bit the
    weights of the dense additive mask of the same chunk."""
    gen = torch.Generator().manual_seed(3)
    batch, kv_heads, group, q, start, dim = 2, 2, 3, 7, 11, 16
    query = torch.randn(batch, kv_heads * group, q, dim, generator=gen) * 3
    key = torch.randn(batch, kv_heads, start + q, dim, generator=gen) * 3
    valid = torch.ones(batch, kv_heads, start, dtype=torch.bool)
    if not all_held:
        valid[0, 1, [2, 5]] = False
        valid[1, 0, 0] = False
    held = None if all_held else torch.zeros(valid.shape).masked_fill_(
        ~valid, torch.finfo(torch.float32).min)[:, :, None, None, :]
    structured = attention_rows(_Module(), query, key, ChunkMask(start, q, held), {})
    dense = attention_rows(_Module(), query, key, _dense(valid, start, q, group), {})
    assert torch.equal(structured, dense)
    assert not all_held or bool((structured[..., start:].triu(1) == 0).all())


@pytest.mark.parametrize("form", ["none", "bool"])
def test_causal_rows_equal_the_boolean_masks(form):
    """Rows of a causal chunk (sdpa's is_causal, or transformers' boolean mask of it) equal
    bit for bit those of the boolean mask applied with masked_fill."""
    gen = torch.Generator().manual_seed(5)
    q, kv, dim = 6, 15, 16
    query = torch.randn(1, 4, q, dim, generator=gen) * 3
    key = torch.randn(1, 2, kv, dim, generator=gen) * 3
    causal = torch.ones(q, kv, dtype=torch.bool).tril(kv - q)[None, None]
    got = attention_rows(_Module(), query, key, None if form == "none" else causal, {})
    scores = torch.matmul(query.reshape(1, 2, 2 * q, dim), key.transpose(2, 3)).reshape(1, 4, q, kv) * 0.25
    expected = torch.softmax(scores.masked_fill(~causal, torch.finfo(torch.float32).min), -1)
    assert torch.equal(got, expected)


VOCAB = 97


def _tiny(dtype: torch.dtype = torch.float32, head_dim: int = 16, sharp: float = 1.0) -> object:
    """A small random Llama (GQA: 4 query heads, 2 KV heads) under sdpa; ``sharp`` scales
    its query and key projections, so that its attention is peaked enough to vote (at 1
    hardly a weight is above the fair share)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=4 * head_dim, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         pad_token_id=0, bos_token_id=1, eos_token_id=VOCAB - 1)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype).eval()
    if sharp != 1.0:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(sharp)
                layer.self_attn.k_proj.weight.mul_(sharp)
    return model


def _layout(cache) -> list[np.ndarray]:
    storage = cache.storage
    return [storage.slots.copy(), storage.valid.copy(), storage.free.copy(), storage.counts.copy()]


@pytest.mark.parametrize(("policy", "positions", "pin", "prompt"), [("scissorhands", "original", False, 16),
                                                                   ("scissorhands", "original", False, 6),
                                                                   ("scissorhands", "cache", False, 6),
                                                                   ("scissorhands", "original", True, 16),
                                                                   ("h2o", "original", False, 16),
                                                                   ("tova", "cache", False, 16)])
def test_the_steady_step_in_one_c_call_leaves_what_the_general_path_leaves(policy, positions, pin, prompt,
                                                                           monkeypatch):
    """A steady decode step (every row at the same count) runs the gather, the policy's
    step and the slot table's in one C call (sh_cache_step_steady; before the first
    eviction, the gather and the policy's step); the cache it leaves is the general
    path's, step by step: the same logits, held positions, slot table, validity and free
    slots, in a batch of two evicting every step (after a prompt within the budget, from
    the step that fills it; with a pinned span too); and every decode step takes it."""
    model = _tiny(sharp=4.0)
    ids = torch.randint(2, VOCAB - 1, (2, 48), generator=torch.Generator().manual_seed(4))
    taken = []
    original = hf.rows.PolicyRows.step_with

    def counted(self, pos, call):
        got = original(self, pos, call)
        taken.append(None if got is None else got[0])
        return got

    monkeypatch.setattr(hf.rows.PolicyRows, "step_with", counted)
    caches = [hf.EvictingCache.from_model(model, policy, budget=12, recent_window=4, positions=positions)
              for _ in range(2)]
    caches[1]._steady_step = lambda forward: None  # the general path only
    if pin:
        for cache in caches:
            cache.pin(2, 5)
    with torch.no_grad():
        for cache in caches:
            model(input_ids=ids[:, :prompt], cache=cache, use_cache=True)
        for t in range(prompt, ids.shape[1]):
            fused, general = (model(input_ids=ids[:, t:t + 1], cache=c, use_cache=True).logits for c in caches)
            assert torch.equal(fused, general), t
            for got, expected in zip(_layout(caches[0]), _layout(caches[1])):
                assert np.array_equal(got, expected), t
            for layer in caches[0].observed_layers:
                for b in range(2):
                    for h in range(caches[0].num_kv_heads):
                        assert np.array_equal(caches[0].kept_positions(layer, b, h),
                                              caches[1].kept_positions(layer, b, h)), t
            assert caches[0].bank.policies[0].state_dict() == caches[1].bank.policies[0].state_dict(), t
    steps = ids.shape[1] - prompt
    assert len(taken) == steps and None not in taken
    assert taken.count(2) >= steps - max(0, 12 - prompt) - 1  # the slot table in C too, once evicting


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("where", ["held, in a block of 8", "held, in the tail", "the new token's"])
def test_a_negative_weight_in_a_steady_step_is_judged_as_the_general_path_judges_it(where, path, monkeypatch):
    """The steady step's gather checks the weights it writes (finite and >= 0) so that the
    policy's step need not check them again: a negative weight at a held column (in the
    AVX2 kernel's blocks of 8 and in its tail, and on the scalar kernel) is refused as
    the general path refuses it, with its error and the cache as it was; one at the new
    token's own column, which no policy reads, changes nothing on either path."""
    from scissorhands.hf import attention

    model = _tiny(sharp=4.0)
    ids = torch.randint(2, VOCAB - 1, (1, 24), generator=torch.Generator().manual_seed(6))
    caches = [hf.EvictingCache.from_model(model, "scissorhands", budget=12, recent_window=4) for _ in range(2)]
    caches[1]._steady_step = lambda forward: None  # the general path only
    original = attention.grouped_attention
    spoil: dict[str, object] = {}

    def spoiled(module, query, key, value, mask, kwargs):
        output, weights = original(module, query, key, value, mask, kwargs)
        cache = spoil.get("cache")
        if cache is not None and module.layer_idx == 1:
            storage = cache.storage
            row = 2  # layer 1's first row (sequence 0, KV head 0): rows are layer-major
            held = storage.slots[row, : storage.counts[row]]
            blocks = weights.shape[-1] // 8 * 8  # the AVX2 kernel's columns in blocks of 8; then its tail
            assert weights.shape[-1] % 8 and (held < blocks).any() and (held >= blocks).any()
            column = {"held, in a block of 8": held[held < blocks][0], "held, in the tail": held[held >= blocks][0],
                      "the new token's": storage.free[row]}[where]
            weights = weights.clone()
            weights[0, 1, 0, int(column)] = -0.75  # query head 1 of KV head 0: the group's mean < 0
        return output, weights

    monkeypatch.setattr(attention, "grouped_attention", spoiled)
    results = []
    with on_path(path), torch.no_grad():
        for cache in caches:
            model(input_ids=ids[:, :16], cache=cache, use_cache=True)
            for t in range(16, 20):
                model(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True)
            before = _state(cache)
            spoil["cache"] = cache
            try:
                logits = model(input_ids=ids[:, 20:21], cache=cache, use_cache=True).logits
            except InvalidInputError as error:
                results.append((str(error), before, _state(cache)))
            else:
                results.append((logits, _state(cache)))
            spoil.pop("cache")
    fused, general = results
    if where == "the new token's":
        assert len(fused) == 2 and torch.equal(fused[0], general[0])
        assert all(np.array_equal(a, b) for a, b in zip(fused[1][0], general[1][0]))
        assert fused[1][1] == general[1][1]
    else:
        assert len(fused) == 3 and fused[0] == general[0] and "weight" in fused[0]
        for message, before, after in (fused, general):
            # Layer 0's rows stepped before layer 1's spoiled row was reached: undone exactly.
            assert all(np.array_equal(a, b) for a, b in zip(before[0], after[0])), message
            assert before[1] == after[1], message


def _state(cache) -> tuple[list[np.ndarray], dict]:
    """The cache's slot table and layer 1's first row, and its policy's whole state (votes
    too) and memory."""
    policy = cache.bank.policies[0]
    return _layout(cache) + [cache.kept_positions(1, 0, 0)], {**policy.state_dict(), "bytes": policy.memory_bytes()}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("part", [(0, 8), (8, 12)], ids=["a block of 8", "the tail"])
def test_a_refused_steady_step_after_a_saturated_vote_leaves_every_vote_as_it_was(part, path, monkeypatch):
    """The steady step steps each row as its weights are gathered, and undoes the rows
    already stepped when a later row's weights are refused.  A vote at UINT32_MAX (it
    cannot grow) could not be told from one that grew to it, so a row holding a vote that
    can saturate (read beside the weights: in the AVX2 kernel's blocks of 8 and after
    them, and on the scalar kernel) is not stepped that way: a refused step leaves every
    vote as it was, as the general path does, and an accepted one gives the general
    path's votes."""
    from scissorhands.hf import attention

    model = _tiny(sharp=4.0)
    ids = torch.randint(2, VOCAB - 1, (1, 24), generator=torch.Generator().manual_seed(6))
    original = attention.grouped_attention
    spoil = {"on": False}

    def spoiled(module, query, key, value, mask, kwargs):
        output, weights = original(module, query, key, value, mask, kwargs)
        if spoil["on"] and module.layer_idx == 1:
            weights = weights.clone()
            weights[0, 1, 0, 0] = -0.75  # layer 1: reached after layer 0's rows stepped
        return output, weights

    monkeypatch.setattr(attention, "grouped_attention", spoiled)
    with on_path(path), torch.no_grad():
        for refused in (True, False):
            results = []
            for general in (False, True):
                cache = hf.EvictingCache.from_model(model, "scissorhands", budget=12, recent_window=4)
                if general:
                    cache._steady_step = lambda forward: None
                model(input_ids=ids[:, :16], cache=cache, use_cache=True)
                for t in range(16, 20):
                    model(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True)
                policy = cache.bank.policies[0]
                state = policy.state_dict()
                # Layer 0's second row can saturate: its first row steps, then is undone.
                assert len(state["votes"][1]) == 12  # a block of 8 votes, then 4
                state["votes"][1][slice(*part)] = [2**32 - 1] * (part[1] - part[0])
                cache.bank.policies[0] = type(policy).from_state_dict(state)
                before = _state(cache)
                spoil["on"] = refused
                try:
                    got = model(input_ids=ids[:, 20:21], cache=cache, use_cache=True).logits
                except InvalidInputError as error:
                    got = str(error)
                spoil["on"] = False
                results.append((got, before, _state(cache)))
            (fused, before, after), (general, _, general_after) = results
            if refused:
                assert isinstance(fused, str) and fused == general and "weight" in fused
                assert after[1] == before[1]
                assert after[1]["votes"][1][slice(*part)] == [2**32 - 1] * (part[1] - part[0])
                assert any(before[1]["votes"][0])  # votes a wrong undo would change
            else:
                assert torch.equal(fused, general)
                assert after[1] == general_after[1]
            assert all(np.array_equal(a, b) for a, b in zip(after[0], general_after[0]))


def test_a_replaced_policy_step_is_called_by_the_steady_step(monkeypatch):
    """PolicyRows.step is where a decode step's weights reach the policies: replaced (an
    experiment, a test recording them), the steady state calls it and not the one C call."""
    model = _tiny()
    ids = torch.randint(2, VOCAB - 1, (1, 30), generator=torch.Generator().manual_seed(5))
    seen = []
    original = hf.rows.PolicyRows.step

    def step(self, pos, weights):
        seen.append(pos)
        return original(self, pos, weights)

    monkeypatch.setattr(hf.rows.PolicyRows, "step", step)
    cache = hf.EvictingCache.from_model(model, "scissorhands", budget=8, recent_window=2)
    with torch.no_grad():
        model(input_ids=ids[:, :10], cache=cache, use_cache=True)
        for t in range(10, 30):
            model(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True)
    assert seen == list(range(10, 30))


def test_what_the_cache_is_handed_by_hand_is_refused_naming_it():
    """Keys and values that are not tensors or not the forward's shape, width or dtype, a
    layer index outside the cache (or not an integer), a non-integer layer, sequence or
    head for the inspection methods, a negative or non-integer count for kv_bytes and
    beam indices that are not a 1-D sequence are refused with the library's errors, naming what was
    passed; the cache then goes on as if they had not been handed in."""
    model = _tiny()
    ids = torch.randint(2, VOCAB - 1, (2, 20), generator=torch.Generator().manual_seed(1))
    cache = hf.EvictingCache.from_model(model, "scissorhands", budget=12, recent_window=4)
    twin = hf.EvictingCache.from_model(model, "scissorhands", budget=12, recent_window=4)
    with torch.no_grad():
        for c in (cache, twin):
            model(input_ids=ids, cache=c, use_cache=True)
    z = torch.zeros
    bad = [((z(2, 3, 1, 16), z(2, 3, 1, 16), 0), InvalidInputError, "(2, 3, 1, 16)"),
           ((z(2, 2, 1, 16), z(2, 2, 2, 16), 0), InvalidInputError, "(2, 2, 2, 16)"),
           ((z(2, 2, 1, 8), z(2, 2, 1, 8), 0), InvalidInputError, "width 8"),
           ((z(2, 2, 1, 16, dtype=torch.float64), z(2, 2, 1, 16, dtype=torch.float64), 0), InvalidInputError,
            "torch.float64"),
           ((z(2, 2, 1, 16), z(2, 2, 1, 16), 99), InvalidInputError, "got 99"),
           ((z(2, 2, 1, 16), z(2, 2, 1, 16), "0"), InvalidTypeError, "not str"),
           ((z(2, 2, 1, 16).numpy(), z(2, 2, 1, 16).numpy(), 0), InvalidTypeError, "got ndarray"),
           ((None, None, 0), InvalidTypeError, "got NoneType"),
           ((z(2, 2, 16), z(2, 2, 16), 0), InvalidInputError, "got shape (2, 2, 16)"),
           ((z(2, 2, 1, 16), z(1, 2, 2, 1, 16), 0), InvalidInputError, "got shape (1, 2, 2, 1, 16)")]
    for args, kind, named in bad:
        with pytest.raises(kind, match=re.escape(named)):
            cache.update(*args)
    for call, kind, named in ((lambda: cache.get_seq_length(2), InvalidInputError, "got 2"),
                              (lambda: cache.kept_positions("0"), InvalidTypeError, "not str"),
                              (lambda: cache.kept_positions(1.0), InvalidTypeError, "not float"),
                              (lambda: cache.kept_positions(0, 0.0), InvalidTypeError, "sequence must be"),
                              (lambda: cache.get_mask_sizes(1, 99), InvalidInputError, "got 99"),
                              (lambda: cache.kv_bytes(-1), InvalidInputError, "positions"),
                              (lambda: cache.kv_bytes("x"), InvalidTypeError, "positions"),
                              (lambda: cache.reorder_cache("x"), InvalidTypeError, "got str"),
                              (lambda: cache.reorder_cache([[0], [1, 0]]), InvalidTypeError, "got list"),
                              (lambda: cache.batch_select_indices("x"), InvalidTypeError, "got str")):
        with pytest.raises(kind, match=re.escape(named)):
            call()
    with torch.no_grad():
        for t in range(3):
            step = ids[:, t:t + 1]
            assert torch.equal(model(input_ids=step, cache=cache, use_cache=True).logits,
                               model(input_ids=step, cache=twin, use_cache=True).logits)
    assert np.array_equal(cache.held_counts(), twin.held_counts())


def test_keys_of_no_sequence_or_other_kv_heads_are_refused_by_an_empty_cache_naming_them():
    """An empty cache handed keys of a batch of 0, or of another number of KV heads than
    its configuration's, says so with the shape (not the advice to reset a cache that
    holds nothing, nor an internal name), and stays empty: the model's forward then
    equals a fresh cache's."""
    model = _tiny()
    ids = torch.randint(2, VOCAB - 1, (1, 6), generator=torch.Generator().manual_seed(3))
    cache, twin = (hf.EvictingCache.from_model(model, "scissorhands", budget=8, recent_window=2) for _ in range(2))
    z = torch.zeros
    for keys, named in ((z(0, 2, 5, 16), "keys (0, 2, 5, 16) to an empty cache built for 2 KV heads: a forward "
                                          "needs at least one sequence"),
                        (z(1, 6, 5, 16), "keys (1, 6, 5, 16) to an empty cache built for 2 KV heads: 6 KV heads "
                                          "is not the configuration's")):
        with pytest.raises(InvalidInputError, match=re.escape(named)):
            cache.update(keys, keys, 0)
        assert cache.get_seq_length() == 0 and cache.batch == 0
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids, cache=cache, use_cache=True).logits,
                           model(input_ids=ids, cache=twin, use_cache=True).logits)


def test_an_observer_may_ask_the_cache_its_length_mid_forward():
    """get_seq_length() and get_mask_sizes() asked by an observer (mid-forward) give the
    cache as it was before the forward and leave the forward be: generate's tokens are
    those without the observer."""
    model = _tiny()
    ids = torch.randint(2, VOCAB - 1, (1, 10), generator=torch.Generator().manual_seed(7))
    caches = [hf.EvictingCache.from_model(model, "scissorhands", budget=8, recent_window=2) for _ in range(2)]
    asked = []
    caches[0].add_observer(lambda layer, w: asked.append((caches[0].get_seq_length(), caches[0].seen,
                                                          caches[0].get_mask_sizes(w.shape[2], layer))))
    with torch.no_grad():
        out = [model.generate(input_ids=ids, cache=c, max_new_tokens=12, do_sample=False) for c in caches]
    assert torch.equal(out[0], out[1])
    # The prompt's forward and 11 decode steps (the 12th token is not fed back), 2 layers each.
    assert len(asked) == 2 * 12 and all(length == seen for length, seen, _ in asked)
    assert [a[0] for a in asked[::2]] == [0] + list(range(10, 21))


@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("at", [0, 3])
@pytest.mark.parametrize("call", ["reset()", "update()", "pin()", "end_prompt()", "reorder_cache()",
                                  "batch_select_indices()"])
def test_an_observer_that_changes_the_cache_is_refused_and_the_forward_undone(call, at, layer):
    """An observer calling what changes the cache, mid-forward (the prompt's or a decode
    step's, at the first or the last layer), is refused with the library's error naming
    the call; the forward is undone, and the cache then goes on as a twin that never ran
    the observer."""
    model = _tiny()
    ids = torch.randint(2, VOCAB - 1, (1, 16), generator=torch.Generator().manual_seed(8))
    cache, twin = (hf.EvictingCache.from_model(model, "scissorhands", budget=8, recent_window=2) for _ in range(2))
    z = torch.zeros(1, 2, 1, 16)
    calls = {"reset()": cache.reset, "update()": lambda: cache.update(z, z, 0), "pin()": lambda: cache.pin(0, 1),
             "end_prompt()": cache.end_prompt, "reorder_cache()": lambda: cache.reorder_cache([0]),
             "batch_select_indices()": lambda: cache.batch_select_indices([0])}
    forwards = [ids[:, :10]] + [ids[:, t:t + 1] for t in range(10, 16)]
    handle = None
    with torch.no_grad():
        for i, piece in enumerate(forwards):
            if i == at:
                handle = cache.add_observer(lambda e, w: calls[call]() if e == layer else None)
                with pytest.raises(InvalidInputError, match=re.escape(f"{call} was called by an attention observer")):
                    model(input_ids=piece, cache=cache, use_cache=True)
                handle.remove()
                assert cache.get_seq_length() == twin.get_seq_length() and cache.pins == twin.pins
            assert torch.equal(model(input_ids=piece, cache=cache, use_cache=True).logits,
                               model(input_ids=piece, cache=twin, use_cache=True).logits)
    assert np.array_equal(cache.held_counts(), twin.held_counts())


def test_a_forward_of_no_token_is_refused_before_anything_changes():
    """Keys of no token (a forward of length 0) are refused by shape; the cache is as it was."""
    model = _tiny()
    ids = torch.randint(2, VOCAB - 1, (1, 8), generator=torch.Generator().manual_seed(9))
    cache, twin = (hf.EvictingCache.from_model(model, "scissorhands", budget=8, recent_window=2) for _ in range(2))
    named = re.escape("keys (1, 2, 0, 16): a forward needs at least one token")
    for step in range(2):
        with pytest.raises(InvalidInputError, match=named):
            cache.update(torch.zeros(1, 2, 0, 16), torch.zeros(1, 2, 0, 16), 0)
        with torch.no_grad():
            piece = ids[:, :6] if step == 0 else ids[:, 6:7]
            assert torch.equal(model(input_ids=piece, cache=cache, use_cache=True).logits,
                               model(input_ids=piece, cache=twin, use_cache=True).logits)


def test_keys_handed_to_update_by_hand_are_undone_at_the_next_forward():
    """Keys and values of the right shape handed to update() by hand start a forward no
    attention reaches: the next forward undoes it and refuses, saying the cache is as it
    was before (no reset needed), and the forward after that equals a twin's; a config
    that is not a model's is refused by type."""
    model = _tiny()
    ids = torch.randint(2, VOCAB - 1, (1, 12), generator=torch.Generator().manual_seed(2))
    cache, twin = (hf.EvictingCache.from_model(model, "scissorhands", budget=8, recent_window=2) for _ in range(2))
    with torch.no_grad():
        for c in (cache, twin):
            model(input_ids=ids[:, :10], cache=c, use_cache=True)
        cache.update(torch.zeros(1, 2, 1, 16), torch.zeros(1, 2, 1, 16), 0)
        with pytest.raises(InvalidInputError, match="was undone"):
            model(input_ids=ids[:, 10:11], cache=cache, use_cache=True)
        for t in (10, 11):
            step = ids[:, t:t + 1]
            assert torch.equal(model(input_ids=step, cache=cache, use_cache=True).logits,
                               model(input_ids=step, cache=twin, use_cache=True).logits)
    for config in (None, 3):
        with pytest.raises(InvalidTypeError, match="model's transformers config"):
            hf.EvictingCache(config)


def _greedy(model, cache, ids, **kwargs):
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, pad_token_id=0,
                              do_sample=False, max_new_tokens=10, **kwargs)


def test_float16_large_logits_without_eviction_equals_the_stock_cache():
    """A float16 model whose attention logits overflow float16 (sdpa stays finite): with
    nothing evicted the cache gives exactly the stock cache's tokens, in one forward
    and in prompt chunks (rows computed in float32), and evicting runs too."""
    from transformers import DynamicCache

    model = _tiny(torch.float16)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(40.0)
            layer.self_attn.k_proj.weight.mul_(32000.0)
    ids = torch.randint(2, VOCAB - 1, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():  # the scaled logits of the first layer do overflow float16
        attn = model.model.layers[0].self_attn
        hidden = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids)).float()
        q = hidden @ attn.q_proj.weight.float().T
        k = hidden @ attn.k_proj.weight.float().T
        assert float((q[..., :16] @ k[..., :16].transpose(-1, -2)).abs().max()) * 0.25 > 65504
    stock = _greedy(model, DynamicCache(config=model.config), ids)
    for chunk in (None, 5):
        hf.uninstall(model)
        extra = {} if chunk is None else {"prefill_chunk_size": chunk}
        ours = _greedy(model, hf.EvictingCache.from_model(model, "scissorhands", budget=64), ids, **extra)
        assert torch.equal(stock, ours)
    cache = hf.EvictingCache.from_model(model, "h2o", budget=8, recent_window=2)
    _greedy(model, cache, ids, prefill_chunk_size=5)
    assert int(cache.held_counts().max()) <= 8


def _dynamic_bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


@pytest.mark.parametrize("policy", ["scissorhands", "h2o"])
@pytest.mark.parametrize("budget", [512, 8192, 2**31])
def test_key_value_memory_follows_what_is_held_not_the_budget(budget, policy):
    """Below the budget the cache's keys and values, and its whole ``memory_bytes()`` (the
    policies' state included), take at most 1.1x the stock cache's for the same tokens at
    every length (a 14-token prompt, then one token at a time, then a chunk), whatever
    the budget, 2**31 included, with the same tokens."""
    from transformers import DynamicCache

    model = _tiny(head_dim=64)
    ids = torch.randint(2, VOCAB - 1, (1, 90), generator=torch.Generator().manual_seed(1))
    stock = DynamicCache(config=model.config)
    cache = hf.EvictingCache.from_model(model, policy, budget=budget, recent_window=4, sinks=4)
    pieces = [(0, 14), *[(t, t + 1) for t in range(14, 60)], (60, 90)]
    with torch.no_grad():
        for start, end in pieces:
            hf.uninstall(model)
            expected = model(ids[:, start:end], cache=stock, use_cache=True).logits
            got = hf.prefill(model, cache, ids[0, start:end])
            assert torch.equal(expected[0], got)
            assert cache.storage.nbytes() <= 1.1 * _dynamic_bytes(stock), (end, cache.storage.nbytes())
            assert cache.memory_bytes() <= 1.1 * _dynamic_bytes(stock), (end, cache.memory_bytes())
    assert cache.seen == 90 and int(cache.held_counts().min()) == 90


def test_layout_kernels_refuse_bad_arguments_and_change_nothing():
    """sh_rope_rotate, sh_slots_step_steady, sh_slots_step_rows and sh_rope_turns refuse a
    vector past the buffer, a table row past the table, an index past the count, rows of
    different counts (steady), a count past the stride or a slot past the rotations or the
    validity table, with nothing written; sh_rope_rotate by a table of angle 0 changes
    nothing."""
    from scissorhands._native import ffi, lib

    x = np.arange(8, dtype=np.float32)
    cos, sin = np.ones((1, 2)), np.zeros((1, 2))
    i64, f, d = "int64_t *", "float *", "double *"

    def rotate(offsets, which, length=8):
        o, w = np.array(offsets, dtype=np.int64), np.array(which, dtype=np.int64)
        return lib.sh_rope_rotate(ffi.cast(f, x.ctypes.data), length, ffi.cast(i64, o.ctypes.data),
                                  ffi.cast(i64, w.ctypes.data), len(o), ffi.cast(d, cos.ctypes.data),
                                  ffi.cast(d, sin.ctypes.data), 1, 2)

    before = x.copy()
    assert rotate([0, 5], [0, 0]) == lib.SH_ERR_ARG and np.array_equal(x, before)  # 5 + 4 > 8
    assert rotate([0, 4], [0, 1]) == lib.SH_ERR_ARG and np.array_equal(x, before)  # table row 1 of 1
    assert rotate([0, 4], [0, 0]) == lib.SH_OK and np.array_equal(x, before)  # angle 0
    slots = np.array([[3, 1, 2, -1], [0, 1, 2, -1]], dtype=np.int32)
    freed = np.zeros(2, dtype=np.int64)
    valid = np.ones((2, 4), dtype=bool)
    u8 = "uint8_t *"

    def steady(index, count=3, held=(3, 3), free=(0, 3)):
        i, c, fr = (np.array(v, dtype=np.int64) for v in (index, held, free))
        return lib.sh_slots_step_steady(ffi.cast("int32_t *", slots.ctypes.data), 2, 4, count,
                                        ffi.cast(i64, c.ctypes.data), ffi.cast(i64, fr.ctypes.data),
                                        ffi.cast(i64, i.ctypes.data), ffi.cast(u8, valid.ctypes.data), 4,
                                        ffi.cast(i64, freed.ctypes.data))

    assert steady([1, 4]) == lib.SH_ERR_ARG  # index 4 past count 3
    assert steady([1, 3], free=(0, 9)) == lib.SH_ERR_ARG  # row 1 would free slot 9, past the 4 valid
    assert steady([1, 3], held=(3, 2)) == lib.SH_ERR_LENGTH  # the rows' counts differ
    assert steady([1, 3], count=4, held=(4, 4)) == lib.SH_ERR_LENGTH  # count + 1 past the stride
    assert np.array_equal(slots, [[3, 1, 2, -1], [0, 1, 2, -1]]) and valid.all() and not freed.any()
    assert steady([1, 3]) == lib.SH_OK
    assert np.array_equal(slots[:, :3], [[3, 2, 0], [0, 1, 2]]) and list(freed) == [1, 3]
    assert np.array_equal(valid, [[True, False, True, True], [True, True, True, False]])

    def rows(index, held, free=(0, 3)):
        i, c, fr = (np.array(v, dtype=np.int64) for v in (index, held, free))
        return lib.sh_slots_step_rows(ffi.cast("int32_t *", slots.ctypes.data), 2, 4, ffi.cast(i64, c.ctypes.data),
                                      ffi.cast(i64, fr.ctypes.data), ffi.cast(i64, i.ctypes.data),
                                      ffi.cast(u8, valid.ctypes.data), 4, ffi.cast(i64, freed.ctypes.data))

    table, validity, was_freed = slots.copy(), valid.copy(), freed.copy()
    assert rows([3, 1], held=(2, 3)) == lib.SH_ERR_ARG  # index 3 past row 0's count of 2
    assert rows([1, 1], held=(2, 4)) == lib.SH_ERR_LENGTH  # row 1's 4 + 1 past the stride
    assert rows([1, 1], held=(-1, 3)) == lib.SH_ERR_LENGTH  # a negative count
    assert np.array_equal(slots, table) and np.array_equal(valid, validity) and np.array_equal(freed, was_freed)
    assert rows([0, 2], held=(2, 3), free=(1, 3)) == lib.SH_OK  # row 0 holds 2 (3, 2), takes slot 1, loses 3
    assert np.array_equal(slots[0, :2], [2, 1]) and np.array_equal(slots[1, :3], [0, 1, 3]) and list(freed) == [3, 2]
    counts, rope = np.array([2], dtype=np.int64), np.array([[5, 7, 0]], dtype=np.int64)
    out = np.zeros((5, 4), dtype=np.int64)

    def turns(held):
        row = np.array([held], dtype=np.int32)
        return lib.sh_rope_turns(ffi.cast("int32_t *", row.ctypes.data), 3, ffi.cast(i64, counts.ctypes.data),
                                 ffi.cast(i64, rope.ctypes.data), 3, 1, ffi.NULL, ffi.NULL, 0,
                                 *(ffi.cast(i64, out[k].ctypes.data) for k in range(5)), 4)

    assert turns([0, 3, 0]) == -1  # slot 3 past the row's 3 rotations
    assert turns([0, 1, 0]) == 1  # offset 7 - 1 = 6: slot 0 (at 5) turns by +1 to 6
    assert list(out[:, 0]) == [6, 0, 0, 1, 6]


def test_rope_layer_is_rotate_record_and_turned_copy_in_one_call():
    """sh_rope_layer turns the keys as sh_rope_rotate does, records their rotations, and
    returns the query turned as sh_rope_rotate turns a copy, bit for bit; a bad argument
    (a key past the buffer, a rope index past the rotations, a query vector past the
    query, a table row past the table, 2 half past head_dim) writes nothing."""
    from scissorhands._native import ffi, lib

    rng = np.random.default_rng(5)
    half, head_dim, rows = 3, 8, 4
    cos, sin = np.cos(rng.standard_normal((rows, half))), np.sin(rng.standard_normal((rows, half)))
    keys = rng.standard_normal(5 * head_dim).astype(np.float32)
    query = rng.standard_normal(2 * head_dim).astype(np.float32)
    offsets, which = np.array([16, 0, 32], dtype=np.int64), np.array([2, 0, 3], dtype=np.int64)
    rope_index, target = np.array([4, 0, 7], dtype=np.int64), np.array([11, 12, 13], dtype=np.int64)
    query_which = np.array([1, 3], dtype=np.int64)
    i64, f, d = "int64_t *", "float *", "double *"

    def ptr(a, kind):
        return ffi.cast(kind, a.ctypes.data)

    def layer(k, r, out, count=3, qcount=2, table=rows, dim=head_dim, index=rope_index):
        return lib.sh_rope_layer(ptr(k, f), k.size, ptr(offsets, i64), ptr(which, i64), count, ptr(r, i64), r.size,
                                 ptr(index, i64), ptr(target, i64), ptr(query, "const float *"), ptr(out, f),
                                 query.size, dim, ptr(query_which, i64), qcount, ptr(cos, d), ptr(sin, d), table, half)

    def rotate(x, o, w):
        assert lib.sh_rope_rotate(ptr(x, f), x.size, ptr(o, i64), ptr(w, i64), len(o), ptr(cos, d), ptr(sin, d),
                                  rows, half) == lib.SH_OK

    want_keys, want_query = keys.copy(), query.copy()
    rotate(want_keys, offsets, which)
    rotate(want_query, np.array([0, head_dim], dtype=np.int64), query_which)
    for bad in ({"k": keys[:37]}, {"index": np.array([4, 0, 8], dtype=np.int64)}, {"qcount": 3}, {"table": 3},
                {"dim": 5}):
        k, r, out = bad.get("k", keys).copy(), np.zeros(8, dtype=np.int64), np.zeros_like(query)
        before = k.copy()
        args = {key: value for key, value in bad.items() if key != "k"}
        assert layer(k, r, out, **args) == lib.SH_ERR_ARG, bad
        assert np.array_equal(k, before) and not r.any() and not out.any(), bad
    k, r, out = keys.copy(), np.zeros(8, dtype=np.int64), np.zeros_like(query)
    assert layer(k, r, out) == lib.SH_OK
    assert np.array_equal(k.view(np.uint32), want_keys.view(np.uint32))
    assert np.array_equal(out.view(np.uint32), want_query.view(np.uint32))
    assert list(r) == [12, 0, 0, 0, 11, 0, 0, 13]
