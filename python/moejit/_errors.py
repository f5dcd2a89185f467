"""moejit's exceptions: one class per status of the C API.

Every failing call raises a subclass of :class:`Error` carrying the status
(``.status``, the C enum value; ``.status_name``) and the message
(``.message``): ``moejit_last_error()`` for failures of the C library, or the
binding's own message for arguments it rejects before calling it (those are
always :class:`InvalidArgument`, status 1, exactly as the library would treat
them).
"""

from __future__ import annotations

__all__ = ["Error", "InvalidArgument", "Unsupported", "OutOfMemory", "Busy", "InternalError", "from_status"]

_STATUS_NAMES = {
    0: "ok",
    1: "invalid_argument",
    2: "unsupported",
    3: "out_of_memory",
    4: "busy",
    5: "internal_error",
}


class Error(RuntimeError):
    """Base class of every moejit error: ``status`` (int), ``status_name``, ``message``."""

    status: int = -1

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        if status is not None:
            self.status = status
        self.message = message

    @property
    def status_name(self) -> str:
        return _STATUS_NAMES.get(self.status, "unknown")


class InvalidArgument(Error, ValueError):
    """MOEJIT_INVALID_ARGUMENT (1): an argument is out of its documented range, or an
    array has the wrong shape, dtype, strides or memory."""

    status = 1


class Unsupported(Error, NotImplementedError):
    """MOEJIT_UNSUPPORTED (2): a valid request this build or CPU cannot serve (a tier
    the CPU lacks, a format or stride without kernels)."""

    status = 2


class OutOfMemory(Error, MemoryError):
    """MOEJIT_OUT_OF_MEMORY (3)."""

    status = 3


class Busy(Error):
    """MOEJIT_BUSY (4): the context already has a task in flight (wait for it first)."""

    status = 4


class InternalError(Error):
    """MOEJIT_INTERNAL_ERROR (5): a bug in moejit; please report it with the message."""

    status = 5


_BY_STATUS = {c.status: c for c in (InvalidArgument, Unsupported, OutOfMemory, Busy, InternalError)}


def from_status(status: int, message: str) -> Error:
    """The exception for a failing status of the C API (an unknown status gives a plain Error)."""
    cls = _BY_STATUS.get(int(status))
    if cls is None:
        return Error(message, int(status))
    return cls(message)
