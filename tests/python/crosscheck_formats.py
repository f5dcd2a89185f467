#!/usr/bin/env python3
"""Cross-checks moejit's formats/ against independent PyPI references.

formats_probe (tests/formats_probe.cpp) prints our decoders' value of every
code and runs our element encoders and quantizers on inputs made here; this
script compares them with:

  * ml_dtypes: every e4m3 (float8_e4m3fn), e5m2, e2m1 (float4_e2m1fn), e8m0
    (float8_e8m0fnu) and bf16 code; our RNE encoders against ``astype`` on
    random values, every representable value, every midpoint and its fp32
    neighbours; numpy's float16 for fp16 likewise.
  * gguf (gguf-py): our q4_0 / q8_0 quantizer bytes against
    ``gguf.quants.quantize`` and our q4_0 / q8_0 decoders against
    ``gguf.quants.dequantize`` (on our bytes and on random bytes).
  * a numpy re-implementation of the documented rules (docs/FORMATS.md
    "Quantizers") for bf16, fp8_block, mxfp8, mxfp4 / ds_fp4 and nvfp4, whose
    element rounding is a nearest-value search in ml_dtypes' value tables
    (checked against ml_dtypes ``astype`` where the quotient is exact in fp32).

Known, documented differences are asserted as such, not skipped silently:
e4m3 codes 0x7F / 0xFF decode to +-480 in formats.md (NaN in e4m3fn), and our
e4m3 encoder saturates to +-448 where ml_dtypes gives NaN (|x| > 464).

Usage: crosscheck_formats.py --probe PATH/TO/formats_probe
Exit status 0 when everything agrees; prints counts of what was compared.
"""

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import warnings

try:
    import numpy as np
    import ml_dtypes
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize as gguf_quantize, dequantize as gguf_dequantize
except ImportError as e:  # pragma: no cover
    print(f"crosscheck_formats: missing Python package ({e}); `make pyenv` (run by `make build` / `make test`) creates build/pyenv with "
          "numpy, ml_dtypes and gguf", file=sys.stderr)
    sys.exit(1)


class Checker:
    def __init__(self):
        self.counts = {}
        self.failures = []

    def compare(self, name, ours, ref, what=None, nan_equal=False):
        """Element-wise exact comparison; ours/ref are arrays of the same shape."""
        ours = np.asarray(ours)
        ref = np.asarray(ref)
        assert ours.shape == ref.shape, (name, ours.shape, ref.shape)
        if nan_equal:
            with np.errstate(invalid="ignore"):
                both_nan = np.isnan(ours.astype(np.float64)) & np.isnan(ref.astype(np.float64))
            if ours.dtype.kind == "f":
                same = (ours.view(np.dtype(f"u{ours.itemsize}")) == ref.view(np.dtype(f"u{ref.itemsize}"))) | both_nan
            else:
                same = (ours == ref) | both_nan
        else:
            same = ours == ref
        n = int(same.size)
        self.counts[name] = self.counts.get(name, 0) + n
        bad = np.flatnonzero(~same.reshape(-1))
        if bad.size:
            ex = []
            for i in bad[:5]:
                w = "" if what is None else f" input {np.asarray(what).reshape(-1)[i]!r}"
                ex.append(f"[{i}]{w}: ours {ours.reshape(-1)[i]!r} ref {ref.reshape(-1)[i]!r}")
            self.failures.append(f"{name}: {bad.size} of {n} differ; " + "; ".join(ex))

    def expect(self, name, cond, detail=""):
        self.counts[name] = self.counts.get(name, 0) + 1
        if not cond:
            self.failures.append(f"{name}: {detail}")


def f32_bits_to_f32(lst):
    return np.array(lst, dtype=np.uint32).view(np.float32)


# ---------------------------------------------------------------- value tables (ml_dtypes)

def table(dtype, n):
    return np.arange(n, dtype=np.uint8).view(dtype).astype(np.float64)


