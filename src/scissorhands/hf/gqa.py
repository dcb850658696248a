"""The one reduction every real-model number depends on: from query heads to KV heads.

A policy row sees, per KV head, the mean of its GQA group's query-head weights (or, in
``mean`` head mode, the mean over every query head of the layer), without the token's
weight on itself, not renormalised.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._native import check, ffi, lib

__all__ = ["DecodeWeights", "decode_layers", "gather_group_mean", "gather_layers", "group_mean"]


def group_mean(weights: torch.Tensor, rows: int) -> np.ndarray:
    """Mean over each group of query heads, as float32 NumPy.

    Parameters
    ----------
    weights : torch.Tensor
        ``(..., num_heads, q, kv)`` attention weights, any float dtype.
    rows : int
        Rows per leading index: the KV heads (``per-head``), or 1 (``mean``); must
        divide ``num_heads``, the heads of one row being consecutive.

    Returns
    -------
    numpy.ndarray
        ``(..., rows, q, kv)`` float32: the group's weights added in head order, then
        divided by the group's size (every weight widened exactly from its dtype first).
    """
    shape = weights.shape
    grouped = weights.detach().float().numpy().reshape(*shape[:-3], rows, -1, shape[-2], shape[-1])
    total = grouped[..., 0, :, :].copy()
    for head in range(1, grouped.shape[-3]):
        total += grouped[..., head, :, :]
    total /= np.float32(grouped.shape[-3])
    return total


def _column_rows(columns: np.ndarray, total: int) -> tuple[np.ndarray, int, int]:
    """``columns`` as ``total`` rows of int64 the C gathers read in place (a copy only
    when its dtype or layout is not one), with its width and row stride in elements."""
    columns = np.asarray(columns)
    if (columns.dtype != np.int64 or columns.ndim != 2 or columns.shape[0] != total or columns.strides[1] != 8
            or columns.strides[0] % 8 or columns.strides[0] < 8 * columns.shape[1]):
        columns = np.ascontiguousarray(columns, dtype=np.int64).reshape(total, -1)
    width = int(columns.shape[1])
    return columns, width, (columns.strides[0] // 8 if total > 1 else width)


def gather_group_mean(weights: torch.Tensor, rows: int, columns: np.ndarray, held: np.ndarray | None = None,
                      out: np.ndarray | None = None) -> np.ndarray:
    """:func:`group_mean` and a gather into each row's kept order in one C pass over the
    weights where the attention left them (``sh_gqa_gather``): for every policy row
    ``r`` of the leading ``batch * rows``, query row ``t`` and ``j < width``,
    ``out[r, t, j] = group_mean(weights)[r, t, columns[r, j]]``, the same float32
    arithmetic; a column outside ``[0, extent)`` gives 0.  With ``held`` (a chunk in
    ``extend``'s layout), ``out[r, t, j]`` is 0 for ``j > held[r] + t`` without reading
    the weights: the chunk's later tokens, which the causal mask gave weight 0.

    Parameters
    ----------
    weights : torch.Tensor
        ``(batch, num_heads, q, extent)`` attention weights, any float dtype (widened
        to float32 exactly first when not float32), on the CPU.
    rows : int
        Policy rows per sequence (divides ``num_heads``; consecutive heads).
    columns : numpy.ndarray
        ``(batch * rows, width)`` int64 physical columns, kept order (rows may be
        strided views of a wider table).
    held : numpy.ndarray, optional
        ``(batch * rows,)`` int64: the positions each row held before the chunk.
    out : numpy.ndarray, optional
        ``(batch * rows, q, width)`` float32 C-contiguous to write into.

    Returns
    -------
    numpy.ndarray
        ``out`` (or a new array), ``(batch * rows, q, width)`` float32.
    """
    w = weights.detach()
    if w.dtype != torch.float32:
        w = w.float()
    w = w.contiguous()
    batch, heads, q, extent = w.shape
    total = batch * rows
    columns, width, stride = _column_rows(columns, total)
    if out is None:
        out = np.empty((total, q, width), dtype=np.float32)
    held_c = ffi.NULL
    if held is not None:
        held = np.ascontiguousarray(held, dtype=np.int64)
        held_c = ffi.cast("const int64_t *", held.ctypes.data)
    check(lib.sh_gqa_gather(ffi.cast("const float *", w.data_ptr()), total, heads // rows, q, extent,
                            ffi.cast("const int64_t *", columns.ctypes.data), stride, width,
                            held_c, ffi.from_buffer("float[]", out)), "gather_group_mean")
    return out


def gather_layers(weights: list[torch.Tensor], rows: int, table: np.ndarray, row_step: int, width: int,
                  out: np.ndarray) -> bool:
    """:func:`gather_group_mean` of a decode step's every layer at once, each layer's
    weights read where the attention left them (``sh_gqa_gather_layers``: no stacked
    copy): ``out[e * batch * rows + r, 0, j]`` is layer ``e``'s ``group_mean`` at row
    ``r`` and column ``table[(e * batch * rows + r) * row_step, j]``, the same float32
    arithmetic (0 for a column outside the extent).

    Parameters
    ----------
    weights : list of torch.Tensor
        Per layer ``(batch, num_heads, 1, extent)`` attention weights (the same shape in
        every layer; widened to float32 exactly, or copied to the CPU, first when not).
    rows : int
        Policy rows per sequence (divides ``num_heads``; consecutive heads).
    table : numpy.ndarray
        C-contiguous int32 ``(layers * batch * rows * row_step, stride)`` slot table,
        ``stride >= width``: every ``row_step``-th row is a policy row's physical
        columns in kept order (the cache's slot table; ``row_step`` > 1 in ``mean``
        head mode).
    row_step : int
        Table rows per policy row.
    width : int
        Columns per policy row.
    out : numpy.ndarray
        ``(layers * batch * rows, 1, width)`` float32 C-contiguous to write into.

    Returns
    -------
    bool
        Whether every weight written to ``out`` is finite (checked in the same pass).

    Raises
    ------
    ValueError
        Layers of different shapes, more than one query row, or a table or out of
        another shape.
    """
    layers, addresses = decode_layers(weights)
    batch, heads, _, extent = layers[0].shape
    total = len(layers) * batch * rows
    if (table.dtype != np.int32 or table.ndim != 2 or table.shape[0] != total * row_step or table.shape[1] < width
            or out.dtype != np.float32 or out.size != total * width):
        raise ValueError("gather_layers: a table or out of another shape")
    finite = ffi.new("int *")
    check(lib.sh_gqa_gather_layers(addresses, len(layers), batch * rows, heads // rows, extent,
                                   ffi.from_buffer("int32_t[]", table), table.shape[1] * row_step, width,
                                   ffi.from_buffer("float[]", out), finite),
          "gather_layers")
    return bool(finite[0])


def decode_layers(weights: list[torch.Tensor]) -> tuple[list[torch.Tensor], Any]:
    """A decode step's per-layer weights as the C gathers read them, and their addresses.

    Parameters
    ----------
    weights : list of torch.Tensor
        Per layer ``(batch, num_heads, 1, extent)`` attention weights, the same shape in
        every layer.

    Returns
    -------
    tuple
        The layers as float32, C-contiguous CPU tensors (the same tensors when they are;
        else copies, which must outlive the C call), and a ``float *[]`` of their
        addresses in order (what a ``const float *const *`` parameter takes).

    Raises
    ------
    ValueError
        Layers of different shapes, or more than one query row.
    """
    shape = weights[0].shape
    layers = weights
    if not all(w.is_cpu and w.dtype is torch.float32 and w.shape == shape and w.is_contiguous() for w in weights):
        layers = [w.detach().cpu().float().contiguous() for w in weights]
        if any(w.shape != shape for w in layers):
            raise ValueError("gather_layers: the same shape in every layer")
    if len(shape) != 4 or shape[2] != 1:
        raise ValueError("gather_layers: one query row")
    # Every layer's address, in a table C reads (the tensors in `layers` outlive the call).
    addresses = np.fromiter((w.data_ptr() for w in layers), dtype=np.uintp, count=len(layers))
    return layers, ffi.from_buffer("float *[]", addresses)  # keeps `addresses` alive


class DecodeWeights:
    """A decode step's per-layer attention weights as the layers hand them in: each layer
    only appends its tensor; :meth:`layers` checks them and takes their addresses in one
    loop at the step (timed by wrapping the calls, 20-30 us less a step at batch 1 with
    2,048 held than checking each as it came, with the model's weights streamed through
    the caches between two layers).

    The addresses go to one reusable array; :meth:`layers` gives it when every layer's
    weights are float32, C-contiguous, on the CPU, of one query row and of the first
    layer's shape, else what :func:`decode_layers` makes of them."""

    __slots__ = ("_addresses", "_pointer", "size", "tensors")

    def __init__(self, layers: int) -> None:
        self.size = layers
        self._addresses = np.zeros(layers, dtype=np.uintp)
        self._pointer = ffi.from_buffer("float *[]", self._addresses)
        self.tensors: list[torch.Tensor] = []

    def __getstate__(self) -> tuple[int, list[torch.Tensor]]:
        return self.size, self.tensors

    def __setstate__(self, state: tuple[int, list[torch.Tensor]]) -> None:
        self.__init__(state[0])  # type: ignore[misc]
        for weights in state[1]:
            self.add(weights)

    def start(self) -> None:
        """Forget the last step's weights."""
        self.tensors = []

    def add(self, weights: torch.Tensor) -> None:
        """The next layer's ``(batch, num_heads, 1, extent)`` weights."""
        self.tensors.append(weights)

    def layers(self) -> tuple[list[torch.Tensor], Any]:
        """:func:`decode_layers` of the weights handed in: their addresses written into the
        kept array when every layer's are float32, C-contiguous and on the CPU, of one
        query row and of the first layer's shape (read where they are)."""
        tensors = self.tensors
        if len(tensors) == self.size:
            shape = tensors[0].shape
            if len(shape) == 4 and shape[2] == 1:
                addresses = self._addresses
                float32 = torch.float32
                for e, w in enumerate(tensors):
                    if not (w.shape == shape and w.is_cpu and w.dtype is float32 and w.is_contiguous()):
                        break
                    addresses[e] = w.data_ptr()
                else:
                    return tensors, self._pointer
        return decode_layers(tensors)
