"""What the cache computes beside the model, computed at less cost: the same numbers.

The C reduction of attention rows to policy rows against the NumPy statement it
replaces; the cheaper forms of the masks against the dense ones; float16 rows that
stay finite where sdpa does; storage that grows with what is held, not the budget.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")

from scissorhands.hf.attention import attention_rows  # noqa: E402
from scissorhands.hf.gqa import gather_group_mean, group_mean  # noqa: E402
from scissorhands.hf.storage import ChunkMask  # noqa: E402

pytestmark = pytest.mark.hf


class _Module:
    head_dim = 16


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
