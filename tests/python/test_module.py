"""Module-level functions, names, info() and the exception classes."""

import os
import subprocess
import sys

import pytest

import moejit
from moejit import _core


def test_versions_and_names():
    assert moejit.abi_version() == 1 == _core.COMPILED_ABI_VERSION
    parts = moejit.version().split(".")
    assert len(parts) == 3 and all(p.isdigit() for p in parts)
    assert moejit.__version__ == moejit.version()
    assert moejit.max_format_id() >= 8
    fm = moejit.formats()
    assert fm["bf16"] == 0 and fm["fp8_block"] == 5 and fm["mxfp8_e5m2"] == 8
    assert len(fm) == moejit.max_format_id() + 1
    assert moejit.format_name(5) == "fp8_block"
    assert moejit.format_name(moejit.max_format_id() + 1) == "unknown"
    assert moejit.format_name(-1) == "unknown"
    assert moejit.isas()["auto"] == 0 and moejit.isas()["avx512_bf16"] == 4
    assert moejit.isa_name(1) == "scalar" and moejit.isa_name(99) == "unknown"
    names = [moejit.status_name(i) for i in range(6)]
    assert names == ["ok", "invalid_argument", "unsupported", "out_of_memory", "busy", "internal_error"]
    assert moejit.status_name(42) == "unknown"
    assert moejit.host_isa() in moejit.isas() and moejit.host_isa() != "auto"
    assert moejit.ACTIVATIONS == {"silu": 0, "gelu": 1, "gelu_tanh": 2, "swiglu_oai": 3, "swiglu_clamp": 4}


def test_info():
    i = moejit.info()
    for key in ("version", "abi_version", "library", "host_isa", "tiers", "default_isa", "formats",
                "max_format_id", "activations", "cpus"):
        assert key in i, key
    assert i["version"] == moejit.version()
    assert os.path.exists(i["library"]) and "libmoejit" in os.path.basename(i["library"])
    assert i["tiers"][0] == "scalar" and i["tiers"][-1] == i["host_isa"]
    assert i["default_isa"] == i["host_isa"]
    assert i["formats"] == list(moejit.formats())
    assert i["cpus"] == len(os.sched_getaffinity(0))
    # The tier of a default context is the info's default tier.
    assert moejit.Context(num_threads=1).isa == i["default_isa"]


def test_info_follows_max_isa_env(monkeypatch):
    monkeypatch.setenv("MOEJIT_MAX_ISA", "SCALAR")
    assert moejit.info()["default_isa"] == "scalar"
    assert moejit.Context(num_threads=1).isa == "scalar"
    monkeypatch.setenv("MOEJIT_MAX_ISA", "bogus")
    assert "invalid" in moejit.info()["default_isa"]


def test_import_line_in_a_fresh_interpreter():
    # What the README tells a user to run after `pip install .`.
    out = subprocess.run([sys.executable, "-c", "import moejit; print(moejit.info())"], capture_output=True,
                         text=True, check=True, env=os.environ.copy())
    assert "'abi_version': 1" in out.stdout


def test_error_classes():
    assert issubclass(moejit.InvalidArgument, moejit.Error) and issubclass(moejit.InvalidArgument, ValueError)
    assert issubclass(moejit.Unsupported, moejit.Error) and issubclass(moejit.Unsupported, NotImplementedError)
    assert issubclass(moejit.OutOfMemory, MemoryError)
    assert issubclass(moejit.Busy, moejit.Error) and issubclass(moejit.InternalError, moejit.Error)
    assert issubclass(moejit.Error, RuntimeError)
    from moejit._errors import from_status

    for status, cls in [(1, moejit.InvalidArgument), (2, moejit.Unsupported), (3, moejit.OutOfMemory),
                        (4, moejit.Busy), (5, moejit.InternalError)]:
        e = from_status(status, "msg")
        assert type(e) is cls and e.status == status and e.message == "msg" and str(e) == "msg"
        assert e.status_name == moejit.status_name(status)
    e = from_status(77, "odd")
    assert type(e) is moejit.Error and e.status == 77 and e.status_name == "unknown"


def test_c_errors_carry_status_and_last_error():
    with pytest.raises(moejit.InvalidArgument) as ei:
        moejit.Context(num_threads=-1)
    e = ei.value
    assert e.status == 1 and e.status_name == "invalid_argument"
    assert e.message == "moejit_context_create: desc->num_threads = -1 is out of range [0, 1024]"
    # The same message the C library keeps for this thread.
    assert moejit.last_error() == e.message


def test_shipped_stub_is_current(tmp_path):
    # python/moejit/_core.pyi is nanobind's stubgen output for the extension; the
    # public API (moejit/*.py) is annotated inline (py.typed).
    pytest.importorskip("nanobind")
    out = tmp_path / "_core.pyi"
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "moejit._core", "-o", str(out)],
                   check=True, env=os.environ.copy())
    shipped = os.path.join(os.path.dirname(moejit.__file__), "_core.pyi")
    assert os.path.exists(os.path.join(os.path.dirname(moejit.__file__), "py.typed"))
    assert open(shipped).read() == out.read_text(), (
        "python/moejit/_core.pyi is stale: python -m nanobind.stubgen -m moejit._core -o python/moejit/_core.pyi")
