"""Separate gate and up banks and a format per projection (moejit_moe_desc.gate, .up,
.up_format, .down_format): the same bits as the fused form, mixed formats against
the float64 reference, the bank rules checked before the C call, the C call's own
errors, zero copy and lifetimes."""

import gc
import weakref

import numpy as np
import pytest

import moejit
from conftest import host_tiers
from moejit_ref import (E2M1, KQUANTS, Bank, assert_close, make_bank, moe_kwargs, moe_reference, rand_bf16, routes,
                        separate_kwargs)

E, H, I, K, T = 6, 256, 128, 3, 4

FORMATS = ["bf16", "fp8_block", "mxfp8_e4m3", "q8_0", "q4_0"]
if E2M1 is not None:
    FORMATS += ["mxfp4", "nvfp4"]
FORMATS += [f for f in KQUANTS if f in moejit.formats()]


def addr(a):
    return a.__array_interface__["data"][0]


def split(gu: Bank, inter: int, fmt: str) -> tuple[Bank, Bank]:
    """The gate and up halves of a fused bank, as views of its memory."""
    def half(lo, hi, slo, shi):
        b = Bank.__new__(Bank)
        b.data = gu.data[:, lo:hi]
        b.scales = None if gu.scales is None else gu.scales[:, slo:shi]
        b.row_scales = None if gu.row_scales is None else gu.row_scales[:, lo:hi]
        b.deq = gu.deq[:, lo:hi]
        return b

    if fmt == "fp8_block":  # 128-row scale blocks: inter is a multiple of 128 here
        s = inter // 128
        return half(0, inter, 0, s), half(inter, 2 * inter, s, 2 * s)
    return half(0, inter, 0, inter), half(inter, 2 * inter, inter, 2 * inter)


@pytest.mark.parametrize("fmt", FORMATS)
def test_separate_banks_give_the_fused_bits(fmt, rng):
    inter = 256 if fmt in KQUANTS else I  # the K-quants' K (down's: intermediate) is a multiple of 256
    gu = make_bank(fmt, E, 2 * inter, H, rng)
    dn = make_bank(fmt, E, H, inter, rng)
    g, u = split(gu, inter, fmt)
    bias = rand_bf16(rng, (E, 2 * inter), 0.1)
    x = rand_bf16(rng, (T, H))
    ids, w = routes(rng, T, E, K)
    ids[1] = ids[0]
    tiers = host_tiers() if fmt in ("fp8_block", "q8_0") else [None]
    for tier in tiers:
        ctx = moejit.Context(num_threads=2, max_isa=tier)
        fused = moejit.MoE(ctx, format=fmt, top_k=K, output_dtype="f32", gate_up_bias=bias, **moe_kwargs(gu, dn))
        sep = moejit.MoE(ctx, format=fmt, top_k=K, output_dtype="f32", gate_bias=bias[:, :inter],
                         up_bias=bias[:, inter:], **separate_kwargs(g, u, dn))
        assert sep.separate_banks and not fused.separate_banks
        assert (sep.hidden, sep.intermediate, sep.num_experts) == (H, inter, E)
        y_f = fused.forward(x, ids, w)
        y_s = sep.forward(x, ids, w)
        assert np.array_equal(y_f.view(np.uint32), y_s.view(np.uint32)), f"{fmt} on {ctx.isa}"
        ref, bound = moe_reference(x, ids, w, gu.deq, dn.deq, gate_up_bias=bias.astype(np.float64))
        assert_close(y_s, ref, bound, False, f"{fmt} separate on {ctx.isa}")
        assert sep.stats()["weight_bytes_read"] == fused.stats()["weight_bytes_read"]
        # Read in place: the halves are the fused bank's rows.
        pf, ps = fused.bank_pointers(), sep.bank_pointers()
        assert sorted(ps) == ["down", "gate", "up"] and sorted(pf) == ["down", "gate_up"]
        row_bytes = gu.data[0, 0].nbytes
        for e in range(E):
            assert ps["gate"][e]["data"] == pf["gate_up"][e]["data"]
            assert ps["up"][e]["data"] == pf["gate_up"][e]["data"] + inter * row_bytes
            assert ps["gate"][e]["bias"] == addr(bias) + e * bias.strides[0]
            assert ps["up"][e]["bias"] == ps["gate"][e]["bias"] + inter * 2
            if gu.scales is not None:
                assert ps["gate"][e]["scales"] == pf["gate_up"][e]["scales"]


