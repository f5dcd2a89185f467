"""Every argument of MoE, Linear and their calls is checked, with a message naming
it, before anything runs; a failing call writes nothing to its output."""

import numpy as np
import pytest

import moejit
from moejit_ref import BF16, E4M3, make_bank, moe_kwargs, rand_bf16, routes

E, H, I, K = 4, 256, 128, 2
IA = moejit.InvalidArgument


@pytest.fixture(scope="module")
def c():
    return moejit.Context(num_threads=1)


@pytest.fixture(scope="module")
def fp8():
    rng = np.random.default_rng(7)
    return make_bank("fp8_block", E, 2 * I, H, rng), make_bank("fp8_block", E, H, I, rng)


@pytest.fixture(scope="module")
def moe(c, fp8):
    return moejit.MoE(c, format="fp8_block", top_k=K, max_tokens=4, **moe_kwargs(*fp8))


def fp8_kw(fp8, **over):
    kw = dict(format="fp8_block", top_k=K, **moe_kwargs(*fp8))
    kw.update(over)
    return {k: v for k, v in kw.items() if v is not None}


def test_inferred_geometry(c, moe):
    assert (moe.hidden, moe.intermediate, moe.num_experts, moe.top_k, moe.max_tokens) == (H, I, E, K, 4)
    assert (moe.format, moe.output_dtype, moe.scale_dtype, moe.activation) == ("fp8_block", "bf16", "bf16", "silu")
    assert "fp8_block" in repr(moe)
    assert moe.context is c and moe.isa == c.isa and not moe.closed


@pytest.mark.parametrize("over,cls,pattern", [
    ({"format": "fp9"}, IA, r"format = 'fp9' is not a known format \(bf16 = 0"),
    ({"format": 42}, IA, "not a known format id"),
    ({"format": True}, IA, "not a bool"),
    ({"activation": "relu"}, IA, "activation = 'relu' is not a known activation"),
    ({"output_dtype": "fp16"}, IA, "output_dtype = 'fp16' is not bf16 or f32"),
    ({"output_dtype": np.float16}, IA, "is not bf16 or f32"),
    ({"top_k": 0}, IA, r"moejit_moe_create: desc->top_k = 0 is out of range \[1, num_experts = 4\]"),
    ({"top_k": 5}, IA, "desc->top_k = 5 is out of range"),
    ({"top_k": "2"}, IA, "top_k must be an int"),
    ({"max_tokens": 0}, IA, "desc->max_tokens = 0 must be >= 1"),
    ({"swiglu_limit": -1.0}, IA, r"desc->swiglu_limit = -1 must be >= 0"),
    ({"swiglu_alpha": float("inf")}, IA, "desc->swiglu_alpha = inf must be finite"),
    ({"swiglu_alpha": "x"}, IA, "swiglu_alpha must be a number"),
    ({"gate_up_interleaved": 1}, IA, "gate_up_interleaved must be True or False"),
    ({"scale_dtype": "f32"}, IA, r"gate_up_scales\[0\]: dtype bfloat16 cannot hold fp8_block 128x128 block scales "
                                 r"\(expected float32\)"),
    ({"scale_dtype": "int8"}, IA, "scale_dtype = 'int8' is not bf16 or f32"),
    ({"hidden": 128}, IA, r"gate_up\[0\]: rows of 256 bytes .* needs 128 bytes per row"),
    ({"intermediate": 64}, IA, r"gate_up\[0\]: expected 128 rows \(2 \* intermediate = 128\)"),
    ({"num_experts": 3}, IA, r"gate_up: float8_e4m3fn \[4, 256, 256\] holds 4 experts, expected 3"),
    ({"gate_up_scales": None}, IA, r"gate_up_scales\[0\] is required: format fp8_block has block scales"),
    ({"gate_up_row_scales": np.ones((E, 2 * I), np.float32)}, IA, r"gate_up_row_scales\[0\]: only nvfp4"),
    ({"gate_up_bias": np.ones((E, 2 * I), np.float32)}, IA, r"gate_up_bias\[0\]: dtype float32 cannot hold a bf16 bias"),
    ({"down_bias": np.ones((E, 7), BF16)}, IA, r"down_bias\[0\]: expected shape \[256\]"),
])
def test_create_errors(c, fp8, over, cls, pattern):
    with pytest.raises(cls, match=pattern):
        moejit.MoE(c, **fp8_kw(fp8, **over))


def test_create_requires_a_context(fp8):
    with pytest.raises(IA, match="context must be a moejit.Context"):
        moejit.MoE(None, **fp8_kw(fp8))


