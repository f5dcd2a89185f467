"""The GGUF K-quants (q4_K, q5_K, q6_K, q2_K, q3_K) through the package: names and
ids, the shape rules of their super-blocks, and MoE / Linear outputs on every tier
this CPU has against float64 from gguf-py's dequantize of the same bytes."""

import numpy as np
import pytest

import moejit
from conftest import host_tiers
from moejit_ref import assert_close, moe_reference, rand_bf16, routes

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType as GQ  # noqa: E402

IA = moejit.InvalidArgument

# name: (id, super-block bytes, offset of d, offset of dmin or None)
KQUANTS = {"q4_K": (9, 144, 0, 2), "q5_K": (10, 176, 0, 2), "q6_K": (11, 210, 208, None),
           "q2_K": (12, 84, 80, 82), "q3_K": (13, 110, 108, None)}
GGML = {"q4_K": GQ.Q4_K, "q5_K": GQ.Q5_K, "q6_K": GQ.Q6_K, "q2_K": GQ.Q2_K, "q3_K": GQ.Q3_K}


class KBank:
    """Random super-blocks of E [rows, K] matrices (d and dmin finite, 2^-12 .. 2^-9),
    their values from gguf-py, and |d sc q| + |dmin m| for the error bounds."""

    def __init__(self, fmt, experts, rows, k, rng):
        _, nbytes, d_at, dmin_at = KQUANTS[fmt]
        blocks = rng.integers(0, 256, size=(experts, rows, k // 256, nbytes), dtype=np.uint8)
        for at in (d_at, dmin_at):
            if at is not None:
                h = (rng.uniform(2.0 ** -12, 2.0 ** -9, size=blocks.shape[:3]) *
                     rng.choice([-1.0, 1.0], size=blocks.shape[:3])).astype(np.float16)
                blocks[..., at:at + 2] = h[..., None].view(np.uint8).reshape(*h.shape, 2)
        self.data = blocks.reshape(experts, rows, -1)
        self.deq = self._deq(fmt, self.data, k)
        # The two terms of w = d sc q - dmin m, each from gguf-py with the other factor zeroed.
        no_min, no_d = blocks.copy(), blocks.copy()
        if dmin_at is not None:
            no_min[..., dmin_at:dmin_at + 2] = 0
            no_d[..., d_at:d_at + 2] = 0
            self.mag = (np.abs(self._deq(fmt, no_min.reshape(self.data.shape), k)) +
                        np.abs(self._deq(fmt, no_d.reshape(self.data.shape), k)))
        else:
            self.mag = np.abs(self.deq)

    @staticmethod
    def _deq(fmt, data, k):
        e, rows = data.shape[:2]
        return gguf_quants.dequantize(data.reshape(e * rows, -1), GGML[fmt]).astype(np.float64).reshape(e, rows, k)


def test_names_and_ids():
    names = moejit.formats()
    for fmt, (fid, *_) in KQUANTS.items():
        assert names[fmt] == fid
        assert moejit.format_name(fid) == fmt
    assert set(KQUANTS) <= set(moejit.info()["formats"])
    assert moejit.max_format_id() == moejit.info()["max_format_id"] == 13


@pytest.mark.parametrize("fmt", list(KQUANTS))
def test_linear_every_tier(fmt, rng):
    rows, cols = 40, 768
    b = KBank(fmt, 1, rows, cols, rng)
    bias = rand_bf16(rng, (rows,), 0.1)
    x = rand_bf16(rng, (5, cols))
    X = x.astype(np.float64)
    ref = X @ b.deq[0].T + bias.astype(np.float64)
    bound = np.abs(X) @ b.mag[0].T + np.abs(bias.astype(np.float64))
    for tier in host_tiers():
        ctx = moejit.Context(num_threads=2, max_isa=tier)
        lin = moejit.Linear(ctx, format=fmt, weight=b.data[0], bias=bias, output_dtype="f32")
        assert ctx.isa == tier and (lin.rows, lin.cols) == (rows, cols)
        assert_close(lin.forward(x), ref, bound, False, f"linear {fmt} on {tier}", rel=2.0 ** -14)


@pytest.mark.parametrize("fmt", list(KQUANTS))
def test_moe_every_tier(fmt, rng):
    E, H, I, K, T = 5, 512, 256, 2, 4
    gu = KBank(fmt, E, 2 * I, H, rng)
    dn = KBank(fmt, E, H, I, rng)
    x = rand_bf16(rng, (T, H))
    ids, w = routes(rng, T, E, K)
    ref, bound = moe_reference(x, ids, w, gu.deq, dn.deq)
    for tier in host_tiers():
        ctx = moejit.Context(num_threads=2, max_isa=tier)
        moe = moejit.MoE(ctx, format=fmt, gate_up=gu.data, down=dn.data, top_k=K)
        assert moe.isa == tier
        y = moe.forward(x, ids, w)
        assert_close(y, ref, bound, True, f"MoE {fmt} on {tier}")


def test_shape_rules(rng):
    c = moejit.Context(num_threads=1)
    b = KBank("q4_K", 2, 64, 512, rng)
    with pytest.raises(IA, match="are not a whole number of q4_K weights"):
        moejit.Linear(c, format="q4_K", weight=np.zeros((4, 145), np.uint8))
    with pytest.raises(IA, match="must be a multiple of 256 for q6_K"):
        moejit.Linear(c, format="q6_K", weight=np.zeros((4, 210 * 2), np.uint8), cols=384)
    with pytest.raises(IA, match="format q4_K has no separate scales"):
        moejit.Linear(c, format="q4_K", weight=b.data[0], scales=np.zeros((64, 2), np.uint8))
    # A GGUF tensor's [rows, blocks, bytes] shape is taken as it is.
    lin = moejit.Linear(c, format="q4_K", weight=b.data[0].reshape(64, 2, 144))
    assert (lin.rows, lin.cols) == (64, 512)
    lin = moejit.Linear(c, format=9, weight=b.data[0])
    assert lin.cols == 512
