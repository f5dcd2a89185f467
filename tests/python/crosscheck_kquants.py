#!/usr/bin/env python3
"""Cross-checks moejit's GGUF K-quants (formats/kquants) against independent references.

kquants_probe (tests/kquants_probe.cpp) runs our decoders, reference GEMV and
quantizers on inputs made here; this script compares them with:

  * gguf-py (``gguf.quants.dequantize``, pinned in requirements.txt) for every
    K-quant: random super-blocks (every byte random, d and dmin finite), blocks
    in which every byte of the scale fields takes all 256 values, d / dmin over
    every fp16 exponent (subnormals, inf and NaN included: NaN compares equal to
    NaN), and the bytes of our quantizers. Our fp32 row decode must equal
    gguf-py's float32 bit for bit and our exact double weight must round to it.
  * the sub-block fields (kquant_sub, kquant_q) against gguf-py's decode of the
    same block with d = 1, dmin = 0 (which gives sc * q exactly) and with d = 0,
    dmin = 1 (which gives -m).
  * the reference GEMV against a float64 dot product of gguf-py's weights, with
    the error bound of kquants.h taken against sum(|d sc q x| + |dmin m x|), and
    our per-token sums of x against a sequential fp32 sum.
  * ggml's reference quantizers (quantize_row_q*_K_ref): gguf-py 0.19.0 has no
    K-quant quantize (only decoders), so the bytes ggml gives for the inputs of
    ``golden_inputs()`` are recorded in kquant_ggml_golden.json, made by this
    script with ``--ggml-lib`` (ggml built from source, see the JSON's "source"),
    and our quantizers must reproduce them byte for byte. With ``--ggml-lib``
    the script also compares against the live library on many random blocks.

Usage: crosscheck_kquants.py --probe PATH/TO/kquants_probe [--ggml-lib libggml-base.so [--write-golden]]
Exit status 0 when everything agrees; prints counts of what was compared.
"""

import argparse
import ctypes
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import warnings

try:
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize
except ImportError as e:  # pragma: no cover
    print(f"crosscheck_kquants: missing Python package ({e}); `make pyenv` creates build/pyenv with numpy and gguf",
          file=sys.stderr)
    sys.exit(1)

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "kquant_ggml_golden.json")

# name: (ggml type, block bytes, sub-block size, has mins, offset of d, offset of dmin,
#        (offset, length) of the scale field)
FORMATS = {
    "q4_K": (GGMLQuantizationType.Q4_K, 144, 32, True, 0, 2, (4, 12)),
    "q5_K": (GGMLQuantizationType.Q5_K, 176, 32, True, 0, 2, (4, 12)),
    "q6_K": (GGMLQuantizationType.Q6_K, 210, 16, False, 208, None, (192, 16)),
    "q2_K": (GGMLQuantizationType.Q2_K, 84, 16, True, 80, 82, (0, 16)),
    "q3_K": (GGMLQuantizationType.Q3_K, 110, 16, False, 108, None, (96, 12)),
}


class Checker:
    def __init__(self):
        self.counts = {}
        self.failures = []

    def compare(self, name, ours, ref, nan_equal=True):
        """Bit-exact (float) or exact comparison; NaN equals NaN when nan_equal."""
        ours, ref = np.asarray(ours), np.asarray(ref)
        assert ours.shape == ref.shape, (name, ours.shape, ref.shape)
        if ours.dtype.kind == "f":
            same = ours.view(np.dtype(f"u{ours.itemsize}")) == ref.view(np.dtype(f"u{ref.itemsize}"))
            # -0.0 and +0.0 differ in bits: keep them apart, except for NaN payloads.
            if nan_equal:
                same |= np.isnan(ours) & np.isnan(ref)
        else:
            same = ours == ref
        self.counts[name] = self.counts.get(name, 0) + int(same.size)
        bad = np.flatnonzero(~same.reshape(-1))
        if bad.size:
            ex = "; ".join(f"[{i}] ours {ours.reshape(-1)[i]!r} ref {ref.reshape(-1)[i]!r}" for i in bad[:5])
            self.failures.append(f"{name}: {bad.size} of {same.size} differ; {ex}")

    def expect(self, name, cond, detail=""):
        self.counts[name] = self.counts.get(name, 0) + 1
        if not cond:
            self.failures.append(f"{name}: {detail}")


