"""moejit.hf: safetensors checkpoints written here by safetensors.numpy.save_file in the
gpt-oss, DeepSeek-V3 and Qwen3 MoE (bf16 and FP8) naming schemes, read in place from
memory maps, against a float64 reference; zero copy, lifetimes and the errors."""

import gc
import json
import os
import weakref

import numpy as np
import pytest

import moejit
import moejit.hf
from moejit_ref import BF16, E2M1, assert_close, make_bank, moe_reference, rand_bf16, routes

safetensors_numpy = pytest.importorskip("safetensors.numpy")
needs_e2m1 = pytest.mark.skipif(E2M1 is None, reason="ml_dtypes has no float4_e2m1fn (gpt-oss's mxfp4)")

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


@needs_e2m1
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


@needs_e2m1
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


@needs_e2m1
def test_gpt_oss_sharded_directory_with_config(tmp_path, rng):
    t, gu, dn = gpt_oss_tensors(rng, layer=1)
    names = sorted(t)
    safetensors_numpy.save_file({k: t[k] for k in names[:3]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    safetensors_numpy.save_file({k: t[k] for k in names[3:]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"num_experts_per_tok": K, "swiglu_limit": 0.5}))
    moe = moejit.hf.moe_layer(tmp_path, 1)
    assert moe.top_k == K
    check_layer(moe, t, gu, dn, rng, layer=1, limit=0.5)


@needs_e2m1
def test_layouts_and_errors(tmp_path, rng):
    t, _, _ = gpt_oss_tensors(rng)
    path = tmp_path / "m.safetensors"
    safetensors_numpy.save_file(t, str(path))
    with pytest.raises(moejit.InvalidArgument, match="top_k is not given"):
        moejit.hf.moe_layer(path, 0)
    with pytest.raises(moejit.InvalidArgument, match="no tensors of layer 5"):
        moejit.hf.moe_layer(path, 5, top_k=K)
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


# ---- one tensor per expert and projection: DeepSeek-V3, Qwen3 MoE (bf16 and FP8) ----

def addr(a):
    return a.__array_interface__["data"][0]


def per_expert_tensors(rng, layer, fmts, *, h=H, inter=I, scale_dtype="f32", experts=E):
    """{name: array} of one layer's routed experts (formats per projection: "bf16" or
    "fp8_block"), and the banks (their float64 weights) for the reference."""
    p = f"model.layers.{layer}.mlp"
    t = {f"{p}.gate.weight": rand_bf16(rng, (experts, h))}
    banks = {}
    for proj, fmt, rows, k in (("gate", fmts[0], inter, h), ("up", fmts[1], inter, h), ("down", fmts[2], h, inter)):
        b = make_bank(fmt, experts, rows, k, rng, scale_dtype=scale_dtype)
        banks[proj] = b
        for e in range(experts):
            t[f"{p}.experts.{e}.{proj}_proj.weight"] = b.data[e]
            if b.scales is not None:
                t[f"{p}.experts.{e}.{proj}_proj.weight_scale_inv"] = b.scales[e]
    return t, banks


def deepseek_config(**kw):
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_act": "silu", "num_experts_per_tok": K,
           "n_routed_experts": E, "n_shared_experts": 1, "first_k_dense_replace": 1,
           "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                   "activation_scheme": "dynamic"}}
    cfg.update(kw)
    return cfg


def check_separate(moe, banks, rng, h=H, act="silu"):
    x = rand_bf16(rng, (3, h))
    ids, w = routes(rng, 3, E, K)
    ref, bound = moe_reference(x, ids, w, np.concatenate([banks["gate"].deq, banks["up"].deq], axis=1),
                               banks["down"].deq, act=act)
    assert_close(moe.forward(x, ids, w), ref, bound, True, f"{moe.formats}")


def test_deepseek_v3_fp8_in_place(tmp_path, rng):
    # H 384 (three 128-blocks), I 160 (a partial block): fp8 e4m3 weights, fp32 128x128 scales.
    h, inter = 384, 160
    t, banks = per_expert_tensors(rng, 1, ("fp8_block",) * 3, h=h, inter=inter)
    t["model.layers.0.mlp.gate_proj.weight"] = rand_bf16(rng, (inter, h))  # the dense first layer
    t["model.layers.1.mlp.shared_experts.gate_proj.weight"] = t["model.layers.1.mlp.experts.0.gate_proj.weight"]
    t["model.layers.1.mlp.shared_experts.gate_proj.weight_scale_inv"] = banks["gate"].scales[0]
    path = tmp_path / "model-00001-of-00001.safetensors"
    safetensors_numpy.save_file(t, str(path))
    (tmp_path / "config.json").write_text(json.dumps(deepseek_config()))
    moe = moejit.hf.moe_layer(path, 1, context=moejit.Context(num_threads=2))  # config.json next to the file
    assert (moe.num_experts, moe.hidden, moe.intermediate, moe.top_k, moe.activation) == (E, h, inter, K, "silu")
    assert moe.separate_banks
    assert moe.formats == {p: moejit.ProjFormat("fp8_block", "f32", 0) for p in ("gate", "up", "down")}
    check_separate(moe, banks, rng, h=h)
    # Every address the layer reads is the tensor's own, inside the file's map.
    ck = moe.source
    mm = ck.files[0]._map
    lo, hi = addr(mm), addr(mm) + mm.size
    ptrs = moe.bank_pointers()
    for proj in ("gate", "up", "down"):
        for e in range(E):
            base = f"model.layers.1.mlp.experts.{e}.{proj}_proj"
            w, sc = ck.tensor(f"{base}.weight"), ck.tensor(f"{base}.weight_scale_inv")
            assert ptrs[proj][e]["data"] == addr(w) and ptrs[proj][e]["scales"] == addr(sc)
            assert lo <= addr(w) and addr(w) + w.nbytes <= hi
            assert lo <= addr(sc) and addr(sc) + sc.nbytes <= hi
    # The layer keeps the checkpoint and its maps alive.
    alive = weakref.ref(ck)
    del ck, mm, w, sc
    gc.collect()
    assert alive() is not None
    check_separate(moe, banks, rng, h=h)
    del moe
    gc.collect()
    assert alive() is None
    # The dense first layer has no routed experts.
    with pytest.raises(moejit.InvalidArgument, match=r"model\.layers\.0\.mlp: model\.layers\.0\.mlp\.gate_proj\.weight "
                                                     r"but no routed experts"):
        moejit.hf.moe_layer(path, 0)


def test_qwen3_moe_bf16_sharded(tmp_path, rng):
    t, banks = per_expert_tensors(rng, 2, ("bf16",) * 3)
    names = sorted(t)
    half = len(names) // 2
    safetensors_numpy.save_file({k: t[k] for k in names[:half]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    safetensors_numpy.save_file({k: t[k] for k in names[half:]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"], "hidden_act": "silu",
                                                      "num_experts": E, "num_experts_per_tok": K,
                                                      "moe_intermediate_size": I, "norm_topk_prob": True}))
    moe = moejit.hf.moe_layer(tmp_path, 2)
    assert moe.formats["down"] == moejit.ProjFormat("bf16", "bf16", 0)
    check_separate(moe, banks, rng)
    ck = moe.source
    maps = [(addr(f._map), addr(f._map) + f._map.size) for f in ck.files]
    for proj, ptrs in moe.bank_pointers().items():
        for m in ptrs:
            assert any(lo <= m["data"] < hi for lo, hi in maps)
            assert m["scales"] == 0
    # Keyword arguments instead of config.json.
    os.remove(tmp_path / "config.json")
    moe = moejit.hf.moe_layer(sorted(str(p) for p in tmp_path.glob("*.safetensors")), 2, top_k=1,
                              activation="gelu_tanh")
    assert (moe.top_k, moe.activation) == (1, "gelu_tanh")


@pytest.mark.parametrize("scale_dtype", ["f32", "bf16"])
def test_qwen3_moe_fp8(tmp_path, rng, scale_dtype):
    # Qwen3-30B-A3B-FP8's layout: fp8 weights with 128x128 weight_scale_inv per expert.
    t, banks = per_expert_tensors(rng, 0, ("fp8_block",) * 3, scale_dtype=scale_dtype)
    safetensors_numpy.save_file(t, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_act": "silu", "num_experts": E, "num_experts_per_tok": K,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}))
    moe = moejit.hf.moe_layer(tmp_path / "model.safetensors", 0)
    assert all(f == moejit.ProjFormat("fp8_block", scale_dtype, 0) for f in moe.formats.values())
    check_separate(moe, banks, rng)


def test_per_projection_formats(tmp_path, rng):
    # fp8 gate and up with a bf16 down: each projection in its own format.
    t, banks = per_expert_tensors(rng, 0, ("fp8_block", "fp8_block", "bf16"))
    safetensors_numpy.save_file(t, str(tmp_path / "m.safetensors"))
    moe = moejit.hf.moe_layer(tmp_path / "m.safetensors", 0, top_k=K, activation="silu")
    assert [f.format for f in moe.formats.values()] == ["fp8_block", "fp8_block", "bf16"]
    check_separate(moe, banks, rng)


def test_safe_open_numpy_copies(tmp_path, rng):
    # Why moejit.hf maps the files itself: safetensors' numpy get_tensor returns a new,
    # writable buffer at every call, outside any map of the file.
    t, _ = per_expert_tensors(rng, 0, ("bf16",) * 3)
    path = str(tmp_path / "m.safetensors")
    safetensors_numpy.save_file(t, path)
    from safetensors import safe_open

    name = "model.layers.0.mlp.experts.1.down_proj.weight"
    with safe_open(path, framework="numpy") as f:
        a, b = f.get_tensor(name), f.get_tensor(name)
        maps = []
        with open("/proc/self/maps") as m:
            for line in m:
                if line.rstrip().endswith(os.path.realpath(path)):
                    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                    maps.append((lo, hi))
    assert addr(a) != addr(b) and a.flags.writeable
    assert not any(lo <= addr(a) < hi for lo, hi in maps)
    ck = moejit.hf.Checkpoint(path)
    v = ck.tensor(name)
    assert not v.flags.writeable and np.array_equal(v.view(np.uint16), a.view(np.uint16))
    assert addr(ck.tensor(name)) == addr(v)  # the map, every time


def save(tmp_path, t, name="m.safetensors"):
    path = tmp_path / name
    safetensors_numpy.save_file(t, str(path))
    return path


def test_per_expert_errors(tmp_path, rng):
    t, banks = per_expert_tensors(rng, 0, ("fp8_block",) * 3)
    p = "model.layers.0.mlp.experts"
    IA, UN = moejit.InvalidArgument, moejit.Unsupported

    def fails(exc, match, tensors, cfg=None, **kw):
        d = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        path = save(d, tensors)
        if cfg is not None:
            (d / "config.json").write_text(json.dumps(cfg))
        kw.setdefault("top_k", K)
        kw.setdefault("activation", "silu")
        with pytest.raises(exc, match=match) as info:
            moejit.hf.moe_layer(path, 0, **kw)
        assert info.value.status == exc.status

    fails(IA, rf"{p}\.2\.up_proj\.weight is missing \(expert 2 of 4\)",
          {k: v for k, v in t.items() if not k.startswith(f"{p}.2.up_proj")})
    fails(IA, rf"{p}: experts 0\.\.3 have tensors but expert 1 has none",
          {k: v for k, v in t.items() if not k.startswith(f"{p}.1.")})
    fails(IA, rf"{p}\.3\.down_proj\.weight is fp8 \(e4m3\) but {p}\.3\.down_proj\.weight_scale_inv, its 128x128 "
              r"block scales, is missing", {k: v for k, v in t.items() if k != f"{p}.3.down_proj.weight_scale_inv"})
    fails(UN, rf"{p}\.0\.gate_proj\.weight_scale: moejit reads weight, weight_scale_inv",
          {**t, f"{p}.0.gate_proj.weight_scale": np.ones(1, np.float32)})
    f16 = {k: (v.astype(np.float32).astype(np.float16) if k.endswith("up_proj.weight") else v) for k, v in t.items()
           if not k.endswith("up_proj.weight_scale_inv")}
    fails(UN, rf"{p}\.0\.up_proj\.weight has dtype float16: moejit reads bf16 or float8_e4m3fn", f16)
    mixed = dict(t)
    mixed[f"{p}.2.gate_proj.weight"] = banks["gate"].deq[2].astype(np.float32).astype(BF16)
    fails(IA, rf"{p}\.2\.gate_proj\.weight_scale_inv: a bf16 weight has no block scales", mixed)
    del mixed[f"{p}.2.gate_proj.weight_scale_inv"]
    fails(IA, rf"{p}\.2\.gate_proj\.weight is bfloat16 but {p}\.0\.gate_proj\.weight is not", mixed)
    wrong = dict(t)
    wrong[f"{p}.1.down_proj.weight"] = t[f"{p}.1.down_proj.weight"][:, :64]
    fails(IA, rf"{p}\.1\.down_proj\.weight: shape \[128, 64\], but {p}\.0\.down_proj\.weight is \[128, 96\]", wrong)
    small = per_expert_tensors(rng, 0, ("fp8_block", "fp8_block", "fp8_block"), h=H, inter=I)[0]
    for e in range(E):
        small[f"{p}.{e}.down_proj.weight"] = small[f"{p}.{e}.down_proj.weight"][:64]
    fails(IA, rf"{p}: gate_proj \[96, 128\], up_proj \[96, 128\] and down_proj \[64, 96\] do not fit one layer",
          small)
    # The scales' shape is checked by the layer, named by bank and expert.
    bad = dict(t)
    bad[f"{p}.0.gate_proj.weight_scale_inv"] = np.ones((2, 2), np.float32)
    fails(IA, r"gate_scales\[0\]: expected shape \[1, 1\]", bad)
    # config.json
    fails(IA, r"config\.json has 8 routed experts", t, deepseek_config(n_routed_experts=8))
    fails(UN, r"weight_block_size = \[64, 64\]", t,
          deepseek_config(quantization_config={"weight_block_size": [64, 64]}))
    fails(IA, r"activation is not given and no config\.json names hidden_act", t, activation=None)
    fails(UN, r"hidden_act = 'relu2' is none of moejit's activations", t, {"hidden_act": "relu2"}, activation=None)
    fails(IA, r"top_k is not given", t, top_k=None)
    (tmp_path / "bad").mkdir()
    save(tmp_path / "bad", t)
    (tmp_path / "bad" / "config.json").write_text("{not json")
    with pytest.raises(IA, match="config.json: not JSON"):
        moejit.hf.moe_layer(tmp_path / "bad", 0)
