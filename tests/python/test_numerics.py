"""MoE and Linear outputs against a float64 reference, for every format whose bytes
an independent tool can write (ml_dtypes element casts, gguf-py's quantizers), on
every tier this CPU has, with the layout options of the descriptor."""

import numpy as np
import pytest

import moejit
from conftest import host_tiers
from moejit_ref import (BF16, E2M1, E8M0, assert_close, bf16, ds_roundtrip, make_bank, moe_kwargs, moe_reference,
                        rand_bf16, routes)

E, H, I, K, T = 6, 256, 128, 3, 4

FORMATS = ["bf16", "fp8_block", "mxfp8_e4m3", "mxfp8_e5m2", "q8_0", "q4_0"]
if E2M1 is not None:
    FORMATS += ["mxfp4", "nvfp4"]


def run_moe(ctx, fmt, rng, *, hidden=H, inter=I, out_dtype="bf16", opts=None, layer_kw=None, skip=0.0, tokens=T,
            bias=False):
    opts = opts or {}
    gu = make_bank(fmt, E, 2 * inter, hidden, rng, **opts)
    dn = make_bank(fmt, E, hidden, inter, rng, **opts)
    kw = moe_kwargs(gu, dn)
    gub = dnb = None
    if bias:
        kw["gate_up_bias"] = rand_bf16(rng, (E, 2 * inter), 0.1)
        kw["down_bias"] = rand_bf16(rng, (E, hidden), 0.1)
        gub = kw["gate_up_bias"].astype(np.float64)
        dnb = kw["down_bias"].astype(np.float64)
    layer_kw = dict(layer_kw or {})
    if "group" in opts:
        layer_kw["group_size"] = opts["group"]
    moe = moejit.MoE(ctx, format=fmt, top_k=K, max_tokens=16, output_dtype=out_dtype, **kw, **layer_kw)
    x = rand_bf16(rng, (tokens, hidden))
    ids, w = routes(rng, tokens, E, K, skip)
    y = moe.forward(x, ids, w)
    ref, bound = moe_reference(
        x, ids, w, gu.deq, dn.deq, act=layer_kw.get("activation", "silu"),
        interleaved=layer_kw.get("gate_up_interleaved", False), gate_up_bias=gub, down_bias=dnb,
        weight_on_input=layer_kw.get("router_weight_on_input", False),
        alpha=layer_kw.get("swiglu_alpha") or 1.702, limit=layer_kw.get("swiglu_limit"))
    assert y.dtype == (BF16 if out_dtype == "bf16" else np.float32)
    assert y.shape == (tokens, hidden)
    assert_close(y, ref, bound, out_dtype == "bf16", f"{fmt} on {ctx.isa}")
    return moe, y, (x, ids, w)


@pytest.mark.parametrize("fmt", FORMATS)
def test_moe_formats_every_tier(fmt, rng):
    for tier in host_tiers():
        ctx = moejit.Context(num_threads=2, max_isa=tier)
        assert ctx.isa == tier  # the tier really run, never a silent downgrade
        moe, y, _ = run_moe(ctx, fmt, rng)
        assert moe.isa == tier


