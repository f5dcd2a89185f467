"""Arrays in, without copies.

Every array argument becomes a numpy view of the caller's memory (never a copy)
plus its *logical* dtype name: numpy arrays (ml_dtypes dtypes included),
``np.memmap``, torch CPU tensors (pinned or not), any object with
``__dlpack__`` (on the CPU), and any object with the buffer protocol. numpy has
no buffer or DLPack export for the ml_dtypes dtypes and torch's bf16 / fp8 /
fp4 dtypes, so those are reinterpreted as unsigned integers of the same size
(``.view``), which shares the memory, and their logical name is kept for the
dtype checks. The views keep the original objects alive (numpy's ``base``
chain), so holding the view holds the memory.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ._errors import InvalidArgument

_RAW_BY_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}

# torch dtypes numpy cannot hold -> the same-size integer dtype viewed instead.
_TORCH_RAW = {
    "bfloat16": "int16",
    "float8_e4m3fn": "uint8",
    "float8_e5m2": "uint8",
    "float8_e8m0fnu": "uint8",
    "float4_e2m1fn_x2": "uint8",
    "uint16": "int16",
    "uint32": "int32",
    "uint64": "int64",
}


class View(NamedTuple):
    array: np.ndarray  # a numpy view of the caller's memory (standard dtypes only)
    dtype: str  # logical dtype name: "bfloat16", "float8_e4m3fn", "uint8", "float32", ...
    source: Any  # what the caller passed (kept alive with the view)


def is_torch_tensor(obj) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr") and hasattr(obj, "dtype")


def view(obj, what: str) -> View:
    """A zero-copy numpy view of `obj` and its logical dtype; InvalidArgument when
    `obj` is not an array in host memory."""
    if isinstance(obj, np.ndarray):
        return _numpy_view(obj, what, obj)
    if is_torch_tensor(obj):
        return _torch_view(obj, what)
    if hasattr(obj, "__dlpack__"):
        try:
            a = np.from_dlpack(obj)
        except (BufferError, TypeError, ValueError, RuntimeError) as e:
            raise InvalidArgument(f"{what}: cannot read it through DLPack ({e}); moejit reads host (CPU) memory") from None
        return _numpy_view(a, what, obj)
    try:
        mv = memoryview(obj)
    except TypeError:
        raise InvalidArgument(
            f"{what} must be an array (numpy, torch, a DLPack or buffer-protocol object), got {type(obj).__name__}"
        ) from None
    try:
        a = np.asarray(mv)
    except (ValueError, TypeError) as e:
        raise InvalidArgument(f"{what}: numpy cannot view its buffer ({e})") from None
    return _numpy_view(a, what, obj)


# dtype -> (the unsigned dtype to view it as, or None; its logical name). numpy's
# dtype.name is slow to compute; calls look it up here.
_DTYPES: dict = {}


def _classify(dt: np.dtype, what: str):
    if dt.type.__module__ == "ml_dtypes":
        raw = _RAW_BY_SIZE.get(dt.itemsize)
        if raw is None:
            raise InvalidArgument(f"{what}: dtype {dt.name} is not supported")
        return np.dtype(raw), dt.name
    if dt.kind not in "biuf" or dt.fields is not None or dt.subdtype is not None:
        raise InvalidArgument(f"{what}: dtype {dt} is not a numeric dtype")
    return None, dt.name


def _numpy_view(a: np.ndarray, what: str, source) -> View:
    info = _DTYPES.get(a.dtype)
    if info is None:
        info = _DTYPES[a.dtype] = _classify(a.dtype, what)
    raw, name = info
    return View(a if raw is None else a.view(raw), name, source)


def _torch_view(t, what: str) -> View:
    import torch

    if t.device.type != "cpu":
        raise InvalidArgument(
            f"{what} is on {t.device}; moejit reads host memory: pass a CPU tensor (pinned memory is fine)"
        )
    if t.layout != torch.strided:
        raise InvalidArgument(f"{what}: layout {t.layout} is not a strided (dense) tensor")
    name = str(t.dtype).replace("torch.", "")
    d = t.detach()
    raw = _TORCH_RAW.get(name)
    if raw is not None:
        d = d.view(getattr(torch, raw))
    try:
        a = d.numpy()
    except (TypeError, RuntimeError) as e:
        raise InvalidArgument(f"{what}: dtype torch.{name} cannot be read ({e})") from None
    return View(a, name, t)


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def shape_str(shape) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def describe(v: View) -> str:
    return f"{v.dtype} {shape_str(v.array.shape)}"


def check_dtype(v: View, allowed: tuple[str, ...], what: str, purpose: str) -> None:
    if v.dtype not in allowed:
        raise InvalidArgument(f"{what}: dtype {v.dtype} cannot hold {purpose} (expected {' or '.join(allowed)})")


def check_contiguous(v: View, what: str) -> None:
    if not v.array.flags.c_contiguous:
        raise InvalidArgument(
            f"{what}: {describe(v)} with strides {tuple(v.array.strides)} bytes is not C-contiguous "
            "(moejit reads it in place; np.ascontiguousarray / .contiguous() makes a contiguous copy)"
        )


def check_matrix2d(v: View, shape: tuple[int, int], allowed: tuple[str, ...], what: str, purpose) -> None:
    """A C-contiguous [rows, cols] array of one of `allowed` dtypes; `purpose` (a str,
    or a function giving one: built only for a message) says what it holds."""
    a = v.array
    if v.dtype in allowed and a.shape == shape and a.flags.c_contiguous:
        return
    p = purpose() if callable(purpose) else purpose
    check_dtype(v, allowed, what, p)
    if a.shape != shape:
        raise InvalidArgument(f"{what}: expected shape {shape_str(shape)} ({p}), got {shape_str(a.shape)}")
    check_contiguous(v, what)


def check_writable(v: View, what: str) -> None:
    if not v.array.flags.writeable:
        raise InvalidArgument(f"{what}: the array is read-only")


def check_no_overlap(out: View, others: list[tuple[View, str]], what: str) -> None:
    for o, name in others:
        if np.may_share_memory(out.array, o.array):
            raise InvalidArgument(f"{what} overlaps {name}: the output must not share memory with an input")


def prod(shape) -> int:
    return math.prod(int(s) for s in shape)
