"""moejit.Context: threads, pinning, tiers, dedup, and their errors."""

import os

import pytest

import moejit
from conftest import host_tiers


def test_defaults():
    c = moejit.Context()
    assert c.num_threads == len(os.sched_getaffinity(0))
    assert c.isa == moejit.host_isa()
    assert c.dedup is True
    assert "moejit.Context(" in repr(c)
    c.wait()  # nothing in flight: returns at once


def test_num_threads_and_cpu_ids():
    assert moejit.Context(num_threads=3).num_threads == 3
    cpus = sorted(os.sched_getaffinity(0))
    c = moejit.Context(cpu_ids=[cpus[0]])
    assert c.num_threads == 1
    assert moejit.Context(num_threads=4, cpu_ids=[cpus[0], cpus[0]]).num_threads == 4  # duplicates allowed


def test_thread_errors():
    with pytest.raises(moejit.InvalidArgument, match=r"num_threads = 2000 is out of range"):
        moejit.Context(num_threads=2000)
    with pytest.raises(moejit.InvalidArgument, match="num_threads must be an int"):
        moejit.Context(num_threads=1.5)
    bad = max(os.sched_getaffinity(0)) + 1000
    with pytest.raises(moejit.InvalidArgument, match=rf"cpu_ids\[0\] = {bad} is not in the process affinity mask"):
        moejit.Context(cpu_ids=[bad])
    with pytest.raises(moejit.InvalidArgument, match="cpu_ids is empty"):
        moejit.Context(cpu_ids=[])
    with pytest.raises(moejit.InvalidArgument, match="dedup must be True or False"):
        moejit.Context(dedup="no")


def test_every_tier_is_forced_and_read_back():
    for tier in host_tiers():
        assert moejit.Context(num_threads=1, max_isa=tier).isa == tier
        assert moejit.Context(num_threads=1, max_isa=moejit.isas()[tier]).isa == tier
        assert moejit.Context(num_threads=1, max_isa=tier.upper()).isa == tier
    assert moejit.Context(num_threads=1, max_isa="auto").isa == moejit.host_isa()


def test_tier_errors(monkeypatch):
    with pytest.raises(moejit.InvalidArgument, match=r"max_isa = 'avx9' is not a known tier"):
        moejit.Context(max_isa="avx9")
    with pytest.raises(moejit.InvalidArgument, match="not a known tier id"):
        moejit.Context(max_isa=17)
    above = [n for n, i in moejit.isas().items() if i > moejit.isas()[moejit.host_isa()]]
    if above:
        with pytest.raises(moejit.Unsupported, match="is above this CPU's best tier"):
            moejit.Context(max_isa=above[0])
    monkeypatch.setenv("MOEJIT_MAX_ISA", "avx2")
    assert moejit.Context(num_threads=1).isa == "avx2"
    assert moejit.Context(num_threads=1, max_isa="scalar").isa == "scalar"
    monkeypatch.setenv("MOEJIT_MAX_ISA", "nonsense")
    with pytest.raises(moejit.InvalidArgument, match='MOEJIT_MAX_ISA = "nonsense"'):
        moejit.Context(num_threads=1)


def test_dedup_flag():
    assert moejit.Context(num_threads=1, dedup=False).dedup is False