def mixed_case(ctx, rng, gate_fmt, down_fmt, *, up_fmt=None, inter=I, gate_opts=None, up_opts=None,
               down_opts=None, layer_kw=None, fused=False):
    gate_opts = gate_opts or {}
    if fused:
        gu = make_bank(gate_fmt, E, 2 * inter, H, rng, **gate_opts)
        g_deq = gu.deq
        kw = {"gate_up": gu.data}
        if gu.scales is not None:
            kw["gate_up_scales"] = gu.scales
    else:
        g = make_bank(gate_fmt, E, inter, H, rng, **gate_opts)
        u = make_bank(up_fmt or gate_fmt, E, inter, H, rng, **(up_opts or gate_opts))
        g_deq = np.concatenate([g.deq, u.deq], axis=1)
        kw = {"gate": g.data, "up": u.data}
        for name, b in (("gate", g), ("up", u)):
            if b.scales is not None:
                kw[f"{name}_scales"] = b.scales
            if b.row_scales is not None:
                kw[f"{name}_row_scales"] = b.row_scales
    dn = make_bank(down_fmt, E, H, inter, rng, **(down_opts or {}))
    if dn.scales is not None:
        kw["down_scales"] = dn.scales
    if dn.row_scales is not None:
        kw["down_row_scales"] = dn.row_scales
    moe = moejit.MoE(ctx, format=gate_fmt, down=dn.data, top_k=K, max_tokens=8, **kw, **(layer_kw or {}))
    x = rand_bf16(rng, (T, H))
    ids, w = routes(rng, T, E, K)
    y = moe.forward(x, ids, w)
    ref, bound = moe_reference(x, ids, w, g_deq, dn.deq)
    assert_close(y, ref, bound, True, f"{gate_fmt}/{up_fmt or gate_fmt}/{down_fmt} on {ctx.isa}")
    return moe, kw, dn


def test_fp8_block_gate_up_bf16_down(ctx, rng):
    moe, _, _ = mixed_case(ctx, rng, "fp8_block", "bf16", layer_kw={"down_format": "bf16"})
    assert moe.format == "fp8_block"
    assert moe.formats == {"gate": moejit.ProjFormat("fp8_block", "bf16", 0),
                           "up": moejit.ProjFormat("fp8_block", "bf16", 0),
                           "down": moejit.ProjFormat("bf16", "bf16", 0)}


@pytest.mark.skipif(E2M1 is None, reason="ml_dtypes has no float4_e2m1fn")
def test_q8_0_gate_up_mxfp4_down_every_tier(rng):
    for tier in host_tiers():
        c = moejit.Context(num_threads=2, max_isa=tier)
        moe, kw, dn = mixed_case(c, rng, "q8_0", "mxfp4", layer_kw={"down_format": ("mxfp4",)})
        assert moe.formats["down"].format == "mxfp4" and moe.formats["up"].format == "q8_0"
        # weight_bytes_read counts each projection in its own format.
        x = rand_bf16(rng, (1, H))
        before = moe.stats()["weight_bytes_read"]
        moe.forward(x, np.array([[0, 1, 2]], np.int32), np.ones((1, K), np.float32))
        per_expert = kw["gate"][0].nbytes + kw["up"][0].nbytes + dn.data[0].nbytes + dn.scales[0].nbytes
        assert moe.stats()["weight_bytes_read"] - before == 3 * per_expert


def test_three_formats_and_any_intermediate_for_bf16_down(ctx, rng):
    # q8_0 gate, q4_0 up, bf16 down: intermediate 40 is not a multiple of 32, which
    # only down's K would have to be.
    moe, _, _ = mixed_case(ctx, rng, "q8_0", "bf16", up_fmt="q4_0", inter=40,
                           layer_kw={"up_format": "q4_0", "down_format": "bf16"})
    assert moe.intermediate == 40
    assert [f.format for f in moe.formats.values()] == ["q8_0", "q4_0", "bf16"]


def test_per_projection_scale_dtypes_and_groups(ctx, rng):
    # gate fp8_block with bf16 scales, up fp8_block with f32 scales (the tuple form,
    # and inferred from the arrays), down mxfp8_e4m3 in groups of 64 (ProjFormat).
    for up_format in (("fp8_block", "f32"), ("fp8_block",), moejit.ProjFormat("fp8_block")):
        moe, _, _ = mixed_case(ctx, rng, "fp8_block", "mxfp8_e4m3", gate_opts={"scale_dtype": "bf16"},
                               up_opts={"scale_dtype": "f32"}, down_opts={"group": 64},
                               layer_kw={"up_format": up_format,
                                         "down_format": moejit.ProjFormat("mxfp8_e4m3", group_size=64)})
        assert moe.formats["gate"].scale_dtype == "bf16"
        assert moe.formats["up"].scale_dtype == "f32"
        assert moe.formats["down"] == moejit.ProjFormat("mxfp8_e4m3", "bf16", 64)


