"""Weight banks: the arrays of one projection of every expert, checked against a
format's layout and turned into the ``_core.Matrix`` objects the C layer reads.

A bank is one stacked array ``[E, rows, ...]`` or a sequence of E arrays
``[rows, ...]``; its block scales, per-row scales and biases likewise (each may
be stacked or a sequence independently of the others). Nothing is copied: each
expert's matrix is a view of the caller's memory.
"""

from __future__ import annotations

from . import _arrays as A
from . import _core
from ._errors import InvalidArgument
from ._layout import BITS16, FLOAT32, Layout


def experts(obj, what: str, num_experts: int | None) -> list[A.View]:
    """The per-expert views of a bank given stacked or as a sequence."""
    if isinstance(obj, (list, tuple)):
        if num_experts is not None and len(obj) != num_experts:
            raise InvalidArgument(f"{what}: {len(obj)} arrays, expected one per expert ({num_experts})")
        return [A.view(o, f"{what}[{e}]") for e, o in enumerate(obj)]
    v = A.view(obj, what)
    if v.array.ndim < 2:
        raise InvalidArgument(f"{what}: a stacked bank is [num_experts, ...], got {A.describe(v)}")
    if num_experts is not None and v.array.shape[0] != num_experts:
        raise InvalidArgument(
            f"{what}: {A.describe(v)} holds {v.array.shape[0]} experts, expected {num_experts}"
        )
    return [A.View(v.array[e], v.dtype, v.source) for e in range(v.array.shape[0])]


def infer_k(lay: Layout, v: A.View, what: str) -> tuple[int, int]:
    """(rows, K) of a weight matrix from its shape and dtype."""
    a = v.array
    A.check_dtype(v, lay.data_dtypes, what, f"{lay.name} weights ({lay.description})")
    if a.ndim < 2:
        raise InvalidArgument(f"{what}: weights are [rows, ...] with each row's bytes last, got {A.describe(v)}")
    nbytes = A.prod(a.shape[1:]) * a.itemsize
    k = lay.k_from_row_bytes(nbytes)
    if k is None:
        raise InvalidArgument(
            f"{what}: rows of {nbytes} bytes ({A.describe(v)}) are not a whole number of {lay.name} weights "
            f"({lay.description})"
        )
    return int(a.shape[0]), k


def check_k(lay: Layout, k: int, what: str) -> None:
    why = lay.k_problem(k)
    if why:
        raise InvalidArgument(f"{what} = {k} {why}")


def matrix(
    lay: Layout,
    rows: int,
    k: int,
    scale_dtype: int,
    data: A.View,
    scales: A.View | None,
    row_scales: A.View | None,
    bias: A.View | None,
    what: dict[str, str],
    rows_desc: str,
) -> _core.Matrix:
    """Checks one expert's arrays for a [rows, k] matrix and returns the C-side object.
    `what` names each array in messages ({"data": "gate_up[3]", ...})."""
    a = data.array
    A.check_dtype(data, lay.data_dtypes, what["data"], f"{lay.name} weights ({lay.description})")
    if a.ndim < 2 or a.shape[0] != rows:
        raise InvalidArgument(f"{what['data']}: expected {rows} rows ({rows_desc}), got {A.describe(data)}")
    need = lay.row_bytes(k)
    have = A.prod(a.shape[1:]) * a.itemsize
    if have != need:
        raise InvalidArgument(
            f"{what['data']}: rows of {have} bytes ({A.describe(data)}); {lay.name} with K = {k} needs "
            f"{need} bytes per row ({lay.description})"
        )
    A.check_contiguous(data, what["data"])

    stride = 0
    if lay.scale_kind is None:
        if scales is not None:
            raise InvalidArgument(f"{what['scales']}: format {lay.name} has no separate scales; pass None")
    else:
        if scales is None:
            raise InvalidArgument(f"{what['scales']} is required: format {lay.name} has block scales")
        stride = _scale_stride(lay, rows, k, scale_dtype, scales, what["scales"])
    if lay.row_scales:
        if row_scales is None:
            raise InvalidArgument(f"{what['row_scales']} is required: nvfp4 has an fp32 global scale per row")
        _check_vector(row_scales, rows, FLOAT32, what["row_scales"], "fp32 per-row scales")
    elif row_scales is not None:
        raise InvalidArgument(f"{what['row_scales']}: only nvfp4 has per-row scales; pass None")
    if bias is not None:
        _check_vector(bias, rows, BITS16, what["bias"], "a bf16 bias per row")
    return _core.Matrix(
        a,
        None if scales is None else scales.array,
        stride,
        None if row_scales is None else row_scales.array,
        None if bias is None else bias.array,
    )


def _check_vector(v: A.View, n: int, allowed, what: str, purpose: str) -> None:
    A.check_dtype(v, allowed, what, purpose)
    if v.array.shape != (n,):
        raise InvalidArgument(f"{what}: expected shape [{n}] ({purpose}), got {A.shape_str(v.array.shape)}")
    A.check_contiguous(v, what)


def _scale_stride(lay: Layout, rows: int, k: int, scale_dtype: int, v: A.View, what: str) -> int:
    """Checks a [scale rows, >= scale cols] scale matrix; returns its row stride in
    elements for the C descriptor (0 when dense). Padded rows are taken from the
    array's shape (columns past the scale columns) or its strides (a column slice
    of a wider tensor)."""
    srows, scols = lay.scale_shape(rows, k)
    kind = {"fp8_block": "128x128 block scales", "e8m0": "e8m0 group scales", "e4m3": "e4m3 block scales"}
    purpose = f"{lay.name} {kind[lay.scale_kind]}"
    A.check_dtype(v, lay.scale_dtypes(scale_dtype), what, purpose)
    a = v.array
    if a.ndim != 2 or a.shape[0] != srows or a.shape[1] < scols:
        raise InvalidArgument(
            f"{what}: expected shape [{srows}, {scols}] (or wider rows: padding) of {purpose} for a "
            f"[{rows}, {k}] matrix, got {A.shape_str(a.shape)}"
        )
    item = a.itemsize
    if a.shape[1] > 1 and a.strides[1] != item:
        raise InvalidArgument(f"{what}: the elements of a scale row must be contiguous (strides {a.strides})")
    if srows > 1:
        if a.strides[0] <= 0 or a.strides[0] % item or a.strides[0] // item < a.shape[1]:
            raise InvalidArgument(
                f"{what}: row stride {a.strides[0]} bytes must be a positive multiple of {item} covering the "
                f"{a.shape[1]} columns"
            )
        stride = a.strides[0] // item
    else:
        stride = a.shape[1]
    return 0 if stride == scols else stride