def test_bank_errors(c, fp8):
    gu, dn = fp8
    # Wrong dtypes for the format.
    with pytest.raises(IA, match=r"gate_up\[0\]: dtype float32 cannot hold fp8_block weights"):
        moejit.MoE(c, **fp8_kw(fp8, gate_up=gu.data.astype(np.float32)))
    with pytest.raises(IA, match=r"gate_up\[0\]: dtype float8_e4m3fn cannot hold bf16 weights"):
        moejit.MoE(c, format="bf16", gate_up=gu.data, down=dn.data, top_k=K)
    # Rows not whole weights.
    with pytest.raises(IA, match="are not a whole number of q8_0 weights"):
        moejit.MoE(c, format="q8_0", gate_up=np.zeros((E, 2 * I, 33), np.uint8), down=np.zeros((E, H, 34), np.uint8),
                   top_k=K)
    # A K that breaks the format's rule.
    with pytest.raises(IA, match="hidden = 48 must be a multiple of 32 for mxfp4"):
        moejit.MoE(c, format="mxfp4", gate_up=np.zeros((E, 2 * I, 24), np.uint8), down=np.zeros((E, 48, I // 2), np.uint8),
                   gate_up_scales=np.zeros((E, 2 * I, 2), np.uint8), down_scales=np.zeros((E, 48, 4), np.uint8), top_k=K)
    # down's rows must be hidden.
    with pytest.raises(IA, match=r"down\[0\]: expected 256 rows \(hidden = 256\)"):
        moejit.MoE(c, **fp8_kw(fp8, down=dn.data[:, :128], down_scales=dn.scales[:, :1]))
    # Odd gate_up rows.
    with pytest.raises(IA, match="expected 2 \\* intermediate"):
        moejit.MoE(c, format="bf16", gate_up=np.zeros((E, 3, H), BF16), down=np.zeros((E, H, 1), BF16), top_k=K)
    # Banks of different lengths, as lists.
    with pytest.raises(IA, match=r"down: 3 arrays, expected one per expert \(4\)"):
        moejit.MoE(c, **fp8_kw(fp8, down=list(dn.data[:3])))
    with pytest.raises(IA, match="a stacked bank is \\[num_experts, ...\\]"):
        moejit.MoE(c, **fp8_kw(fp8, down=np.zeros(5, np.uint8)))
    # Not arrays at all.
    with pytest.raises(IA, match=r"gate_up\[1\] must be an array .* got str"):
        moejit.MoE(c, **fp8_kw(fp8, gate_up=[gu.data[0], "weights", gu.data[2], gu.data[3]]))
    with pytest.raises(IA, match="dtype object is not a numeric dtype"):
        moejit.MoE(c, **fp8_kw(fp8, gate_up=np.empty((E, 2 * I, H), object)))


def test_layout_errors(c, fp8):
    gu, dn = fp8
    # Weights must be C-contiguous per expert (moejit_matrix has no row stride).
    wide = np.zeros((E, 2 * I, 2 * H), np.uint8)[:, :, :H]
    with pytest.raises(IA, match=r"gate_up\[0\]: uint8 \[256, 256\] with strides \(512, 1\) bytes is not C-contiguous"):
        moejit.MoE(c, **fp8_kw(fp8, gate_up=wide))
    # The expert axis may have any stride: a bank sliced out of a bigger one is fine.
    big = np.zeros((2 * E, 2 * I, H), np.uint8)
    big[::2] = gu.data.view(np.uint8)
    moejit.MoE(c, **fp8_kw(fp8, gate_up=big[::2]))
    # Scales: shape, and contiguous elements within a row.
    with pytest.raises(IA, match=r"gate_up_scales\[0\]: expected shape \[2, 2\] \(or wider rows: padding\)"):
        moejit.MoE(c, **fp8_kw(fp8, gate_up_scales=gu.scales[:, :1]))
    strided = np.zeros((E, 2, 4), BF16)[:, :, ::2]
    with pytest.raises(IA, match="the elements of a scale row must be contiguous"):
        moejit.MoE(c, **fp8_kw(fp8, gate_up_scales=strided))
    with pytest.raises(IA, match=r"gate_up_scales\[0\]: format q8_0 has no separate scales"):
        q = np.zeros((E, 2 * I, H // 32 * 34), np.uint8)
        moejit.MoE(c, format="q8_0", gate_up=q, down=np.zeros((E, H, I // 32 * 34), np.uint8),
                   gate_up_scales=gu.scales, top_k=K)


def test_nvfp4_row_scales_required(c):
    gu = np.zeros((E, 2 * I, H // 2), np.uint8)
    dn = np.zeros((E, H, I // 2), np.uint8)
    kw = dict(format="nvfp4", gate_up=gu, down=dn, top_k=K, gate_up_scales=np.zeros((E, 2 * I, H // 16), np.uint8),
              down_scales=np.zeros((E, H, I // 16), np.uint8))
    with pytest.raises(IA, match=r"gate_up_row_scales\[0\] is required: nvfp4"):
        moejit.MoE(c, **kw)
    with pytest.raises(IA, match=r"gate_up_row_scales\[0\]: dtype float64 cannot hold fp32 per-row scales"):
        moejit.MoE(c, **kw, gate_up_row_scales=np.ones((E, 2 * I)), down_row_scales=np.ones((E, H), np.float32))
    moejit.MoE(c, **kw, gate_up_row_scales=np.ones((E, 2 * I), np.float32), down_row_scales=np.ones((E, H), np.float32))


def test_mixed_scale_strides_are_unsupported(c):
    # mxfp* kernels bake one scale row stride per projection: the C library says so.
    rng = np.random.default_rng(3)
    gu = make_bank("mxfp8_e4m3", E, 2 * I, H, rng)
    dn = make_bank("mxfp8_e4m3", E, H, I, rng)
    scales = [s for s in gu.scales]
    scales[2] = np.concatenate([scales[2], np.zeros((2 * I, 4), np.uint8)], axis=1)
    with pytest.raises(moejit.Unsupported, match=r"scale_row_stride = 12 differs from desc->gate_up\[0\]'s 8") as ei:
        moejit.MoE(c, format="mxfp8_e4m3", gate_up=gu.data, down=dn.data, gate_up_scales=scales,
                   down_scales=dn.scales, top_k=K)
    assert ei.value.status == 2


def inputs(rng, t=2):
    x = rand_bf16(rng, (t, H))
    ids, w = routes(rng, t, E, K)
    return x, ids, w


def test_forward_argument_errors(moe):
    rng = np.random.default_rng(1)
    x, ids, w = inputs(rng)
    cases = [
        ((x.astype(np.float32), ids, w), r"x: dtype float32 cannot hold the bf16 activations"),
        ((x.astype(np.float16), ids, w), r"x: dtype float16 cannot hold"),
        ((x[:, :128], ids, w), r"x: expected shape \[num_tokens, 256\] \(hidden = 256\), got bfloat16 \[2, 128\]"),
        ((x[0], ids, w), r"x: expected shape \[num_tokens, 256\]"),
        ((np.zeros((2, 2 * H), BF16)[:, ::2], ids, w), "x: .* is not C-contiguous"),
        ((x, ids.astype(np.int64), w), r"topk_ids: dtype int64 cannot hold int32 expert ids"),
        ((x, ids[:, :1], w), r"topk_ids: expected shape \[2, 2\]"),
        ((x, np.asfortranarray(np.zeros((2, 2), np.int32)), w), "topk_ids: .* is not C-contiguous"),
        ((x, ids, w.astype(np.float64)), r"topk_weights: dtype float64 cannot hold float32 router weights"),
        ((x, ids, w[:1]), r"topk_weights: expected shape \[2, 2\]"),
    ]
    for args, pattern in cases:
        with pytest.raises(IA, match=pattern):
            moe.forward(*args)
        with pytest.raises(IA, match=pattern):
            moe.submit(*args)


def test_output_errors_and_nothing_written(moe):
    rng = np.random.default_rng(2)
    x, ids, w = inputs(rng)
    poison = np.full((2, H), 0x7FC1, np.uint16)  # a NaN pattern the layer never writes
    for out, pattern in [
        (np.zeros((2, H), np.float32), r"out: dtype float32 cannot hold the output, dtype bf16"),
        (np.zeros((3, H), BF16), r"out: expected shape \[2, 256\]"),
        (np.zeros((2, 2 * H), BF16)[:, ::2], "out: .* is not C-contiguous"),
    ]:
        with pytest.raises(IA, match=pattern):
            moe.forward(x, ids, w, out=out)
    ro = poison.copy()
    ro.flags.writeable = False
    with pytest.raises(IA, match="out: the array is read-only"):
        moe.forward(x, ids, w, out=ro)
    with pytest.raises(IA, match="out overlaps x"):
        moe.forward(x, ids, w, out=x)
    # The C library's own checks: route ids and token count. Nothing written.
    out = poison.copy()
    bad = ids.copy()
    bad[1, 1] = E
    with pytest.raises(IA, match=r"moejit_moe_forward: topk_ids\[1\]\[1\] = 4 is out of range \[0, 4\)"):
        moe.forward(x, bad, w, out=out)
    assert np.array_equal(out, poison)
    with pytest.raises(IA, match=r"moejit_moe_submit: topk_ids\[1\]\[1\] = 4"):
        moe.submit(x, bad, w, out=out)
    assert np.array_equal(out, poison)
    x5, ids5, w5 = inputs(rng, 5)
    out5 = np.full((5, H), 0x7FC1, np.uint16)
    with pytest.raises(IA, match=r"num_tokens = 5 is out of range \[0, max_tokens = 4\]"):
        moe.forward(x5, ids5, w5, out=out5)
    assert np.all(out5 == 0x7FC1)
    # uint16 bits are a bf16 output too, written in place and returned as given.
    assert moe.forward(x, ids, w, out=out) is out
    assert not np.array_equal(out, poison)


def test_closed_layer(c, fp8):
    m = moejit.MoE(c, **fp8_kw(fp8))
    with m:
        assert not m.closed
    assert m.closed
    x, ids, w = inputs(np.random.default_rng(0))
    for call in (lambda: m.forward(x, ids, w), lambda: m.submit(x, ids, w), m.stats, m.bank_pointers):
        with pytest.raises(IA, match="MoE is closed"):
            call()
    m.close()  # twice is fine


def test_linear_errors(c):
    rng = np.random.default_rng(5)
    q = make_bank("fp8_block", 1, 64, 256, rng).mats[0]
    with pytest.raises(IA, match="context must be a moejit.Context"):
        moejit.Linear("ctx", format="fp8_block", weight=q.data, scales=q.scales)
    with pytest.raises(IA, match=r"scales is required"):
        moejit.Linear(c, format="fp8_block", weight=q.data)
    with pytest.raises(IA, match=r"weight: expected 32 rows \(rows = 32\)"):
        moejit.Linear(c, format="fp8_block", weight=q.data, scales=q.scales, rows=32)
    with pytest.raises(IA, match=r"desc->max_tokens = 0 must be >= 1"):
        moejit.Linear(c, format="fp8_block", weight=q.data, scales=q.scales, max_tokens=0)
    with pytest.raises(IA, match=r"cols = 100 must be a multiple of 32 for q8_0"):
        moejit.Linear(c, format="q8_0", weight=np.zeros((4, 34 * 3), np.uint8), cols=100)
    lin = moejit.Linear(c, format="fp8_block", weight=q.data, scales=q.scales, max_tokens=2, output_dtype="f32")
    assert lin.output_dtype == "f32" and lin.max_tokens == 2 and lin.format == "fp8_block" and "Linear" in repr(lin)
    assert lin.context is c and not lin.closed
    x = rand_bf16(rng, (2, 256))
    with pytest.raises(IA, match=r"x: expected shape \[num_tokens, 256\] \(cols = 256\)"):
        lin.forward(x[:, :128])
    with pytest.raises(IA, match="out: dtype bfloat16 cannot hold the output, dtype f32"):
        lin.forward(x, out=np.zeros((2, 64), BF16))
    out = np.full((3, 64), np.nan, np.float32)
    with pytest.raises(IA, match=r"moejit_linear_forward: num_tokens = 3 is out of range \[0, max_tokens = 2\]"):
        lin.forward(rand_bf16(rng, (3, 256)), out=out)
    assert np.all(np.isnan(out))
    with lin:
        pass
    with pytest.raises(IA, match="Linear is closed"):
        lin.forward(x)
    with pytest.raises(IA, match="Linear is closed"):
        lin.weight_pointers()


def test_unknown_layout_is_unsupported(monkeypatch, c):
    # A format id the library knows but this package's layout table does not (a newer
    # libmoejit): refused, never passed through unchecked.
    from moejit import _api

    monkeypatch.setattr(_api, "layout", lambda name, group=0: None)
    with pytest.raises(moejit.Unsupported, match="known to libmoejit .* but not to this moejit package"):
        moejit.Linear(c, format="bf16", weight=np.zeros((4, 64), BF16))


def test_fp8_weights_as_e4m3_dtype(c, fp8):
    gu, dn = fp8
    assert gu.data.dtype == E4M3
    m = moejit.MoE(c, **fp8_kw(fp8, gate_up=gu.data.view(np.uint8), down=dn.data.view(np.int8)))
    x, ids, w = inputs(np.random.default_rng(4))
    ref = moejit.MoE(c, **fp8_kw(fp8)).forward(x, ids, w)
    assert np.array_equal(m.forward(x, ids, w).view(np.uint16), ref.view(np.uint16))
