"""Nothing is copied: the C layer reads the caller's memory (the addresses it was
given are the arrays' own), and every layer keeps that memory alive."""

import gc
import mmap
import weakref

import numpy as np
import pytest

import moejit
from moejit_ref import BF16, assert_close, make_bank, moe_kwargs, moe_reference, rand_bf16, routes

E, H, I, K = 4, 256, 128, 2


def addr(a):
    return a.__array_interface__["data"][0]


class DLPackOnly:
    """An array that offers only __dlpack__ (no buffer protocol, not a numpy subclass)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def expected_pointers(bank, e):
    return addr(bank.data) + e * bank.data.strides[0], addr(bank.scales) + e * bank.scales.strides[0]


def test_stacked_banks_are_read_in_place(rng):
    ctx = moejit.Context(num_threads=1)
    gu = make_bank("fp8_block", E, 2 * I, H, rng)
    dn = make_bank("fp8_block", E, H, I, rng)
    bias = rand_bf16(rng, (E, H), 0.1)
    moe = moejit.MoE(ctx, format="fp8_block", top_k=K, down_bias=bias, **moe_kwargs(gu, dn))
    p = moe.bank_pointers()
    for e in range(E):
        assert (p["gate_up"][e]["data"], p["gate_up"][e]["scales"]) == expected_pointers(gu, e)
        assert (p["down"][e]["data"], p["down"][e]["scales"]) == expected_pointers(dn, e)
        assert p["down"][e]["bias"] == addr(bias) + e * bias.strides[0]
        assert p["gate_up"][e]["bias"] == 0 and p["gate_up"][e]["row_scales"] == 0


def test_list_banks_are_read_in_place(rng):
    ctx = moejit.Context(num_threads=1)
    gu = [rand_bf16(rng, (2 * I, H), 0.05) for _ in range(E)]
    dn = [rand_bf16(rng, (H, I), 0.05) for _ in range(E)]
    moe = moejit.MoE(ctx, format="bf16", gate_up=gu, down=tuple(dn), top_k=K)
    p = moe.bank_pointers()
    assert [m["data"] for m in p["gate_up"]] == [addr(a) for a in gu]
    assert [m["data"] for m in p["down"]] == [addr(a) for a in dn]


def test_memmap_dlpack_and_buffer_protocol(tmp_path, rng):
    ctx = moejit.Context(num_threads=1)
    gu = make_bank("bf16", E, 2 * I, H, rng)
    dn = make_bank("bf16", E, H, I, rng)
    # gate_up from a read-only memory-mapped file (as checkpoint loaders map them).
    path = tmp_path / "gate_up.bin"
    gu.data.view(np.uint16).tofile(path)
    mm = np.memmap(path, dtype=np.uint16, mode="r", shape=gu.data.shape)
    # down through DLPack only, one expert through the buffer protocol (a mmap object).
    down = [DLPackOnly(dn.data[e].view(np.uint16)) for e in range(E)]
    raw = mmap.mmap(-1, dn.data[3].nbytes)
    raw[:] = dn.data[3].tobytes()
    buf = np.frombuffer(raw, dtype=np.uint16).reshape(H, I)  # numpy view, for the address
    down[3] = memoryview(raw).cast("H", (H, I))
    moe = moejit.MoE(ctx, format="bf16", gate_up=mm, down=down, top_k=K)
    p = moe.bank_pointers()
    assert p["gate_up"][2]["data"] == addr(mm) + 2 * mm.strides[0]
    assert p["down"][1]["data"] == addr(dn.data[1])
    assert p["down"][3]["data"] == addr(buf)
    x = rand_bf16(rng, (3, H))
    ids, w = routes(rng, 3, E, K)
    ref, bound = moe_reference(x, ids, w, gu.deq, dn.deq)
    assert_close(moe.forward(x, ids, w), ref, bound, True)
    # The memoryview's export pins the mmap while the layer holds it.
    with pytest.raises(BufferError):
        raw.close()
    moe.close()
    del down, buf
    gc.collect()
    raw.close()


def test_layers_keep_their_arrays_alive(rng):
    ctx = moejit.Context(num_threads=1)
    gu = make_bank("fp8_block", E, 2 * I, H, rng)
    dn = make_bank("fp8_block", E, H, I, rng)
    x = rand_bf16(rng, (2, H))
    ids, w = routes(rng, 2, E, K)
    ref, bound = moe_reference(x, ids, w, gu.deq, dn.deq)
    data = gu.data.copy()
    alive = weakref.ref(data)
    moe = moejit.MoE(ctx, format="fp8_block", top_k=K, **{**moe_kwargs(gu, dn), "gate_up": data})
    del data
    gc.collect()
    assert alive() is not None  # held by the layer, not copied
    assert_close(moe.forward(x, ids, w), ref, bound, True)
    moe.close()
    gc.collect()
    assert alive() is None  # released by close()

    data = gu.data.copy()
    alive = weakref.ref(data)
    moe = moejit.MoE(ctx, format="fp8_block", top_k=K, **{**moe_kwargs(gu, dn), "gate_up": data})
    del data, moe
    gc.collect()
    assert alive() is None  # released with the layer


def test_context_outlives_python_reference(rng):
    # A layer holds its context: dropping the user's reference keeps it working.
    gu = make_bank("bf16", E, 2 * I, H, rng)
    dn = make_bank("bf16", E, H, I, rng)
    moe = moejit.MoE(moejit.Context(num_threads=1), format="bf16", top_k=K, **moe_kwargs(gu, dn))
    gc.collect()
    x = rand_bf16(rng, (1, H))
    ids, w = routes(rng, 1, E, K)
    ref, bound = moe_reference(x, ids, w, gu.deq, dn.deq)
    assert_close(moe.forward(x, ids, w), ref, bound, True)


def test_forward_writes_out_in_place_and_reads_x_in_place(rng):
    ctx = moejit.Context(num_threads=1)
    gu = make_bank("bf16", E, 2 * I, H, rng)
    dn = make_bank("bf16", E, H, I, rng)
    moe = moejit.MoE(ctx, format="bf16", top_k=K, output_dtype="f32", **moe_kwargs(gu, dn))
    x = rand_bf16(rng, (2, H))
    ids, w = routes(rng, 2, E, K)
    out = np.zeros((2, H), np.float32)
    assert moe.forward(DLPackOnly(x.view(np.uint16)), DLPackOnly(ids), DLPackOnly(w), out=out) is out
    ref, bound = moe_reference(x, ids, w, gu.deq, dn.deq)
    assert_close(out, ref, bound, False)


def test_linear_weight_in_place(rng):
    ctx = moejit.Context(num_threads=1)
    q = make_bank("q8_0", 1, 64, 256, rng).mats[0]
    lin = moejit.Linear(ctx, format="q8_0", weight=q.data)
    assert lin.weight_pointers()["data"] == addr(q.data)
    assert lin.weight_pointers()["scales"] == 0