E4M3_VALS = table(ml_dtypes.float8_e4m3fn, 256)
E5M2_VALS = table(ml_dtypes.float8_e5m2, 256)
E2M1_VALS = table(ml_dtypes.float4_e2m1fn, 16)
E4M3_MAGS = E4M3_VALS[:0x7F]  # 0 .. 448 (0x7F is NaN in e4m3fn)
E5M2_MAGS = E5M2_VALS[:0x7C]  # 0 .. 57344
E2M1_MAGS = E2M1_VALS[:8]  # 0 .. 6
FLT_MIN = np.float32(np.finfo(np.float32).tiny)


def rne_codes(v, mags, sign_bit):
    """Nearest value of the table (ties to the even code), saturating at the
    largest magnitude; v float64. Codes are indices into the monotonic table."""
    v = np.asarray(v, dtype=np.float64)
    a = np.minimum(np.abs(v), mags[-1])
    i = np.clip(np.searchsorted(mags, a, side="right") - 1, 0, len(mags) - 2)
    lo, hi = mags[i], mags[i + 1]
    dlo, dhi = a - lo, hi - a
    up = (dhi < dlo) | ((dhi == dlo) & ((i + 1) % 2 == 0))
    code = np.where(up, i + 1, i).astype(np.uint8)
    return code | np.where(np.signbit(v), sign_bit, 0).astype(np.uint8)


# ---------------------------------------------------------------- probe

class Probe:
    def __init__(self, exe, tmp):
        self.exe = exe
        self.tmp = tmp
        self.n = 0

    def _path(self, suffix):
        self.n += 1
        return os.path.join(self.tmp, f"p{self.n}{suffix}")

    def run(self, *args):
        r = subprocess.run([self.exe, *map(str, args)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"formats_probe {' '.join(map(str, args))} failed: {r.stderr}")

    def decoders(self):
        out = self._path(".json")
        self.run("decoders", out)
        with open(out) as f:
            return json.load(f)

    def encode(self, x):
        x = np.ascontiguousarray(x, dtype=np.float32)
        inp, out = self._path(".f32"), self._path(".bin")
        x.tofile(inp)
        self.run("encode", inp, out)
        b = np.fromfile(out, dtype=np.uint8)
        n = x.size
        return {
            "e4m3": b[:n], "e5m2": b[n:2 * n], "e5m2_sat": b[2 * n:3 * n], "e2m1": b[3 * n:4 * n],
            "fp16": b[4 * n:6 * n].view(np.uint16), "bf16": b[6 * n:8 * n].view(np.uint16),
        }

    def quantize(self, fmt, x, group=32, sdt="bf16"):
        rows, k = x.shape
        inp, prefix = self._path(".f32"), self._path("")
        np.ascontiguousarray(x, dtype=np.float32).tofile(inp)
        self.run("quantize", fmt, rows, k, group, sdt, inp, prefix)
        return (np.fromfile(prefix + ".data", dtype=np.uint8), np.fromfile(prefix + ".scales", dtype=np.uint8),
                np.fromfile(prefix + ".rows", dtype=np.float32))

    def dequantize(self, fmt, rows, k, data, scales=b"", row_scales=b"", group=32, sdt="bf16"):
        prefix, out = self._path(""), self._path(".f64")
        for suffix, blob in ((".data", data), (".scales", scales), (".rows", row_scales)):
            with open(prefix + suffix, "wb") as f:
                f.write(blob if isinstance(blob, bytes) else np.asarray(blob).tobytes())
        self.run("dequantize", fmt, rows, k, group, sdt, prefix, out)
        return np.fromfile(out, dtype=np.float64).reshape(rows, k)


# ---------------------------------------------------------------- 1. decoders

def check_decoders(c, probe):
    j = probe.decoders()
    codes = np.arange(256, dtype=np.uint8)
    ours = f32_bits_to_f32(j["e4m3"])
    ref = E4M3_VALS.astype(np.float32)
    finite = (codes & 0x7F) != 0x7F
    c.compare("decode e4m3 (254 non-NaN codes)", ours[finite], ref[finite], codes[finite], nan_equal=True)
    # formats.md: 0x7F / 0xFF are +-480 in moejit (NaN in e4m3fn).
    c.expect("decode e4m3 0x7F/0xFF = +-480 (formats.md), NaN in ml_dtypes",
             ours[0x7F] == 480 and ours[0xFF] == -480 and np.isnan(ref[0x7F]) and np.isnan(ref[0xFF]),
             f"ours {ours[0x7F]}, {ours[0xFF]}")
    c.compare("decode e5m2 (256 codes)", f32_bits_to_f32(j["e5m2"]), E5M2_VALS.astype(np.float32), codes, nan_equal=True)
    c.compare("decode e2m1 (16 codes)", f32_bits_to_f32(j["e2m1"]), E2M1_VALS.astype(np.float32), codes[:16],
              nan_equal=True)
    c.compare("decode e8m0 (256 codes)", f32_bits_to_f32(j["e8m0"]),
              codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32), codes, nan_equal=True)
    all16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    c.compare("decode bf16 (65536 codes)", f32_bits_to_f32(j["bf16"]), all16.view(ml_dtypes.bfloat16).astype(np.float32),
              all16, nan_equal=True)
    c.compare("decode fp16 (65536 codes, numpy)", f32_bits_to_f32(j["fp16"]), all16.view(np.float16).astype(np.float32),
              all16, nan_equal=True)