class Probe:
    def __init__(self, exe, tmp):
        self.exe, self.tmp, self.n = exe, tmp, 0

    def _path(self, suffix):
        self.n += 1
        return os.path.join(self.tmp, f"k{self.n}{suffix}")

    def run(self, *args):
        r = subprocess.run([self.exe, *map(str, args)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"kquants_probe {' '.join(map(str, args))} failed: {r.stderr}")

    def quantize(self, fmt, x):
        rows, k = x.shape
        inp, out = self._path(".f32"), self._path(".bin")
        np.ascontiguousarray(x, dtype=np.float32).tofile(inp)
        self.run("quantize", fmt, rows, k, inp, out)
        return np.fromfile(out, dtype=np.uint8)

    def dequantize(self, fmt, rows, k, data):
        inp, out = self._path(".bin"), self._path("")
        np.ascontiguousarray(data, dtype=np.uint8).tofile(inp)
        self.run("dequantize", fmt, rows, k, inp, out)
        return (np.fromfile(out + ".f64", dtype=np.float64).reshape(rows, k),
                np.fromfile(out + ".f32", dtype=np.float32).reshape(rows, k))

    def fields(self, fmt, blocks):
        nsub = 256 // FORMATS[fmt][2]
        inp, out = self._path(".bin"), self._path(".i32")
        np.ascontiguousarray(blocks, dtype=np.uint8).tofile(inp)
        self.run("fields", fmt, blocks.shape[0], inp, out)
        v = np.fromfile(out, dtype=np.int32).reshape(blocks.shape[0], 2 * nsub + 256)
        return v[:, 0:2 * nsub:2], v[:, 1:2 * nsub:2], v[:, 2 * nsub:]

    def gemv(self, fmt, rows, k, data, x):
        inp, xin, out = self._path(".bin"), self._path(".f32"), self._path(".out")
        np.ascontiguousarray(data, dtype=np.uint8).tofile(inp)
        np.ascontiguousarray(x, dtype=np.float32).tofile(xin)
        self.run("gemv", fmt, rows, k, inp, xin, out)
        v = np.fromfile(out, dtype=np.float32)
        return v[:rows], v[rows:]


def gguf_w32(fmt, blocks):
    """gguf-py's float32 weights of a [n, block_bytes] array, as [n, 256]."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # inf * 0 and the like in NaN / inf blocks
        return np.asarray(gguf_dequantize(np.ascontiguousarray(blocks), FORMATS[fmt][0]),
                          dtype=np.float32).reshape(blocks.shape[0], 256)


def set_f16(blocks, off, vals):
    blocks[:, off:off + 2] = np.asarray(vals, dtype=np.uint16).reshape(-1, 1).view(np.uint8).reshape(-1, 2)


def finite_f16(rng, n):
    """Random fp16 bit patterns without inf / NaN, subnormals and zeros included."""
    h = rng.integers(0, 65536, size=n, dtype=np.uint32).astype(np.uint16)
    return np.where((h & 0x7C00) == 0x7C00, h & 0xBFFF, h).astype(np.uint16)


# ---------------------------------------------------------------- decoders

def decoder_blocks(fmt, rng):
    """Named sets of super-blocks [n, block_bytes] for the decoder comparison."""
    _, bb, _, mins, doff, moff, (soff, slen) = FORMATS[fmt]
    sets = {}
    b = rng.integers(0, 256, size=(2048, bb), dtype=np.uint8)
    set_f16(b, doff, finite_f16(rng, 2048))
    if mins:
        set_f16(b, moff, finite_f16(rng, 2048))
    sets["random bytes, finite d"] = b
    # Every byte of the scale field takes every value 0..255 (the others random).
    b = rng.integers(0, 256, size=(256 * slen, bb), dtype=np.uint8)
    for p in range(slen):
        b[256 * p:256 * (p + 1), soff + p] = np.arange(256, dtype=np.uint8)
    set_f16(b, doff, finite_f16(rng, b.shape[0]))
    if mins:
        set_f16(b, moff, finite_f16(rng, b.shape[0]))
    sets["every value of every scale byte"] = b
    # d (and dmin) over every exponent, 32 mantissas each, both signs: subnormals, inf, NaN.
    exps, mans = np.arange(32, dtype=np.uint16), np.linspace(0, 1023, 32).astype(np.uint16)
    h = ((exps[:, None] << 10) | mans[None, :]).reshape(-1)
    h = np.concatenate([h, h | 0x8000]).astype(np.uint16)
    b = rng.integers(0, 256, size=(h.size, bb), dtype=np.uint8)
    set_f16(b, doff, h)
    if mins:
        set_f16(b, moff, finite_f16(rng, h.size))
    sets["d over every fp16 exponent (subnormal, inf, NaN)"] = b
    if mins:
        b = rng.integers(0, 256, size=(h.size, bb), dtype=np.uint8)
        set_f16(b, doff, finite_f16(rng, h.size))
        set_f16(b, moff, h)
        sets["dmin over every fp16 exponent (subnormal, inf, NaN)"] = b
    return sets


def check_decoders(c, probe, fmt, blocks, what):
    _, bb, _, mins, doff, moff, _ = FORMATS[fmt]
    n = blocks.shape[0]
    ref = gguf_w32(fmt, blocks)
    w64, w32 = probe.dequantize(fmt, 1, 256 * n, blocks.reshape(-1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c.compare(f"{fmt} fp32 row decode vs gguf.quants.dequantize ({what})", w32.reshape(n, 256), ref)
        c.compare(f"{fmt} exact weight rounded to fp32 vs gguf.quants.dequantize ({what})",
                  w64.reshape(n, 256).astype(np.float32), ref)
    # The fields: sc * q from gguf-py with d = 1, dmin = 0; -m with d = 0, dmin = 1.
    sc, m, q = probe.fields(fmt, blocks)
    nsub = sc.shape[1]
    one = blocks.copy()
    set_f16(one, doff, np.full(n, 0x3C00, np.uint16))
    if mins:
        set_f16(one, moff, np.zeros(n, np.uint16))
    ours_scq = (np.repeat(sc, 256 // nsub, axis=1) * q).astype(np.float32)
    # + 0: the sign of an integer product's zero is not a field (gguf-py's float product has one)
    c.compare(f"{fmt} fields: sc * q vs gguf-py with d = 1, dmin = 0 ({what})", ours_scq + np.float32(0),
              gguf_w32(fmt, one) + np.float32(0))
    if mins:
        zero = blocks.copy()
        set_f16(zero, doff, np.zeros(n, np.uint16))
        set_f16(zero, moff, np.full(n, 0x3C00, np.uint16))
        ours_m = -np.repeat(m, 256 // nsub, axis=1).astype(np.float32)
        c.compare(f"{fmt} fields: -m vs gguf-py with d = 0, dmin = 1 ({what})", ours_m + np.float32(0),
                  gguf_w32(fmt, zero) + np.float32(0))


# ---------------------------------------------------------------- GEMV

def check_gemv(c, probe, fmt, rng):
    _, bb, B, mins, doff, moff, _ = FORMATS[fmt]
    for rows, nb in ((7, 1), (5, 4), (3, 11)):
        k = 256 * nb
        blocks = rng.integers(0, 256, size=(rows * nb, bb), dtype=np.uint8)
        # Moderate d / dmin (exponents 2^-10 .. 2^2) so that nothing overflows.
        set_f16(blocks, doff, rng.integers(5, 17, rows * nb).astype(np.uint16) << 10
                | rng.integers(0, 1024, rows * nb).astype(np.uint16))
        if mins:
            set_f16(blocks, moff, rng.integers(5, 17, rows * nb).astype(np.uint16) << 10
                    | rng.integers(0, 1024, rows * nb).astype(np.uint16))
        # bf16 activations: fp32 with the low 16 bits clear.
        x = (rng.standard_normal(k) * np.exp2(rng.integers(-3, 4, k))).astype(np.float32)
        x = (x.view(np.uint32) & 0xFFFF0000).view(np.float32)
        y, sx = probe.gemv(fmt, rows, k, blocks.reshape(-1), x)
        # Exact weights from gguf-py: d * sc * q with dmin = 0 (exact in fp32), -dmin * m with d = 0.
        dq = blocks.copy()
        if mins:
            set_f16(dq, moff, np.zeros(rows * nb, np.uint16))
        w_dq = gguf_w32(fmt, dq).reshape(rows, k).astype(np.float64)
        w_m = np.zeros_like(w_dq)
        if mins:
            mm = blocks.copy()
            set_f16(mm, doff, np.zeros(rows * nb, np.uint16))
            w_m = gguf_w32(fmt, mm).reshape(rows, k).astype(np.float64)
        x64 = x.astype(np.float64)
        want = (w_dq + w_m) @ x64
        mag = np.abs(w_dq) @ np.abs(x64) + np.abs(w_m) @ np.abs(x64)
        nops = B + 2 * (k // B)
        bound = nops * 2.0**-24 * 1.01 * mag + nops * 2.0**-149 * 1e6
        err = np.abs(y.astype(np.float64) - want)
        c.expect(f"{fmt} reference GEMV vs float64 of gguf-py's weights (bound on sum |d sc q x| + |dmin m x|)",
                 bool(np.all(err <= bound)),
                 f"K={k}: max err/bound {np.max(err / bound):.3g} (err {err.max():.3g})")
        c.counts[f"  ({fmt} GEMV outputs compared)"] = c.counts.get(f"  ({fmt} GEMV outputs compared)", 0) + rows
        # S_x: sequential fp32 sums from +0.0.
        want_sx = np.zeros(k // B, np.float32)
        for s in range(k // B):
            acc = np.float32(0)
            for v in x[s * B:(s + 1) * B]:
                acc = np.float32(acc + v)
            want_sx[s] = acc
        c.compare(f"{fmt} per-token sub-block sums of x vs sequential fp32 sum", sx, want_sx, nan_equal=False)


# ---------------------------------------------------------------- quantizers

def splitmix_uniform(seed, n):
    """n uniform float64 in [0, 1) from splitmix64: the same numbers on every platform and numpy."""
    with np.errstate(over="ignore"):
        z = (np.uint64(seed) + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def bell(seed, n):
    """Irwin-Hall(4) centred and scaled to unit variance: bell-shaped, exact arithmetic only."""
    u = splitmix_uniform(seed, 4 * n).reshape(4, n)
    return (u.sum(0) - 2.0) * 1.7320508075688772


def golden_inputs():
    """The 48 super-blocks [48, 256] whose ggml bytes kquant_ggml_golden.json records."""
    rows = []
    for i in range(16):  # plain bell-shaped rows at scales 2^-12 .. 2^11
        rows.append(bell(100 + i, 256) * 2.0 ** (3 * (i % 8) - 12 + (i // 8)))
    n = bell(200, 256)
    u = splitmix_uniform(201, 256)
    rows += [
        np.zeros(256),  # all zero
        np.full(256, 0.75),  # constant
        np.full(256, -3.0),
        np.abs(n),  # one sign
        -np.abs(n),
        np.where(np.arange(256) == 77, 5.0, 0.0),  # a single spike
        n * 1e-20,  # below ggml's GROUP_MAX_EPS per sub-block scale
        n * 1e-6,  # fp16-subnormal d
        n * 1e-9,  # d underflows fp16
        n * 3e5,
        n * 1e7,  # d overflows fp16 (stored as inf, as ggml does)
        n * n * n,  # heavy tails
        np.where(u < 0.9, 0.0, n),  # sparse
        np.floor(u * 16) - 8,  # integers -8..7
        n * np.exp2(np.arange(256) // 16 - 8.0),  # sub-blocks of very different scales
        n + 5.0 * np.where((np.arange(256) // 32) % 2 == 0, 1, -1),  # offsets per sub-block of 32
        np.floor(u * 8) + 0.5,  # halves
        n * np.where(np.arange(256) % 16 == 0, 40.0, 1.0),  # one outlier per 16
    ]
    for i in range(14):  # bell-shaped with offsets
        rows.append(bell(300 + i, 256) + (i - 7) * 0.5)
    x = np.array(rows, dtype=np.float32)
    assert x.shape == (48, 256) and np.all(np.isfinite(x))
    return x


def ggml_quantize(lib, fmt, x):
    fn = getattr(lib, f"quantize_row_{fmt}_ref")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    bb = FORMATS[fmt][1]
    out = np.zeros((x.shape[0], x.shape[1] // 256 * bb), np.uint8)
    x = np.ascontiguousarray(x, dtype=np.float32)
    for r in range(x.shape[0]):
        fn(x[r].ctypes.data, out[r].ctypes.data, x.shape[1])
    return out.reshape(-1)


def check_quantizers(c, probe, rng, lib):
    x = golden_inputs()
    with open(GOLDEN) as f:
        golden = json.load(f)
    for fmt in FORMATS:
        # 12 rows of K = 1024: the same 48 super-blocks, four to a row.
        ours = probe.quantize(fmt, x.reshape(12, 1024))
        ref = np.frombuffer(bytes.fromhex(golden["bytes"][fmt]), dtype=np.uint8)
        c.compare(f"{fmt} quantizer bytes vs ggml quantize_row_{fmt}_ref (recorded, 48 super-blocks)", ours, ref)
        check_decoders(c, probe, fmt, ours.reshape(48, -1), "our quantizer's bytes")
        if lib is not None:
            live = rng.standard_normal((400, 1024)).astype(np.float32) * np.exp2(
                rng.integers(-16, 12, (400, 1))).astype(np.float32)
            live[rng.random(live.shape) < 0.02] *= 30
            live[::7] += np.float32(2)
            c.compare(f"{fmt} quantizer bytes vs live ggml quantize_row_{fmt}_ref (400 x 1024 random)",
                      probe.quantize(fmt, live), ggml_quantize(lib, fmt, live))


def write_golden(lib, source):
    x = golden_inputs()
    out = {"about": "Bytes of ggml's quantize_row_q*_K_ref for crosscheck_kquants.py golden_inputs() "
                    "(48 super-blocks, row by row); written by crosscheck_kquants.py --write-golden.",
           "source": source, "bytes": {}}
    for fmt in FORMATS:
        out["bytes"][fmt] = ggml_quantize(lib, fmt, x).tobytes().hex()
    with open(GOLDEN, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {GOLDEN}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", required=True, help="path to the kquants_probe executable")
    ap.add_argument("--seed", type=int, default=20250916)
    ap.add_argument("--ggml-lib", help="libggml-base.so of a ggml build: compare against it live")
    ap.add_argument("--write-golden", metavar="SOURCE",
                    help="with --ggml-lib: (re)write kquant_ggml_golden.json; SOURCE names the ggml version")
    args = ap.parse_args()
    lib = ctypes.CDLL(args.ggml_lib) if args.ggml_lib else None
    if args.write_golden:
        if lib is None:
            ap.error("--write-golden needs --ggml-lib")
        write_golden(lib, args.write_golden)
    rng = np.random.default_rng(args.seed)
    c = Checker()
    with tempfile.TemporaryDirectory(prefix="moejit-kquants-") as tmp:
        probe = Probe(args.probe, tmp)
        for fmt in FORMATS:
            for what, blocks in decoder_blocks(fmt, rng).items():
                check_decoders(c, probe, fmt, blocks, what)
            check_gemv(c, probe, fmt, rng)
        check_quantizers(c, probe, rng, lib)
    with open(GOLDEN) as f:
        src = json.load(f)["source"]
    print(f"references: numpy {np.__version__}, gguf {importlib.metadata.version('gguf')}, "
          f"ggml bytes recorded from {src}" + (f", live ggml {args.ggml_lib}" if lib else ""))
    for name, n in c.counts.items():
        print(f"  {n:9d}  {name}")
    total = sum(c.counts.values())
    if c.failures:
        print(f"\n{len(c.failures)} disagreement(s):")
        for f in c.failures:
            print("  " + f)
        print(f"crosscheck_kquants: FAILED ({total} values compared)")
        return 1
    print(f"crosscheck_kquants: all {total} values agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
