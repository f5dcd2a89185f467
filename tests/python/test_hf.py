"""moejit.hf: gpt-oss safetensors checkpoints (written here by safetensors.numpy.save_file
in the gpt-oss naming scheme), read in place from memory maps, against a float64
reference; and the layouts it does not serve yet."""

import json
import os

import numpy as np
import pytest

import moejit
import moejit.hf
from moejit_ref import BF16, E2M1, assert_close, make_bank, moe_reference, rand_bf16, routes

safetensors_numpy = pytest.importorskip("safetensors.numpy")
pytestmark = pytest.mark.skipif(E2M1 is None, reason="ml_dtypes has no float4_e2m1fn")

E, H, I, K = 4, 128, 96, 2


def gpt_oss_tensors(rng, layer=0):
    gu = make_bank("mxfp4", E, 2 * I, H, rng)
    dn = make_bank("mxfp4", E, H, I, rng)
    p = f"model.layers.{layer}.mlp"
    t = {
        f"{p}.experts.gate_up_proj_blocks": gu.data.reshape(E, 2 * I, H // 32, 16),
        f"{p}.experts.gate_up_proj_scales": gu.scales,
        f"{p}.experts.gate_up_proj_bias": rand_bf16(rng, (E, 2 * I), 0.1),
        f"{p}.experts.down_proj_blocks": dn.data.reshape(E, H, I // 32, 16),
        f"{p}.experts.down_proj_scales": dn.scales,
        f"{p}.experts.down_proj_bias": rand_bf16(rng, (E, H), 0.1),
        f"{p}.router.weight": rand_bf16(rng, (E, H)),
        f"{p}.router.bias": rand_bf16(rng, (E,)),
    }
    return t, gu, dn


def check_layer(moe, t, gu, dn, rng, layer=0, limit=7.0):
    p = f"model.layers.{layer}.mlp.experts"
    x = rand_bf16(rng, (3, H))
    ids, w = routes(rng, 3, E, K)
    y = moe.forward(x, ids, w)
    ref, bound = moe_reference(x, ids, w, gu.deq, dn.deq, act="swiglu_oai", interleaved=True,
                               gate_up_bias=t[f"{p}.gate_up_proj_bias"].astype(np.float64),
                               down_bias=t[f"{p}.down_proj_bias"].astype(np.float64), limit=limit)
    assert_close(y, ref, bound, True, "gpt-oss layer")


def test_gpt_oss_file_in_place(tmp_path, rng):
    t, gu, dn = gpt_oss_tensors(rng)
    path = tmp_path / "model.safetensors"
    safetensors_numpy.save_file(t, str(path))
    ctx = moejit.Context(num_threads=2)
    moe = moejit.hf.moe_layer(path, 0, context=ctx, top_k=K)
    assert (moe.format, moe.num_experts, moe.hidden, moe.intermediate, moe.top_k) == ("mxfp4", E, H, I, K)
    assert moe.activation == "swiglu_oai"
    check_layer(moe, t, gu, dn, rng)
    # The values are what safetensors' own reader returns.
    ck = moejit.hf.Checkpoint(path)
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        assert sorted(f.keys()) == sorted(ck.keys())
        for name in f.keys():
            assert np.array_equal(f.get_tensor(name).view(np.uint8), ck.tensor(name).view(np.uint8))


def test_gpt_oss_zero_copy_from_the_map(tmp_path, rng):
    t, gu, dn = gpt_oss_tensors(rng)
    path = tmp_path / "model.safetensors"
    safetensors_numpy.save_file(t, str(path))
    ck = moejit.hf.Checkpoint(path)
    moe = moejit.hf.moe_layer(ck, 0, top_k=K)
    mm = ck.files[0]._map
    assert isinstance(mm, np.memmap) and mm.mode == "r"
    lo = mm.__array_interface__["data"][0]
    hi = lo + mm.size
    ptrs = moe.bank_pointers()
    p = "model.layers.0.mlp.experts."
    for bank, name in (("gate_up", "gate_up_proj"), ("down", "down_proj")):
        for key, suffix in (("data", "_blocks"), ("scales", "_scales"), ("bias", "_bias")):
            a = ck.tensor(p + name + suffix)
            start = a.__array_interface__["data"][0]
            assert lo <= start < hi  # a view of the map, not a copy
            for e in range(E):
                assert ptrs[bank][e][key] == start + e * a.strides[0]
    del ck, mm
    check_layer(moe, t, gu, dn, rng)  # the layer keeps the map alive


def test_gpt_oss_sharded_directory_with_config(tmp_path, rng):
    t, gu, dn = gpt_oss_tensors(rng, layer=1)
    names = sorted(t)
    safetensors_numpy.save_file({k: t[k] for k in names[:3]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    safetensors_numpy.save_file({k: t[k] for k in names[3:]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"num_experts_per_tok": K, "swiglu_limit": 0.5}))
    moe = moejit.hf.moe_layer(tmp_path, 1)
    assert moe.top_k == K
    check_layer(moe, t, gu, dn, rng, layer=1, limit=0.5)


def test_layouts_and_errors(tmp_path, rng):
    t, _, _ = gpt_oss_tensors(rng)
    path = tmp_path / "m.safetensors"
    safetensors_numpy.save_file(t, str(path))
    with pytest.raises(moejit.InvalidArgument, match="top_k is not given"):
        moejit.hf.moe_layer(path, 0)
    with pytest.raises(moejit.InvalidArgument, match="no tensors of layer 5"):
        moejit.hf.moe_layer(path, 5, top_k=K)
    # DeepSeek-V3 / Qwen3 naming: gate and up apart.
    ds = {f"model.layers.0.mlp.experts.{e}.{p}.weight": np.zeros((8, 8), np.uint8)
          for e in range(2) for p in ("gate_proj", "up_proj", "down_proj")}
    safetensors_numpy.save_file(ds, str(tmp_path / "ds.safetensors"))
    with pytest.raises(moejit.Unsupported, match="separate gate/up banks"):
        moejit.hf.moe_layer(tmp_path / "ds.safetensors", 0, top_k=2)
    # Not a safetensors file, or one whose header lies.
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00")
    with pytest.raises(moejit.InvalidArgument, match="shorter than 8 bytes"):
        moejit.hf.Checkpoint(bad)
    bad.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    with pytest.raises(moejit.InvalidArgument, match="beyond the file"):
        moejit.hf.Checkpoint(bad)
    hdr = json.dumps({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 400]}}).encode()
    bad.write_bytes(len(hdr).to_bytes(8, "little") + hdr + b"\0" * 4)
    with pytest.raises(moejit.InvalidArgument, match="outside the file"):
        moejit.hf.Checkpoint(bad)
    with pytest.raises(moejit.InvalidArgument, match="no .safetensors files"):
        os.makedirs(tmp_path / "empty")
        moejit.hf.moe_layer(tmp_path / "empty", 0)
