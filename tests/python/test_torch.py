"""torch CPU tensors as banks, inputs and outputs (skipped where torch is not
installed: CI's test venv has no torch; the GPU machine does)."""

import numpy as np
import pytest

import moejit
from moejit_ref import assert_close, make_bank, moe_reference, rand_bf16, routes

torch = pytest.importorskip("torch")

E, H, I, K = 4, 256, 128, 2


def test_bf16_and_fp8_tensors_in_place(rng):
    ctx = moejit.Context(num_threads=2)
    gu = make_bank("fp8_block", E, 2 * I, H, rng)
    dn = make_bank("fp8_block", E, H, I, rng)
    w13 = torch.from_numpy(gu.data.view(np.uint8)).view(torch.float8_e4m3fn)
    w2 = torch.from_numpy(dn.data.view(np.uint8)).view(torch.float8_e4m3fn)
    s13 = torch.from_numpy(gu.scales.view(np.int16)).view(torch.bfloat16)
    s2 = [torch.from_numpy(s.view(np.int16)).view(torch.bfloat16) for s in dn.scales]
    if torch.cuda.is_available():  # pinned host memory, as an engine keeps offloaded experts
        w13 = w13.pin_memory()
    moe = moejit.MoE(ctx, format="fp8_block", gate_up=w13, down=w2, gate_up_scales=s13, down_scales=s2, top_k=K)
    p = moe.bank_pointers()
    assert p["gate_up"][1]["data"] == w13.data_ptr() + w13.stride(0) * w13.element_size()
    assert p["down"][3]["scales"] == s2[3].data_ptr()
    x = torch.from_numpy(rand_bf16(rng, (3, H)).view(np.int16)).view(torch.bfloat16)
    ids, w = routes(rng, 3, E, K)
    y = moe.forward(x, torch.from_numpy(ids), torch.from_numpy(w))
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and tuple(y.shape) == (3, H)
    ref, bound = moe_reference(x.float().numpy(), ids, w, gu.deq, dn.deq)
    assert_close(y.float().numpy(), ref, bound, True)
    out = torch.empty((3, H), dtype=torch.bfloat16)
    assert moe.submit(x, torch.from_numpy(ids), torch.from_numpy(w), out=out).wait() is out
    assert torch.equal(out, y)


def test_tensor_errors(rng):
    ctx = moejit.Context(num_threads=1)
    gu = torch.zeros((E, 2 * I, H), dtype=torch.bfloat16)
    dn = torch.zeros((E, H, I), dtype=torch.bfloat16)
    moe = moejit.MoE(ctx, format="bf16", gate_up=gu, down=dn, top_k=K, output_dtype="f32")
    x = torch.zeros((2, H), dtype=torch.bfloat16, requires_grad=True)
    ids = torch.zeros((2, K), dtype=torch.int32)
    w = torch.ones((2, K))
    assert moe.forward(x, ids, w).dtype == torch.float32
    with pytest.raises(moejit.InvalidArgument, match="topk_ids: dtype int64 cannot hold int32"):
        moe.forward(x, ids.long(), w)
    with pytest.raises(moejit.InvalidArgument, match="x: .* is not C-contiguous"):
        moe.forward(torch.zeros((H, 2), dtype=torch.bfloat16).t(), ids, w)
    with pytest.raises(moejit.InvalidArgument, match="x: dtype float16 cannot hold the bf16 activations"):
        moe.forward(x.half(), ids, w)
    if torch.cuda.is_available():
        with pytest.raises(moejit.InvalidArgument, match="is on cuda"):
            moe.forward(x.detach().cuda(), ids, w)
