"""submit / wait, BUSY, the lifetime of a task's arrays, and the GIL released while
kernels run."""

import gc
import threading
import time
import weakref

import numpy as np
import pytest

import moejit
from moejit_ref import BF16, assert_close, make_bank, moe_kwargs, moe_reference, rand_bf16, routes

E, H, I, K = 4, 256, 128, 2


@pytest.fixture
def layer(rng):
    ctx = moejit.Context(num_threads=2)
    gu = make_bank("fp8_block", E, 2 * I, H, rng)
    dn = make_bank("fp8_block", E, H, I, rng)
    moe = moejit.MoE(ctx, format="fp8_block", top_k=K, **moe_kwargs(gu, dn))
    return ctx, moe, gu, dn


def test_submit_wait_matches_forward(layer, rng):
    ctx, moe, gu, dn = layer
    x = rand_bf16(rng, (3, H))
    ids, w = routes(rng, 3, E, K)
    task = moe.submit(x, ids, w)
    assert isinstance(task, moejit.Task) and not task.done and repr(task) == "moejit.Task(done=False)"
    y = task.wait()
    assert task.done and task.wait() is y  # a second wait returns at once
    assert np.array_equal(y.view(np.uint16), moe.forward(x, ids, w).view(np.uint16))
    ref, bound = moe_reference(x, ids, w, gu.deq, dn.deq)
    assert_close(y, ref, bound, True)
    assert moe.stats()["calls"] == 2
    out = np.empty((3, H), BF16)
    with moe.submit(x, ids, w, out=out) as t:
        pass
    assert t.done and np.array_equal(out.view(np.uint16), y.view(np.uint16))


def test_busy_until_waited(layer, rng):
    ctx, moe, gu, dn = layer
    other = moejit.MoE(ctx, format="fp8_block", top_k=K, **moe_kwargs(gu, dn))
    x = rand_bf16(rng, (2, H))
    ids, w = routes(rng, 2, E, K)
    task = moe.submit(x, ids, w)
    # The task is in flight until waited for, however soon the kernels finish.
    time.sleep(0.05)
    for call in (moe.forward, moe.submit, other.forward, other.submit):
        with pytest.raises(moejit.Busy, match="already has a task in flight") as ei:
            call(x, ids, w)
        assert ei.value.status == 4
    # Another context is independent.
    c2 = moejit.Context(num_threads=1)
    moejit.MoE(c2, format="fp8_block", top_k=K, **moe_kwargs(gu, dn)).forward(x, ids, w)
    ctx.wait()  # the context's wait ends it too, and the handle knows
    assert task.done
    other.forward(x, ids, w)


def test_task_holds_its_arrays(layer, rng):
    ctx, moe, gu, dn = layer
    x = rand_bf16(rng, (2, H))
    ids, w = routes(rng, 2, E, K)
    ref = moe.forward(x, ids, w)
    xc, ic, wc = x.copy(), ids.copy(), w.copy()
    alive = [weakref.ref(a) for a in (xc, ic, wc)]
    task = moe.submit(xc, ic, wc)
    del xc, ic, wc
    gc.collect()
    assert all(r() is not None for r in alive)
    y = task.wait()
    gc.collect()
    assert all(r() is None for r in alive)  # released once waited for
    assert np.array_equal(y.view(np.uint16), ref.view(np.uint16))


def test_dropping_a_task_waits(layer, rng):
    ctx, moe, gu, dn = layer
    x = rand_bf16(rng, (2, H))
    ids, w = routes(rng, 2, E, K)
    out = np.zeros((2, H), BF16)
    moe.submit(x, ids, w, out=out)  # handle dropped at once: waits
    moe.forward(x, ids, w)  # not BUSY
    assert np.array_equal(out.view(np.uint16), moe.forward(x, ids, w).view(np.uint16))


def test_submit_errors_queue_nothing(layer, rng):
    ctx, moe, gu, dn = layer
    x = rand_bf16(rng, (2, H))
    ids, w = routes(rng, 2, E, K)
    bad = ids.copy()
    bad[0, 0] = 99
    with pytest.raises(moejit.InvalidArgument):
        moe.submit(x, bad, w)
    moe.forward(x, ids, w)  # nothing was queued: not BUSY
    t = moe.submit(np.zeros((0, H), BF16), np.zeros((0, K), np.int32), np.zeros((0, K), np.float32))
    assert t.done and t.wait().shape == (0, H)
    moe.forward(x, ids, w)


def slow_layer():
    """A layer whose call takes a few hundred ms: the scalar tier, one thread, fp8."""
    e, h, i = 4, 1024, 1024
    ctx = moejit.Context(num_threads=1, max_isa="scalar")
    rng = np.random.default_rng(0)
    gu = rng.integers(0, 0x7E, size=(e, 2 * i, h), dtype=np.uint8)
    dn = rng.integers(0, 0x7E, size=(e, h, i), dtype=np.uint8)
    gs = np.full((e, 2 * i // 128, h // 128), 1e-3, np.float32)
    ds = np.full((e, h // 128, i // 128), 1e-3, np.float32)
    moe = moejit.MoE(ctx, format="fp8_block", gate_up=gu, down=dn, gate_up_scales=gs, down_scales=ds, top_k=4,
                     max_tokens=16)
    t = 8
    args = (rand_bf16(rng, (t, h)), np.tile(np.arange(4, dtype=np.int32), (t, 1)), np.ones((t, 4), np.float32))
    return moe, args


class Ticker:
    """Another Python thread: counts loop turns and the longest pause between two."""

    def __init__(self):
        self.stop = threading.Event()
        self.turns = 0
        self.max_gap = 0.0
        self.thread = threading.Thread(target=self.run)

    def run(self):
        last = time.perf_counter()
        while not self.stop.is_set():
            now = time.perf_counter()
            self.max_gap = max(self.max_gap, now - last)
            last = now
            self.turns += 1

    def __enter__(self):
        self.thread.start()
        while self.turns == 0:
            time.sleep(0.001)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def test_forward_releases_the_gil():
    moe, args = slow_layer()
    t0 = time.perf_counter()
    moe.forward(*args)
    alone = time.perf_counter() - t0
    assert alone > 0.1, f"the slow layer took only {alone:.3f} s"
    with Ticker() as tick:
        before = tick.turns
        tick.max_gap = 0.0
        t0 = time.perf_counter()
        moe.forward(*args)
        took = time.perf_counter() - t0
        during = tick.turns - before
        gap = tick.max_gap
    # Holding the GIL would freeze the other thread for the whole call.
    assert during > 1000, f"the other thread ran {during} turns during a {took:.3f} s forward"
    assert gap < 0.5 * took, f"the other thread paused {gap:.3f} s during a {took:.3f} s forward"


def test_submit_returns_and_wait_releases_the_gil():
    moe, args = slow_layer()
    t0 = time.perf_counter()
    moe.forward(*args)
    alone = time.perf_counter() - t0
    t0 = time.perf_counter()
    task = moe.submit(*args)
    submitted = time.perf_counter() - t0
    assert submitted < 0.5 * alone, f"submit took {submitted:.3f} s of a {alone:.3f} s call"
    with Ticker() as tick:
        before = tick.turns
        tick.max_gap = 0.0
        t0 = time.perf_counter()
        task.wait()
        waited = time.perf_counter() - t0
        during, gap = tick.turns - before, tick.max_gap
    if waited > 0.05:
        assert during > 100 and gap < 0.5 * waited + 0.02, (during, gap, waited)
    assert task.done
