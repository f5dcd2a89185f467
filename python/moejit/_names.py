"""Names and ids of the C enumerations. Formats and tiers are asked of the loaded
library (``moejit_format_name``, ``moejit_isa_name``), so a newer library's ids
appear here without a change to this package; activations and dtypes have no
name function in the C API and are listed here (docs/API.md fixes their numbers).
"""

from __future__ import annotations

import functools
from typing import Union

from . import _core
from ._errors import InvalidArgument

_UNKNOWN = "unknown"

ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "swiglu_oai": 3, "swiglu_clamp": 4}
DTYPES = {"bf16": 0, "f32": 1}
_DTYPE_ALIASES = {"bf16": 0, "bfloat16": 0, "f32": 1, "float32": 1}
STATUSES = {"ok": 0, "invalid_argument": 1, "unsupported": 2, "out_of_memory": 3, "busy": 4, "internal_error": 5}
CONTEXT_NO_DEDUP = 1

NameOrId = Union[str, int]


@functools.lru_cache(maxsize=None)
def _format_table() -> tuple:
    return tuple((_core.format_name(i), i) for i in range(_core.max_format_id() + 1))


def format_names() -> dict[str, int]:
    """Every format the loaded library recognises: name -> id (0 .. max_format_id)."""
    return dict(_format_table())


@functools.lru_cache(maxsize=None)
def _isa_table() -> tuple:
    out = {}
    for i in range(64):
        name = _core.isa_name(i)
        if name == _UNKNOWN:
            break
        out[name] = i
    return tuple(out.items())


def isa_names() -> dict[str, int]:
    """Every tier name the loaded library knows (auto included): name -> id."""
    return dict(_isa_table())


def _lookup(value, table: dict[str, int], what: str, kind: str) -> int:
    if isinstance(value, bool):
        raise InvalidArgument(f"{what} = {value!r} must be a {kind} name or id, not a bool")
    if isinstance(value, int):
        if value not in table.values():
            raise InvalidArgument(f"{what} = {value} is not a known {kind} id ({_choices(table)})")
        return value
    if isinstance(value, str):
        for name, i in table.items():
            if name.lower() == value.lower():
                return i
        raise InvalidArgument(f"{what} = {value!r} is not a known {kind} ({_choices(table)})")
    raise InvalidArgument(f"{what} must be a {kind} name (str) or id (int), got {type(value).__name__}")


def _choices(table: dict[str, int]) -> str:
    return ", ".join(f"{n} = {i}" for n, i in table.items())


def format_id(value: NameOrId, what: str = "format") -> int:
    return _lookup(value, format_names(), what, "format")


def isa_id(value: NameOrId | None, what: str = "max_isa") -> int:
    if value is None:
        return 0
    return _lookup(value, isa_names(), what, "tier")


def activation_id(value: NameOrId, what: str = "activation") -> int:
    return _lookup(value, ACTIVATIONS, what, "activation")


def dtype_id(value, what: str) -> int:
    """bf16 / f32 given as "bf16", "bfloat16", "f32", "float32", 0, 1, a numpy dtype
    (np.float32, ml_dtypes.bfloat16) or a torch dtype."""
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        if isinstance(value, str):
            v = _DTYPE_ALIASES.get(value.lower())
            if v is None:
                raise InvalidArgument(f"{what} = {value!r} is not bf16 or f32")
            return v
        return _lookup(value, DTYPES, what, "dtype")
    name = str(value)
    if name.startswith("torch."):
        name = name[len("torch."):]
    else:
        try:
            import numpy as np

            name = np.dtype(value).name
        except TypeError:
            raise InvalidArgument(f"{what} = {value!r} is not bf16 or f32") from None
    v = _DTYPE_ALIASES.get(name)
    if v is None:
        raise InvalidArgument(f"{what} = {value!r} is not bf16 or f32")
    return v


def name_of(table: dict[str, int], value: int) -> str:
    for n, i in table.items():
        if i == value:
            return n
    return _UNKNOWN
