"""Test helpers for the Python package: quantizers that write each format's bytes
with independent tools (ml_dtypes element casts, gguf-py's quantizers), the
dequantized values those bytes stand for, and a float64 MoE / linear reference
following docs/FORMATS.md (g rounded to bf16 as the library does), with an
error bound tied to sum |w x|.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
E5M2 = ml_dtypes.float8_e5m2
E2M1 = getattr(ml_dtypes, "float4_e2m1fn", None)
E8M0 = getattr(ml_dtypes, "float8_e8m0fnu", None)


def bf16(a) -> np.ndarray:
    """Round to bf16 (RNE) through float32."""
    return np.asarray(a, dtype=np.float32).astype(BF16)


def rand_bf16(rng, shape, scale=1.0) -> np.ndarray:
    return bf16(rng.standard_normal(shape) * scale)


class Quantized:
    """One [rows, K] matrix in a format: the arrays to pass and the values they encode."""

    def __init__(self, data, deq, scales=None, row_scales=None):
        self.data = data
        self.scales = scales
        self.row_scales = row_scales
        self.deq = deq  # float64 [rows, K]


def _expand(s: np.ndarray, rows: int, k: int, br: int, bc: int) -> np.ndarray:
    return np.repeat(np.repeat(s, br, axis=0), bc, axis=1)[:rows, :k]


def quantize(fmt: str, w: np.ndarray, *, scale_dtype: str = "bf16", group: int = 32, pad: int = 0) -> Quantized:
    """Encodes a float64 [rows, K] matrix. `pad` extra scale columns (poisoned with
    NaN / 0xFF) test the scale row stride."""
    rows, k = w.shape
    if fmt == "bf16":
        d = bf16(w)
        return Quantized(d, d.astype(np.float64))
    if fmt == "fp8_block":
        sr, sc = -(-rows // 128), -(-k // 128)
        amax = np.zeros((sr, sc))
        for i in range(sr):
            for j in range(sc):
                amax[i, j] = np.abs(w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]).max()
        s = np.where(amax > 0, amax / 448.0, 1.0)
        sdt = BF16 if scale_dtype == "bf16" else np.float32
        stored = s.astype(np.float32).astype(sdt)
        sv = stored.astype(np.float64)
        full = _expand(sv, rows, k, 128, 128)
        q = np.clip(w / full, -448, 448).astype(np.float32).astype(E4M3)
        scales = np.full((sr, sc + pad), np.nan, dtype=np.float32).astype(sdt)
        scales[:, :sc] = stored
        return Quantized(q, q.astype(np.float64) * full, scales)
    if fmt in ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp4", "ds_fp4"):
        elem, emax, top = {"mxfp8_e4m3": (E4M3, 8, 448.0), "mxfp8_e5m2": (E5M2, 15, 57344.0)}.get(
            fmt, (E2M1, 2, 6.0))
        g = group if fmt.startswith("mxfp8") else 32
        blocks = w.reshape(rows, k // g, g)
        amax = np.abs(blocks).max(axis=2)
        with np.errstate(divide="ignore"):
            code = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - emax + 127, 0)
        code = np.clip(code, 0, 254).astype(np.uint8)
        sv = np.exp2(code.astype(np.float64) - 127)
        full = np.repeat(sv, g, axis=1)
        q = np.clip(w / full, -top, top).astype(np.float32).astype(elem)
        deq = q.astype(np.float64) * full
        scales = np.full((rows, k // g + pad), 0xFF, dtype=np.uint8)
        scales[:, : k // g] = code
        if fmt in ("mxfp4", "ds_fp4"):
            return Quantized(pack_e2m1(q), deq, scales)
        return Quantized(q, deq, scales)
    if fmt == "nvfp4":
        amax_row = np.abs(w).max(axis=1)
        gl = np.maximum(amax_row / (6 * 448), 2.0 ** -126).astype(np.float32)
        blocks = np.abs(w.reshape(rows, k // 16, 16)).max(axis=2)
        s = (blocks / (6 * gl.astype(np.float64)[:, None])).astype(np.float32).astype(E4M3)
        sfull = np.repeat(s.astype(np.float64), 16, axis=1) * gl.astype(np.float64)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(sfull > 0, w / np.where(sfull > 0, sfull, 1), 0)
        q = np.clip(t, -6, 6).astype(np.float32).astype(E2M1)
        scales = np.full((rows, k // 16 + pad), 0xFF, dtype=np.uint8)
        scales[:, : k // 16] = s.view(np.uint8)
        return Quantized(pack_e2m1(q), q.astype(np.float64) * sfull, scales, gl)
    if fmt in ("q4_0", "q8_0"):
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize as gdeq
        from gguf.quants import quantize as gq

        t = GGMLQuantizationType.Q4_0 if fmt == "q4_0" else GGMLQuantizationType.Q8_0
        data = gq(w.astype(np.float32), t)
        return Quantized(data, gdeq(data, t).astype(np.float64).reshape(rows, k))
    raise ValueError(fmt)


def pack_e2m1(q: np.ndarray) -> np.ndarray:
    """[rows, K] float4_e2m1fn (one code per byte) -> [rows, K/2] uint8, even k in the low nibble."""
    codes = q.view(np.uint8) & 0xF
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def silu(x):
    return x / (1 + np.exp(-x))


def activation(kind: str, gate, up, alpha=1.702, limit=None):
    if kind == "silu":
        return silu(gate) * up
    if kind == "gelu":
        erf = np.vectorize(math.erf)
        return 0.5 * gate * (1 + erf(gate / math.sqrt(2))) * up
    if kind == "gelu_tanh":
        return 0.5 * gate * (1 + np.tanh(0.7978845608 * (gate + 0.044715 * gate ** 3))) * up
    if kind in ("swiglu_oai", "swiglu_clamp"):
        if limit:
            gate = np.minimum(gate, limit)
            up = np.clip(up, -limit, limit)
        out = gate / (1 + np.exp(-alpha * gate))
        return out * (up + 1) if kind == "swiglu_oai" else out * up
    raise ValueError(kind)


def moe_reference(x, ids, weights, gate_up, down, *, act="silu", interleaved=False, gate_up_bias=None,
                  down_bias=None, weight_on_input=False, alpha=1.702, limit=None):
    """float64 MoE per docs/FORMATS.md. gate_up / down: float64 [E, 2I, H] / [E, H, I]
    (dequantized); biases float64 [E, 2I] / [E, H] or None. Returns (y, bound): bound
    is sum over routes of |w| (|W_down| |g| + |b|), the scale of the error that g's
    bf16 rounding can make."""
    X = np.asarray(x).astype(np.float64)
    T = X.shape[0]
    H = down.shape[1]
    intermediate = down.shape[2]
    y = np.zeros((T, H))
    bound = np.zeros((T, H))
    for t in range(T):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e < 0:
                continue
            wt = float(weights[t, j])
            h = gate_up[e] @ X[t]
            if weight_on_input:
                h = wt * h
            if gate_up_bias is not None:
                h = h + gate_up_bias[e]
            if interleaved:
                gate, up = h[0::2], h[1::2]
            else:
                gate, up = h[:intermediate], h[intermediate:]
            g = bf16(activation(act, gate, up, alpha, limit)).astype(np.float64)
            c = down[e] @ g
            b = np.abs(down[e]) @ np.abs(g)
            if down_bias is not None:
                c = c + down_bias[e]
                b = b + np.abs(down_bias[e])
            scale = 1.0 if weight_on_input else wt
            y[t] += scale * c
            bound[t] += abs(scale) * b
    return y, bound


def assert_close(got, ref, bound, out_bf16: bool, what: str = "y", rel=2.0 ** -6):
    """|got - ref| <= rel * bound (+ half a bf16 ulp of ref when the output is bf16)."""
    g = np.asarray(got).astype(np.float64)
    tol = rel * bound + 1e-6 * np.abs(ref) + 1e-30
    if out_bf16:
        tol = tol + 2.0 ** -8 * np.abs(ref)
    err = np.abs(g - ref)
    bad = np.argwhere(~(err <= tol))
    if bad.size:
        i = tuple(bad[0])
        raise AssertionError(
            f"{what}: {len(bad)} of {err.size} elements off; first {i}: got {g[i]!r}, ref {ref[i]!r}, "
            f"tolerance {tol[i]!r}"
        )
    return float(err.max())


class Bank:
    """E quantized [rows, K] matrices, stacked: data [E, ...], scales [E, ...] or None,
    row_scales [E, rows] or None, deq float64 [E, rows, K]."""

    def __init__(self, mats: list[Quantized]):
        self.mats = mats
        self.data = np.stack([m.data for m in mats])
        self.scales = None if mats[0].scales is None else np.stack([m.scales for m in mats])
        self.row_scales = None if mats[0].row_scales is None else np.stack([m.row_scales for m in mats])
        self.deq = np.stack([m.deq for m in mats])


# GGUF K-quants: (gguf-py type name, super-block bytes, offset of d, offset of dmin or None,
# the largest |sub-block scale * code| the fields can make, to size d).
KQUANTS = {
    "q4_K": ("Q4_K", 144, 0, 2, 63 * 15),
    "q5_K": ("Q5_K", 176, 0, 2, 63 * 31),
    "q6_K": ("Q6_K", 210, 208, None, 128 * 32),
    "q2_K": ("Q2_K", 84, 80, 82, 15 * 3),
    "q3_K": ("Q3_K", 110, 108, None, 32 * 4),
}


def kquant_random(fmt: str, rows: int, k: int, rng, scale=0.05) -> Quantized:
    """A [rows, K] matrix of random valid K-quant super-blocks (every byte random,
    then finite fp16 d / dmin sized so that weights are about `scale`), and the
    weights gguf-py's ``gguf.quants.dequantize`` decodes from them. gguf-py has no
    K-quant quantizer, so the bytes, not a float matrix, are the ground truth."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gdeq

    tname, nbytes, d_off, m_off, top = KQUANTS[fmt]
    blocks = rows * (k // 256)
    data = rng.integers(0, 256, size=(blocks, nbytes), dtype=np.uint8)
    d = (scale * 3 / top * np.exp2(rng.uniform(-1, 1, blocks))).astype(np.float16)
    data[:, d_off:d_off + 2] = d.view(np.uint8).reshape(blocks, 2)
    if m_off is not None:
        dm = (scale * 3 / 63 / 8 * np.exp2(rng.uniform(-1, 1, blocks))).astype(np.float16)
        data[:, m_off:m_off + 2] = dm.view(np.uint8).reshape(blocks, 2)
    data = data.reshape(rows, k // 256 * nbytes)
    deq = gdeq(data, getattr(GGMLQuantizationType, tname)).astype(np.float64).reshape(rows, k)
    return Quantized(data, deq)


def make_bank(fmt: str, experts: int, rows: int, k: int, rng, scale=0.05, **opts) -> Bank:
    if fmt in KQUANTS:
        return Bank([kquant_random(fmt, rows, k, rng, scale) for _ in range(experts)])
    # Row magnitudes vary over a few binades so block scales differ between blocks.
    mats = []
    for _ in range(experts):
        w = rng.standard_normal((rows, k)) * scale * np.exp2(rng.integers(-2, 3, size=(rows, 1)))
        mats.append(quantize(fmt, w, **opts))
    return Bank(mats)


def separate_kwargs(g: Bank, u: Bank, dn: Bank) -> dict:
    """MoE keyword arguments for separate gate, up and down banks."""
    kw = {"gate": g.data, "up": u.data, "down": dn.data}
    for name, b in (("gate", g), ("up", u), ("down", dn)):
        if b.scales is not None:
            kw[f"{name}_scales"] = b.scales
        if b.row_scales is not None:
            kw[f"{name}_row_scales"] = b.row_scales
    return kw


def moe_kwargs(gu: Bank, dn: Bank, suffix_scales=True) -> dict:
    kw = {"gate_up": gu.data, "down": dn.data}
    if gu.scales is not None:
        kw["gate_up_scales"] = gu.scales
        kw["down_scales"] = dn.scales
    if gu.row_scales is not None:
        kw["gate_up_row_scales"] = gu.row_scales
        kw["down_row_scales"] = dn.row_scales
    return kw


def routes(rng, tokens: int, experts: int, top_k: int, skip: float = 0.0):
    """Distinct expert ids per token (some -1 with probability `skip`) and float32 weights."""
    ids = np.stack([rng.choice(experts, size=top_k, replace=False) for _ in range(tokens)]).astype(np.int32)
    if skip:
        ids[rng.random(ids.shape) < skip] = -1
    w = rng.uniform(0.1, 1.0, size=(tokens, top_k)).astype(np.float32)
    return ids, w


def ds_roundtrip(v: np.ndarray) -> np.ndarray:
    """ds_fp4's activation round trip of a bf16 vector (docs/FORMATS.md), per block of
    128: s = 2^ceil(log2(max(amax, 1e-4) / 448)), v' = bf16(e4m3_rne(v / s) * s)."""
    v = np.asarray(v).astype(np.float64)
    out = np.empty_like(v)
    for b0 in range(0, v.shape[-1], 128):
        blk = v[..., b0:b0 + 128]
        r = np.maximum(np.abs(blk).max(axis=-1, keepdims=True), 1e-4) / 448
        m, e = np.frexp(r)
        s = np.exp2(np.where(m == 0.5, e - 1, e).astype(np.float64))
        q = np.clip(blk / s, -448, 448).astype(np.float32).astype(E4M3).astype(np.float64)
        out[..., b0:b0 + 128] = bf16(q * s).astype(np.float64)
    return out