def test_fused_gate_up_with_its_own_down_format(ctx, rng):
    moe, _, _ = mixed_case(ctx, rng, "q8_0", "bf16", fused=True, layer_kw={"down_format": 0})
    assert moe.formats == {"gate_up": moejit.ProjFormat("q8_0", "bf16", 0),
                           "down": moejit.ProjFormat("bf16", "bf16", 0)}


@pytest.mark.skipif("q4_K" not in moejit.formats() or "q6_K" not in moejit.formats(),
                    reason="this libmoejit has no K-quants")
def test_q4_K_M_mix(rng):
    c = moejit.Context(num_threads=2)
    moe, _, _ = mixed_case(c, rng, "q4_K", "q6_K", inter=256, layer_kw={"down_format": "q6_K"})
    assert moe.formats["down"].format == "q6_K"


# ---- errors ----

def banks(rng, fmt="q8_0", inter=I):
    g = make_bank(fmt, E, inter, H, rng)
    u = make_bank(fmt, E, inter, H, rng)
    dn = make_bank(fmt, E, H, inter, rng)
    return g, u, dn


def err(exc, match, ctx, **kw):
    with pytest.raises(exc, match=match) as info:
        moejit.MoE(ctx, top_k=K, **kw)
    assert info.value.status == exc.status and info.value.message
    return info.value


def test_bank_form_errors(ctx, rng):
    g, u, dn = banks(rng)
    gu = np.concatenate([g.data, u.data], axis=1)
    base = {"format": "q8_0", "down": dn.data}
    IA = moejit.InvalidArgument
    err(IA, r"gate_up and gate and up are both given", ctx, **base, gate_up=gu, gate=g.data, up=u.data)
    err(IA, r"gate_up and up are both given", ctx, **base, gate_up=gu, up=u.data)
    err(IA, r"no gate and up weights: pass gate_up", ctx, **base)
    err(IA, r"up is missing but gate is given", ctx, **base, gate=g.data)
    err(IA, r"gate is missing but up is given", ctx, **base, up=u.data)
    err(IA, r"gate_up_bias is given but the layer has separate gate and up banks: pass gate_bias and up_bias",
        ctx, **base, gate=g.data, up=u.data, gate_up_bias=rand_bf16(rng, (E, 2 * I)))
    err(IA, r"up_scales is given but the layer has a fused gate_up bank: pass gate_up_scales", ctx, **base,
        gate_up=gu, up_scales=np.zeros((E, I, 8), np.uint8))
    err(IA, r"gate_up_interleaved=True needs the fused gate_up bank", ctx, **base, gate=g.data, up=u.data,
        gate_up_interleaved=True)
    err(IA, r"up_format needs separate gate and up banks", ctx, **base, gate_up=gu, up_format="q8_0")
    err(IA, r"up_format must be a format name or id, a \(format, scale_dtype, group_size\) tuple", ctx, **base,
        gate=g.data, up=u.data, up_format=3.5)
    err(IA, r"down_format must be a format name or id", ctx, **base, gate=g.data, up=u.data,
        down_format=("q8_0", None, 0, 1))
    err(IA, r"down_format.format = 'q9_9' is not a known format", ctx, **base, gate=g.data, up=u.data,
        down_format="q9_9")
    err(IA, r"up_format.scale_dtype = 'f64' is not bf16 or f32", ctx, **base, gate=g.data, up=u.data,
        up_format=("q8_0", "f64"))
    err(IA, r"up: 5 arrays, expected one per expert \(6\)", ctx, **base, gate=g.data, up=list(u.data[:5]))
    err(IA, r"up\[0\]: expected 128 rows \(intermediate = 128\)", ctx, **base, gate=g.data,
        up=make_bank("q8_0", E, I + 32, H, rng).data)
    # up in its own format: its rows are checked in that format.
    err(IA, r"up\[0\]: rows of 272 bytes .*q4_0 with K = 256 needs 144 bytes", ctx, **base, gate=g.data,
        up=u.data, up_format="q4_0")


def test_k_rules_per_projection(ctx, rng):
    g, u = make_bank("q8_0", E, 40, H, rng), make_bank("q8_0", E, 40, H, rng)
    dn = make_bank("bf16", E, H, 40, rng)
    IA = moejit.InvalidArgument
    err(IA, r"intermediate \(down's K\) = 40 must be a multiple of 32 for q8_0", ctx, format="bf16",
        gate=make_bank("bf16", E, 40, H, rng).data, up=make_bank("bf16", E, 40, H, rng).data,
        down=make_bank("q8_0", E, H, 64, rng).data, down_format="q8_0", intermediate=40)
    # q8_0 gate / up with a bf16 down: intermediate 40 is fine.
    moejit.MoE(ctx, format="q8_0", gate=g.data, up=u.data, down=dn.data, down_format="bf16", top_k=K)


