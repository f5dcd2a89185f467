"""pytest set-up for the moejit package tests (tests/python/test_*.py).

CTest runs them with PYTHONPATH pointing at the build tree's package
(build/python); `make pip-check` runs them against a wheel installed by
`pip install .`. MOEJIT_MAX_ISA is cleared: tests force tiers through
Context(max_isa=...) and read back the tier that runs.
"""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
os.environ.pop("MOEJIT_MAX_ISA", None)
os.environ.pop("MOEJIT_DEDUP", None)

import moejit  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--installed-from", default=None,
                     help="fail unless moejit is imported from this prefix (make pip-check: the installed wheel)")


def pytest_configure(config):
    prefix = config.getoption("--installed-from")
    if prefix and not os.path.realpath(moejit.__file__).startswith(os.path.realpath(prefix)):
        raise pytest.UsageError(f"moejit was imported from {moejit.__file__}, not from {prefix}")


def host_tiers():
    return moejit.info()["tiers"]


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture(scope="session")
def ctx():
    return moejit.Context(num_threads=2)