# ---------------------------------------------------------------- 2. element encoders

def special_inputs(vals):
    """Every finite value of a table, midpoints of neighbours and the fp32
    values either side of each midpoint, both signs."""
    v = np.unique(np.abs(vals[np.isfinite(vals)]))
    mids = (v[:-1] + v[1:]) / 2
    m32 = mids.astype(np.float32)
    assert np.all(m32.astype(np.float64) == mids)
    out = np.concatenate([v.astype(np.float32), m32, np.nextafter(m32, np.float32(0)),
                          np.nextafter(m32, np.float32(np.inf))])
    return np.concatenate([out, -out])


def check_encoders(c, probe, rng):
    warnings.simplefilter("ignore", RuntimeWarning)  # NaN codes widened to float64
    bits = rng.integers(0, 2**32, size=300000, dtype=np.uint64).astype(np.uint32)
    rand_bits = bits.view(np.float32)
    rand_bits = rand_bits[~np.isnan(rand_bits)]
    mag = np.exp2(rng.uniform(-30, 18, size=300000)).astype(np.float32)
    logu = np.where(rng.random(300000) < 0.5, -mag, mag).astype(np.float32)
    bf16_vals = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    fp16_vals = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float64)
    specials = np.concatenate([special_inputs(E4M3_VALS), special_inputs(E5M2_VALS), special_inputs(E2M1_VALS),
                               special_inputs(fp16_vals), special_inputs(bf16_vals),
                               np.array([0.0, -0.0, np.inf, -np.inf, 464.0, 61440.0, 65520.0, 7.0], np.float32)])
    x = np.concatenate([rand_bits, logu, specials]).astype(np.float32)
    ours = probe.encode(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_e4m3 = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        ref_e5m2 = x.astype(ml_dtypes.float8_e5m2).view(np.uint8)
        ref_e2m1 = x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
        ref_fp16 = x.astype(np.float16).view(np.uint16)
        ref_bf16 = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    a = np.abs(x)
    inr = a <= 464  # e4m3's RNE range: beyond it e4m3fn has no value (ml_dtypes: NaN), we saturate
    c.compare("encode e4m3 vs ml_dtypes (|x| <= 464)", ours["e4m3"][inr], ref_e4m3[inr], x[inr])
    sat = np.where(np.signbit(x[~inr]), 0xFE, 0x7E).astype(np.uint8)
    c.compare("encode e4m3 saturation (|x| > 464 -> +-448, ml_dtypes NaN)", ours["e4m3"][~inr], sat, x[~inr])
    c.expect("ml_dtypes e4m3 gives NaN where we saturate", bool(np.all((ref_e4m3[~inr] & 0x7F) == 0x7F)))
    c.compare("encode e5m2 vs ml_dtypes", ours["e5m2"], ref_e5m2, x)
    inr5 = a < 61440
    c.compare("encode e5m2 saturating vs ml_dtypes (|x| < 61440)", ours["e5m2_sat"][inr5], ref_e5m2[inr5], x[inr5])
    fin = ~inr5 & np.isfinite(x)
    c.compare("encode e5m2 saturating (finite |x| >= 61440 -> +-57344)", ours["e5m2_sat"][fin],
              np.where(np.signbit(x[fin]), 0xFB, 0x7B).astype(np.uint8), x[fin])
    inf = np.isinf(x)
    c.compare("encode e5m2 saturating keeps inf", ours["e5m2_sat"][inf], ref_e5m2[inf], x[inf])
    c.compare("encode e2m1 vs ml_dtypes", ours["e2m1"], ref_e2m1, x)
    c.compare("encode fp16 vs numpy", ours["fp16"], ref_fp16, x)
    c.compare("encode bf16 vs ml_dtypes", ours["bf16"], ref_bf16, x)
    c.counts["  (encoder inputs: random bits, log-uniform, every value / midpoint / neighbours)"] = int(x.size)


# ---------------------------------------------------------------- 3. GGUF q4_0 / q8_0

def gguf_matrices(rng):
    out = []
    for rows, k in ((4, 96), (3, 2880), (64, 256), (1, 32)):
        scale = np.exp2(rng.integers(-20, 9, size=(rows, 1))).astype(np.float32)
        x = (rng.standard_normal((rows, k)).astype(np.float32) * scale).astype(np.float32)
        blocks = x.reshape(-1, 32)
        nb = blocks.shape[0]
        kinds = rng.integers(0, 8, size=nb)
        for b in range(nb):
            if kinds[b] == 0:
                blocks[b] = 0  # zero block (q4_0 stores d = -0.0, as ggml)
            elif kinds[b] == 1:  # exact ties: x/d = n + 1/2 with d a power of two
                d = np.float32(2.0 ** rng.integers(-10, 4))
                blocks[b] = (rng.integers(-8, 7, size=32) + 0.5).astype(np.float32) * d
                blocks[b, 0] = -8 * d
            elif kinds[b] == 2:
                d = np.float32(2.0 ** rng.integers(-10, 4))
                blocks[b] = (rng.integers(-127, 127, size=32) + 0.5).astype(np.float32) * d
                blocks[b, 5] = 127 * d
            elif kinds[b] == 3:
                blocks[b] *= np.float32(1e-6)  # small d (fp16 subnormal range)
            elif kinds[b] == 4:
                blocks[b] *= np.float32(3e6)  # d beyond fp16: stored as inf by both
            elif kinds[b] == 5:
                blocks[b] = np.abs(blocks[b])  # positive max: q4_0 d < 0
        out.append(x.reshape(rows, k).astype(np.float32))
    return out


def check_gguf(c, probe, rng):
    for fmt, qt, bb in (("q4_0", GGMLQuantizationType.Q4_0, 18), ("q8_0", GGMLQuantizationType.Q8_0, 34)):
        for x in gguf_matrices(rng):
            rows, k = x.shape
            data, _, _ = probe.quantize(fmt, x)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ref = np.asarray(gguf_quantize(x, qt), dtype=np.uint8).reshape(-1)
            c.compare(f"{fmt} quantize bytes vs gguf.quants.quantize", data, ref)
            ours = probe.dequantize(fmt, rows, k, data)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                deq = np.asarray(gguf_dequantize(data.reshape(rows, -1), qt), dtype=np.float32).reshape(rows, k)
            c.compare(f"{fmt} decode (our bytes) vs gguf.quants.dequantize", ours, deq.astype(np.float64),
                      nan_equal=True)
        # Random bytes with finite fp16 d.
        rows, k = 16, 256
        raw = rng.integers(0, 256, size=(rows, k // 32, bb), dtype=np.uint8)
        d = raw[..., :2].copy().view(np.uint16)
        d[(d & 0x7C00) == 0x7C00] &= 0xBFFF  # no inf/NaN d
        raw[..., :2] = d.view(np.uint8)
        ours = probe.dequantize(fmt, rows, k, raw.reshape(-1))
        deq = np.asarray(gguf_dequantize(raw.reshape(rows, -1), qt), dtype=np.float32).reshape(rows, k)
        c.compare(f"{fmt} decode (random bytes) vs gguf.quants.dequantize", ours, deq.astype(np.float64))


# ---------------------------------------------------------------- 4. rules of the other formats (numpy)

def ref_mx(x, fmt, g):
    rows, k = x.shape
    fp4 = fmt in ("mxfp4", "ds_fp4")
    emax, mags, sign = {"mxfp8_e4m3": (8, E4M3_MAGS, 0x80), "mxfp8_e5m2": (15, E5M2_MAGS, 0x80)}.get(
        fmt, (2, E2M1_MAGS, 0x8))
    xb = x.reshape(rows, k // g, g).astype(np.float64)
    amax = np.abs(xb).max(-1)
    _, e = np.frexp(amax)
    s = np.where(amax > 0, np.clip(e - 1 - emax + 127, 0, 254), 0).astype(np.uint8)
    q = xb / np.ldexp(1.0, s.astype(np.int64) - 127)[..., None]
    codes = rne_codes(q, mags, sign).reshape(rows, k)
    # The table search against ml_dtypes itself (the quotients are exact in fp32).
    dt = {"mxfp8_e4m3": ml_dtypes.float8_e4m3fn, "mxfp8_e5m2": ml_dtypes.float8_e5m2}.get(fmt, ml_dtypes.float4_e2m1fn)
    ml = np.clip(q, -mags[-1], mags[-1]).astype(np.float32).astype(dt).view(np.uint8).reshape(rows, k)
    if fp4:
        codes = codes[:, 0::2] | (codes[:, 1::2] << 4)
        ml = ml[:, 0::2] | (ml[:, 1::2] << 4)
    return codes.reshape(-1), s.reshape(-1), ml.reshape(-1)


def ref_fp8_block(x, sdt):
    rows, k = x.shape
    nbr, nbc = -(-rows // 128), -(-k // 128)
    codes = np.zeros((rows, k), np.uint8)
    scales = np.zeros((nbr, nbc), np.float32)
    for br in range(nbr):
        for bc in range(nbc):
            blk = x[br * 128:(br + 1) * 128, bc * 128:(bc + 1) * 128]
            amax = np.float32(np.abs(blk).max())
            if amax == 0:
                s = np.float32(1)
            else:
                s = np.float32(amax / np.float32(448))
                if sdt == "bf16":
                    s = np.float32(np.array([s]).astype(ml_dtypes.bfloat16).astype(np.float32)[0])
                if s == 0:
                    s = np.float32(2.0**-149 if sdt == "f32" else 2.0**-133)
            scales[br, bc] = s
            codes[br * 128:(br + 1) * 128, bc * 128:(bc + 1) * 128] = rne_codes(
                blk.astype(np.float64) / np.float64(s), E4M3_MAGS, 0x80)
    sb = scales.view(np.uint8) if sdt == "f32" else scales.astype(ml_dtypes.bfloat16).view(np.uint8)
    return codes.reshape(-1), sb.reshape(-1)


def ref_nvfp4(x):
    rows, k = x.shape
    g = np.maximum(np.abs(x).max(1) / np.float32(2688), FLT_MIN).astype(np.float32)
    xb = x.reshape(rows, k // 16, 16).astype(np.float64)
    bmax = np.abs(xb).max(-1)
    sb = rne_codes(bmax / (6.0 * g.astype(np.float64)[:, None]), E4M3_MAGS, 0x80)
    S = E4M3_VALS[sb] * g.astype(np.float64)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(S[..., None] > 0, xb / S[..., None], np.copysign(0.0, xb))
    codes = rne_codes(q, E2M1_MAGS, 0x8).reshape(rows, k)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).reshape(-1), sb.reshape(-1), g


def rule_matrix(rng, rows, k):
    scale = np.exp2(rng.integers(-20, 9, size=(rows, 1)))
    x = rng.standard_normal((rows, k)) * scale
    x[rng.random((rows, k)) < 0.01] *= 40
    x[rng.random((rows, k)) < 0.01] = 0
    return x.astype(np.float32)


def check_rules(c, probe, rng, info):
    for fmt, rows, k, g in (("mxfp8_e4m3", 8, 256, 32), ("mxfp8_e4m3", 4, 2880, 32), ("mxfp8_e4m3", 4, 256, 64),
                            ("mxfp8_e4m3", 4, 256, 128), ("mxfp8_e5m2", 4, 192, 64), ("mxfp8_e5m2", 3, 2880, 32),
                            ("mxfp4", 4, 2880, 32), ("ds_fp4", 3, 256, 32)):
        x = rule_matrix(rng, rows, k)
        data, scales, _ = probe.quantize(fmt, x, group=g)
        codes, s, ml = ref_mx(x, fmt, g)
        c.compare(f"{fmt} bytes vs numpy OCP MX rule", data, codes)
        c.compare(f"{fmt} e8m0 scales vs numpy OCP MX rule", scales, s)
        c.compare(f"{fmt} bytes vs ml_dtypes astype of the exact quotients", data, ml)
    for rows, k, sdt in ((300, 200, "bf16"), (130, 333, "f32"), (129, 384, "bf16"), (1, 1, "f32")):
        x = rule_matrix(rng, rows, k)
        data, scales, _ = probe.quantize("fp8_block", x, group=128, sdt=sdt)
        codes, sb = ref_fp8_block(x, sdt)
        c.compare(f"fp8_block ({sdt} scales) bytes vs numpy amax/448 rule", data, codes)
        c.compare(f"fp8_block ({sdt} scales) scales vs numpy amax/448 rule", scales, sb)
        # Information: rounding the fp32 quotient instead (torch's (w / s).to(float8) style) differs
        # from the exact-quotient RNE only where the fp32 quotient lands on a midpoint.
        s32 = sb.view(np.float32) if sdt == "f32" else sb.view(ml_dtypes.bfloat16).astype(np.float32)
        nbc = -(-k // 128)
        s_el = s32.reshape(-1, nbc)[np.arange(rows)[:, None] // 128, np.arange(k)[None, :] // 128]
        fp32_style = rne_codes((x / s_el).astype(np.float32).astype(np.float64), E4M3_MAGS, 0x80).reshape(-1)
        info.append(f"fp8_block {rows}x{k} {sdt}: {int(np.sum(fp32_style != data))} of {data.size} elements "
                    "would differ if the quotient were rounded to fp32 first")
    for rows, k in ((4, 2880), (16, 80)):
        x = rule_matrix(rng, rows, k)
        data, scales, gl = probe.quantize("nvfp4", x, group=16)
        codes, sb, g = ref_nvfp4(x)
        c.compare("nvfp4 bytes vs numpy two-level rule", data, codes)
        c.compare("nvfp4 e4m3 block scales vs numpy two-level rule", scales, sb)
        c.compare("nvfp4 row globals vs numpy two-level rule", gl.view(np.uint32), g.view(np.uint32))
    x = rule_matrix(rng, 5, 77)
    data, _, _ = probe.quantize("bf16", x, group=32)
    c.compare("bf16 bytes vs ml_dtypes", data.view(np.uint16), x.astype(ml_dtypes.bfloat16).view(np.uint16).reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", required=True, help="path to the formats_probe executable")
    ap.add_argument("--seed", type=int, default=20240611)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    c = Checker()
    with tempfile.TemporaryDirectory(prefix="moejit-crosscheck-") as tmp:
        probe = Probe(args.probe, tmp)
        check_decoders(c, probe)
        check_encoders(c, probe, rng)
        check_gguf(c, probe, rng)
        info = []
        check_rules(c, probe, rng, info)
    print(f"references: numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}, "
          f"gguf {importlib.metadata.version('gguf')}")
    for name, n in c.counts.items():
        print(f"  {n:9d}  {name}")
    for line in info:
        print(f"  info: {line}")
    total = sum(c.counts.values())
    if c.failures:
        print(f"\n{len(c.failures)} disagreement(s):")
        for f in c.failures:
            print("  " + f)
        print(f"crosscheck_formats: FAILED ({total} values compared)")
        return 1
    print(f"crosscheck_formats: all {total} values agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