def test_the_c_call_errors_are_raised_as_before(ctx, rng):
    # mxfp8 group 48 is the C library's to reject (the array checks accept its shapes).
    g, u, _ = banks(rng, inter=96)
    dn = make_bank("mxfp8_e4m3", E, H, 96, rng, group=48)
    e = err(moejit.InvalidArgument, r"moejit_moe_create: .*desc->down_format->group_size = 48", ctx, format="q8_0",
            gate=g.data, up=u.data, down=dn.data, down_scales=dn.scales, down_format=("mxfp8_e4m3", None, 48))
    assert e.status_name == "invalid_argument"
    # scale_dtype f32 is only for fp8_block.
    g, u, dn = banks(rng)
    err(moejit.InvalidArgument, r"moejit_moe_create: .*down_format->scale_dtype", ctx, format="q8_0", gate=g.data,
        up=u.data, down=make_bank("bf16", E, H, I, rng).data, down_format=("bf16", "f32"))
    # One scale row stride per projection's experts for mxfp8: different ones are Unsupported.
    g = make_bank("mxfp8_e4m3", E, I, H, rng)
    u = make_bank("mxfp8_e4m3", E, I, H, rng)
    u_pad = make_bank("mxfp8_e4m3", E, I, H, rng, pad=4)
    up_scales = [u.scales[0]] + [u_pad.scales[x] for x in range(1, E)]
    dn = make_bank("mxfp8_e4m3", E, H, I, rng)
    e = err(moejit.Unsupported, r"desc->up\[1\]\.scale_row_stride", ctx, format="mxfp8_e4m3", gate=g.data,
            gate_scales=g.scales, up=u.data, up_scales=up_scales, down=dn.data, down_scales=dn.scales)
    assert e.status == 2


@pytest.mark.skipif(E2M1 is None, reason="ml_dtypes has no float4_e2m1fn")
def test_ds_fp4_is_every_projection_or_none(ctx, rng):
    g, u, dn = (make_bank("ds_fp4", E, I, H, rng), make_bank("ds_fp4", E, I, H, rng),
                make_bank("mxfp4", E, H, I, rng))
    err(moejit.InvalidArgument, r"moejit_moe_create: .*ds_fp4", ctx, format="ds_fp4", down_format="mxfp4",
        **separate_kwargs(g, u, dn))


# ---- lifetimes ----

def test_separate_banks_are_kept_alive_and_released(rng):
    ctx = moejit.Context(num_threads=1)
    g, u, dn = (make_bank("fp8_block", E, I, H, rng), make_bank("fp8_block", E, I, H, rng),
                make_bank("bf16", E, H, I, rng))
    x = rand_bf16(rng, (2, H))
    ids, w = routes(rng, 2, E, K)
    ref, bound = moe_reference(x, ids, w, np.concatenate([g.deq, u.deq], axis=1), dn.deq)
    gate, up_scales = g.data.copy(), [s.copy() for s in u.scales]
    alive = [weakref.ref(gate)] + [weakref.ref(s) for s in up_scales]
    moe = moejit.MoE(ctx, format="fp8_block", gate=gate, gate_scales=g.scales, up=u.data, up_scales=up_scales,
                     down=dn.data, down_format="bf16", top_k=K)
    p = moe.bank_pointers()
    assert [m["data"] for m in p["gate"]] == [addr(gate) + e * gate.strides[0] for e in range(E)]
    assert [m["scales"] for m in p["up"]] == [addr(s) for s in up_scales]
    del gate, up_scales
    gc.collect()
    assert all(a() is not None for a in alive)
    assert_close(moe.forward(x, ids, w), ref, bound, True)
    moe.close()
    gc.collect()
    assert all(a() is None for a in alive)
    with pytest.raises(moejit.InvalidArgument, match="closed"):
        moe.bank_pointers()


def test_source_is_held(ctx, rng):
    g, u, dn = banks(rng)

    class Reader:
        pass

    r = Reader()
    alive = weakref.ref(r)
    moe = moejit.MoE(ctx, format="q8_0", gate=g.data, up=u.data, down=dn.data, top_k=K, source=r)
    del r
    gc.collect()
    assert moe.source is alive()
    assert alive() is not None