@pytest.mark.parametrize("scale_dtype", ["bf16", "f32"])
@pytest.mark.parametrize("hidden,inter", [(256, 128), (300, 200), (129, 64)])
def test_fp8_block_shapes_scales_and_padding(ctx, rng, scale_dtype, hidden, inter):
    # Partial 128-blocks in both directions, scale rows padded with NaN poison.
    moe, _, _ = run_moe(ctx, "fp8_block", rng, hidden=hidden, inter=inter,
                        opts={"scale_dtype": scale_dtype, "pad": 3}, out_dtype="f32")
    assert moe.scale_dtype == scale_dtype
    ptrs = moe.bank_pointers()
    assert ptrs["gate_up"][0]["scale_row_stride"] == -(-hidden // 128) + 3
    assert ptrs["down"][0]["scale_row_stride"] == -(-inter // 128) + 3


def test_fp8_block_scale_column_slice(ctx, rng):
    # The scale matrix as a column slice of a wider tensor: its row stride comes from the strides.
    gu = make_bank("fp8_block", E, 2 * I, H, rng, pad=5)
    dn = make_bank("fp8_block", E, H, I, rng, pad=5)
    sc_gu = gu.scales[:, :, : H // 128]
    sc_dn = dn.scales[:, :, : I // 128]
    assert not sc_gu.flags.c_contiguous
    moe = moejit.MoE(ctx, format="fp8_block", gate_up=gu.data, down=dn.data, gate_up_scales=sc_gu,
                     down_scales=sc_dn, top_k=K)
    assert moe.bank_pointers()["gate_up"][1]["scale_row_stride"] == H // 128 + 5
    x = rand_bf16(rng, (T, H))
    ids, w = routes(rng, T, E, K)
    ref, bound = moe_reference(x, ids, w, gu.deq, dn.deq)
    assert_close(moe.forward(x, ids, w), ref, bound, True)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_mxfp8_groups(ctx, rng, group):
    run_moe(ctx, "mxfp8_e4m3", rng, opts={"group": group, "pad": 2})


@pytest.mark.skipif(E8M0 is None, reason="ml_dtypes has no float8_e8m0fnu")
def test_mx_scales_as_e8m0_dtype(ctx, rng):
    gu = make_bank("mxfp8_e4m3", E, 2 * I, H, rng)
    dn = make_bank("mxfp8_e4m3", E, H, I, rng)
    moe = moejit.MoE(ctx, format="mxfp8_e4m3", gate_up=gu.data, down=dn.data, top_k=K,
                     gate_up_scales=gu.scales.view(E8M0), down_scales=dn.scales.view(E8M0))
    x = rand_bf16(rng, (T, H))
    ids, w = routes(rng, T, E, K)
    ref, bound = moe_reference(x, ids, w, gu.deq, dn.deq)
    assert_close(moe.forward(x, ids, w), ref, bound, True)


@pytest.mark.parametrize("act,extra", [("silu", {}), ("gelu", {}), ("gelu_tanh", {}),
                                       ("swiglu_oai", {"swiglu_alpha": 1.702, "swiglu_limit": 0.05}),
                                       ("swiglu_clamp", {"swiglu_limit": 0.05}), ("swiglu_oai", {})])
def test_activations(ctx, rng, act, extra):
    moe, _, _ = run_moe(ctx, "bf16", rng, layer_kw={"activation": act, **extra})
    assert moe.activation == act


def test_interleaved_bias_weight_on_input(ctx, rng):
    run_moe(ctx, "mxfp8_e4m3", rng, bias=True,
            layer_kw={"gate_up_interleaved": True, "router_weight_on_input": True, "activation": "swiglu_oai"})
    run_moe(ctx, "bf16", rng, bias=True, out_dtype="f32")


def test_skipped_routes_and_empty_tokens(ctx, rng):
    moe, _, _ = run_moe(ctx, "bf16", rng, skip=0.5)
    # Every route of a token skipped: exactly +0.0.
    x = rand_bf16(rng, (2, H))
    ids = np.full((2, K), -1, np.int32)
    y = moe.forward(x, ids, np.ones((2, K), np.float32))
    assert np.all(y.view(np.uint16) == 0)
    # num_tokens = 0 is a successful no-op.
    y0 = moe.forward(np.zeros((0, H), BF16), np.zeros((0, K), np.int32), np.zeros((0, K), np.float32))
    assert y0.shape == (0, H)


def test_bits_independent_of_threads_dedup_and_bank_form(rng):
    gu = make_bank("fp8_block", E, 2 * I, H, rng)
    dn = make_bank("fp8_block", E, H, I, rng)
    x = rand_bf16(rng, (8, H))
    ids, w = routes(rng, 8, E, K)
    ids[1] = ids[0]  # shared experts: dedup has work to merge
    outs = []
    for threads, dedup, listed in [(1, True, False), (2, True, False), (2, False, False), (2, True, True)]:
        c = moejit.Context(num_threads=threads, dedup=dedup)
        kw = moe_kwargs(gu, dn)
        if listed:
            kw = {k: list(v) for k, v in kw.items()}
        moe = moejit.MoE(c, format="fp8_block", top_k=K, output_dtype="f32", **kw)
        outs.append(moe.forward(x, ids, w))
        st = moe.stats()
        assert st["calls"] == 1 and st["routes"] == 8 * K
        expert_bytes = (gu.data[0].nbytes + gu.scales[0].nbytes + dn.data[0].nbytes + dn.scales[0].nbytes)
        distinct = len(set(ids.reshape(-1).tolist()))
        if dedup:
            assert st["unique_experts"] == distinct
            assert st["weight_bytes_read"] == distinct * expert_bytes
        else:
            assert st["weight_bytes_read"] == 8 * K * expert_bytes
    for o in outs[1:]:
        assert np.array_equal(o.view(np.uint32), outs[0].view(np.uint32))


def test_batch_invariance(ctx, rng):
    # A token's output does not depend on the other tokens of its call.
    moe, y, (x, ids, w) = run_moe(ctx, "q8_0", rng)
    for t in range(T):
        yt = moe.forward(x[t:t + 1], ids[t:t + 1], w[t:t + 1])
        assert np.array_equal(yt.view(np.uint16), y[t:t + 1].view(np.uint16))


@pytest.mark.parametrize("fmt", FORMATS)
def test_linear_formats(ctx, rng, fmt):
    rows, cols = 96, 256
    q = make_bank(fmt, 1, rows, cols, rng).mats[0]
    bias = rand_bf16(rng, (rows,), 0.1)
    lin = moejit.Linear(ctx, format=fmt, weight=q.data, scales=q.scales, row_scales=q.row_scales, bias=bias,
                        output_dtype="f32")
    assert (lin.rows, lin.cols) == (rows, cols)
    x = rand_bf16(rng, (5, cols))
    y = lin.forward(x)
    X = x.astype(np.float64)
    ref = X @ q.deq.T + bias.astype(np.float64)
    bound = np.abs(X) @ np.abs(q.deq).T + np.abs(bias.astype(np.float64))
    assert_close(y, ref, bound, False, f"linear {fmt}", rel=2.0 ** -20)


def test_linear_every_tier(rng):
    rows, cols = 64, 300
    q = make_bank("fp8_block", 1, rows, cols, rng, scale_dtype="f32").mats[0]
    x = rand_bf16(rng, (3, cols))
    ref = x.astype(np.float64) @ q.deq.T
    bound = np.abs(x.astype(np.float64)) @ np.abs(q.deq).T
    for tier in host_tiers():
        c = moejit.Context(num_threads=1, max_isa=tier)
        lin = moejit.Linear(c, format="fp8_block", weight=q.data, scales=q.scales)
        assert c.isa == tier
        assert_close(lin.forward(x), ref, bound, True, f"linear fp8_block {tier}", rel=2.0 ** -20)


def test_bf16_output_is_rounded_f32_output(ctx, rng):
    gu = make_bank("bf16", E, 2 * I, H, rng)
    dn = make_bank("bf16", E, H, I, rng)
    x = rand_bf16(rng, (T, H))
    ids, w = routes(rng, T, E, K)
    y32 = moejit.MoE(ctx, format="bf16", top_k=K, output_dtype="f32", **moe_kwargs(gu, dn)).forward(x, ids, w)
    y16 = moejit.MoE(ctx, format="bf16", top_k=K, output_dtype="bf16", **moe_kwargs(gu, dn)).forward(x, ids, w)
    assert np.array_equal(bf16(y32).view(np.uint16), y16.view(np.uint16))


@pytest.mark.skipif(E2M1 is None, reason="ml_dtypes has no float4_e2m1fn")
def test_ds_fp4_linear_rounds_its_input(ctx, rng):
    # ds_fp4 = mxfp4 bytes + DeepSeek numerics: a linear layer round-trips x through
    # e4m3 per 128 (a 2880-wide row ends in a 64-element block) and nothing else.
    rows, cols = 64, 2880
    q = make_bank("ds_fp4", 1, rows, cols, rng).mats[0]
    x = rand_bf16(rng, (3, cols))
    y = moejit.Linear(ctx, format="ds_fp4", weight=q.data, scales=q.scales, output_dtype="f32").forward(x)
    xr = ds_roundtrip(x)
    assert not np.array_equal(xr, x.astype(np.float64))  # the round trip changes x
    ref = xr @ q.deq.T
    assert_close(y, ref, np.abs(xr) @ np.abs(q.deq).T, False, "ds_fp4 linear", rel=2.0 ** -20)
    # The same bytes as mxfp4 do not round x: a different result.
    y_mx = moejit.Linear(ctx, format="mxfp4", weight=q.data, scales=q.scales, output_dtype="f32").forward(x)
    assert_close(y_mx, x.astype(np.float64) @ q.deq.T, np.abs(x.astype(np.float64)) @ np.abs(q.deq).T, False,
                 "mxfp4 linear", rel=2.0 ** -20)
    assert not np.array_equal(y, y_mx)
