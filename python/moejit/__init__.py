"""moejit: run-time generated x86 kernels for Mixture-of-Experts decode, from Python.

A thin layer over libmoejit's C API (include/moejit.h, docs/API.md):

* :class:`Context`: thread pool, ISA tier, dedup option.
* :class:`MoE`: a layer of routed experts over your weight banks, read in place
  (gate and up fused or as separate banks, a format per projection).
* :class:`Linear`: a dense quantized projection.
* :func:`info`: what this library and CPU offer.

Weights, scales and biases are any host arrays (numpy incl. ml_dtypes dtypes,
np.memmap, torch CPU tensors, DLPack or buffer-protocol objects); nothing is
copied and every layer holds references to what it reads. Calls release the
GIL. Errors raise :class:`Error` subclasses carrying the C status and message.
See docs/PYTHON.md.
"""

from __future__ import annotations

import os

from . import _core
from ._errors import Busy, Error, InternalError, InvalidArgument, OutOfMemory, Unsupported

if _core.abi_version() != _core.COMPILED_ABI_VERSION:  # pragma: no cover (needs a mismatched library)
    raise ImportError(
        f"moejit: the extension was built for libmoejit ABI {_core.COMPILED_ABI_VERSION} but "
        f"{_core.library_path()} has ABI {_core.abi_version()}"
    )

from . import _names
from ._api import Context, Linear, MoE, ProjFormat, Task
from ._names import ACTIVATIONS
from . import gguf, hf  # noqa: E402  (loaders: moejit.gguf.moe_layer, moejit.hf.moe_layer)

__version__ = _core.version()

__all__ = [
    "Context",
    "MoE",
    "Linear",
    "Task",
    "ProjFormat",
    "Error",
    "InvalidArgument",
    "Unsupported",
    "OutOfMemory",
    "Busy",
    "InternalError",
    "info",
    "version",
    "abi_version",
    "max_format_id",
    "host_isa",
    "formats",
    "isas",
    "ACTIVATIONS",
    "format_name",
    "isa_name",
    "status_name",
    "last_error",
    "gguf",
    "hf",
]


def version() -> str:
    """libmoejit's version, "MAJOR.MINOR.PATCH" (``moejit_version``)."""
    return _core.version()


def abi_version() -> int:
    """The C ABI version of the loaded library (``moejit_abi_version``)."""
    return _core.abi_version()


def max_format_id() -> int:
    """The highest format id the loaded library recognises (``moejit_max_format_id``)."""
    return _core.max_format_id()


def host_isa() -> str:
    """The best tier of this CPU and build (``moejit_host_isa``)."""
    return isa_name(_core.host_isa())


def formats() -> dict[str, int]:
    """Every format of the loaded library: name -> id."""
    return _names.format_names()


def isas() -> dict[str, int]:
    """Every tier name of the loaded library ("auto" included): name -> id."""
    return _names.isa_names()


def format_name(format_id: int) -> str:
    """``moejit_format_name``: the name of a format id, "unknown" beyond the library's."""
    return _core.format_name(int(format_id))


def isa_name(isa_id: int) -> str:
    """``moejit_isa_name``: the name of a tier id, "unknown" beyond the library's."""
    return _core.isa_name(int(isa_id))


def status_name(status: int) -> str:
    """``moejit_status_name``: "ok", "invalid_argument", ..., "unknown"."""
    return _core.status_name(int(status))


def last_error() -> str:
    """``moejit_last_error``: this thread's message of its last failing C call (the
    exceptions already carry it; this is for completeness)."""
    return _core.last_error()


def info() -> dict:
    """What moejit offers here: library and package versions, ABI, the loaded
    library's path, the host tier and the tiers it can run (each one
    ``Context(max_isa=...)`` accepts), the tier a default context runs (the host's
    capped by ``MOEJIT_MAX_ISA``), every format and activation, the max format id,
    and the CPUs of the affinity mask (a default context's worker count)."""
    tiers = _names.isa_names()
    host = _core.host_isa()
    runnable = [n for n, i in tiers.items() if 0 < i <= host]
    env = os.environ.get("MOEJIT_MAX_ISA") or None
    default = host
    if env is not None:
        cap = {n.lower(): i for n, i in tiers.items() if i > 0}.get(env.lower())
        default = min(host, cap) if cap is not None else None
    return {
        "version": _core.version(),
        "abi_version": _core.abi_version(),
        "library": _core.library_path(),
        "host_isa": isa_name(host),
        "tiers": runnable,
        "default_isa": isa_name(default) if default is not None else f"invalid MOEJIT_MAX_ISA={env!r}",
        "max_isa_env": env,
        "formats": list(_names.format_names()),
        "max_format_id": _core.max_format_id(),
        "activations": list(ACTIVATIONS),
        "cpus": len(os.sched_getaffinity(0)),
    }
