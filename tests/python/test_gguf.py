"""moejit.gguf: MoE layers from GGUF files written here by gguf-py's GGUFWriter (raw
quantized tensor bytes: gguf-py's quantizers for Q8_0 / Q4_0, random valid blocks
for the K-quants), read in place from the reader's map, against a float64
reference; zero copy, lifetimes, per-projection formats and the errors."""

import gc
import weakref

import numpy as np
import pytest

import moejit
import moejit.gguf
from moejit_ref import KQUANTS, assert_close, make_bank, moe_reference, rand_bf16, routes

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

E, H, K, T = 4, 256, 2, 3
GGML = {"bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0", **{f: v[0] for f, v in KQUANTS.items()}}
SERVED = [f for f in GGML if f in moejit.formats()]


def i_for(*fmts):
    return 256 if any(f in KQUANTS for f in fmts) else 128  # the K-quants' K (down's: I) is a multiple of 256


def raw(bank, fmt):
    """The bank's data as GGUFWriter takes raw tensors: bytes [E, rows, row bytes] (uint16 for BF16)."""
    if fmt == "bf16":
        return bank.data.view(np.uint16), Q.BF16
    return bank.data, getattr(Q, GGML[fmt])


def write(path, tensors, *, arch="qwen3moe", meta=None, blocks=2):
    """A GGUF file of `tensors` ({name: (array, GGML type or None)}) and llama.cpp's keys."""
    w = gguf.GGUFWriter(str(path), arch)
    m = {"block_count": blocks, "expert_count": E, "expert_used_count": K, "embedding_length": H}
    m.update(meta or {})
    for key, v in m.items():
        if v is None:
            continue
        name = key if "." in key else f"{arch}.{key}"
        if isinstance(v, list):
            w.add_array(name, v)
        elif isinstance(v, float):
            w.add_float32(name, v)
        else:
            w.add_uint32(name, v)
    for name, (a, t) in tensors.items():
        w.add_tensor(name, a, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def layer_tensors(rng, fmts, layer=1, inter=None, fused=False):
    """Banks of one block in formats (gate, up, down) and their GGUF tensors."""
    gf, uf, df = fmts
    inter = inter or i_for(*fmts)
    g = make_bank(gf, E, inter, H, rng)
    u = make_bank(uf, E, inter, H, rng)
    d = make_bank(df, E, H, inter, rng)
    p = f"blk.{layer}"
    t = {f"{p}.ffn_gate_inp.weight": (rng.standard_normal((E, H)).astype(np.float32), None)}
    if fused:
        assert gf == uf
        a = np.concatenate([raw(g, gf)[0], raw(u, uf)[0]], axis=1)
        t[f"{p}.ffn_gate_up_exps.weight"] = (a, raw(g, gf)[1])
    else:
        t[f"{p}.ffn_gate_exps.weight"] = raw(g, gf)
        t[f"{p}.ffn_up_exps.weight"] = raw(u, uf)
    t[f"{p}.ffn_down_exps.weight"] = raw(d, df)
    return t, g, u, d, inter


def check(moe, g, u, d, rng, **ref_kw):
    x = rand_bf16(rng, (T, H))
    ids, w = routes(rng, T, E, K)
    y = moe.forward(x, ids, w)
    ref, bound = moe_reference(x, ids, w, np.concatenate([g.deq, u.deq], axis=1), d.deq, **ref_kw)
    assert_close(y, ref, bound, True, f"gguf layer {moe.formats}")


def addr(a):
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("fmt", SERVED)
def test_every_served_type(tmp_path, rng, fmt):
    t, g, u, d, inter = layer_tensors(rng, (fmt, fmt, fmt))
    path = write(tmp_path / "m.gguf", t, meta={"expert_feed_forward_length": inter})
    moe = moejit.gguf.moe_layer(path, 1, moejit.Context(num_threads=2))
    assert (moe.num_experts, moe.hidden, moe.intermediate, moe.top_k) == (E, H, inter, K)
    assert moe.separate_banks and moe.activation == "silu"
    assert [f.format for f in moe.formats.values()] == [fmt] * 3
    check(moe, g, u, d, rng)
    # The file's bytes decode (gguf-py) to the reference's weights.
    src = moe.source
    assert src.tensors["down"] == ("blk.1.ffn_down_exps.weight", GGML[fmt])
    tensor = {x.name: x for x in src.readers[0].tensors}["blk.1.ffn_down_exps.weight"]
    assert np.array_equal(gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float64), d.deq)


def test_q4_K_M_layer(tmp_path, rng):
    # A Q4_K_M file's expert layer: gate and up Q4_K, down Q6_K, each projection its own format.
    if "q4_K" not in moejit.formats() or "q6_K" not in moejit.formats():
        def blocks(rows, k, nbytes):
            return rng.integers(0, 256, size=(E, rows, k // 256 * nbytes), dtype=np.uint8)

        p = "blk.0"
        t = {f"{p}.ffn_gate_exps.weight": (blocks(256, H, 144), Q.Q4_K),
             f"{p}.ffn_up_exps.weight": (blocks(256, H, 144), Q.Q4_K),
             f"{p}.ffn_down_exps.weight": (blocks(H, 256, 210), Q.Q6_K)}
        path = write(tmp_path / "q4_k_m.gguf", t)
        with pytest.raises(moejit.Unsupported, match=r"blk\.0\.ffn_gate_exps\.weight is GGML type Q4_K, which "
                                                     r"needs moejit format q4_K: libmoejit .* does not have it"):
            moejit.gguf.moe_layer(path, 0)
        return
    t, g, u, d, _ = layer_tensors(rng, ("q4_K", "q4_K", "q6_K"), layer=0)
    moe = moejit.gguf.moe_layer(write(tmp_path / "q4_k_m.gguf", t), 0)
    assert moe.formats == {"gate": moejit.ProjFormat("q4_K", "bf16", 0), "up": moejit.ProjFormat("q4_K", "bf16", 0),
                           "down": moejit.ProjFormat("q6_K", "bf16", 0)}
    check(moe, g, u, d, rng)


def test_mixed_types_per_projection(tmp_path, rng):
    t, g, u, d, _ = layer_tensors(rng, ("q8_0", "q4_0", "bf16"), inter=96)
    moe = moejit.gguf.moe_layer(write(tmp_path / "mix.gguf", t), 1)
    assert [f.format for f in moe.formats.values()] == ["q8_0", "q4_0", "bf16"]
    assert moe.intermediate == 96
    check(moe, g, u, d, rng)


def test_fused_gate_up_tensor(tmp_path, rng):
    # ffn_gate_up_exps: gate rows [0, I), up rows [I, 2I) (llama.cpp's build_moe_ffn views).
    t, g, u, d, _ = layer_tensors(rng, ("q8_0", "q8_0", "q8_0"), fused=True)
    moe = moejit.gguf.moe_layer(write(tmp_path / "fused.gguf", t), 1)
    assert not moe.separate_banks and list(moe.formats) == ["gate_up", "down"]
    check(moe, g, u, d, rng)


def test_zero_copy_from_the_map_and_lifetimes(tmp_path, rng):
    t, g, u, d, _ = layer_tensors(rng, ("q8_0", "q8_0", "bf16"))
    path = write(tmp_path / "m.gguf", t)
    reader = gguf.GGUFReader(str(path))
    moe = moejit.gguf.moe_layer(reader, 1)
    assert moe.source.readers[0] is reader
    mm = reader.data
    assert isinstance(mm, np.memmap) and mm.mode == "r"
    lo, hi = moe.source.mapping()
    assert (lo, hi) == (addr(mm), addr(mm) + mm.nbytes)
    ptrs = moe.bank_pointers()
    by_name = {x.name: x for x in reader.tensors}
    for bank in ("gate", "up", "down"):
        tensor = by_name[f"blk.1.ffn_{bank}_exps.weight"]
        start = lo + tensor.data_offset
        row = tensor.data.strides[0]
        for e in range(E):
            p = ptrs[bank][e]["data"]
            assert lo <= p and p + row <= hi  # inside the file's map: not a copy
            assert p == start + e * row
    # The layer holds the reader and its map: drop every other reference.
    alive = weakref.ref(reader)
    del reader, mm, by_name, tensor
    gc.collect()
    assert alive() is not None
    check(moe, g, u, d, rng)
    moe.close()
    del moe
    gc.collect()
    assert alive() is None

    # From a path: nothing but the layer refers to the reader.
    moe = moejit.gguf.moe_layer(str(path), 1)
    gc.collect()
    check(moe, g, u, d, rng)


def test_architectures_and_biases(tmp_path, rng):
    # gpt-oss: swiglu_oai (alpha 1.702, limit 7) and bf16 biases per expert, read in place.
    t, g, u, d, inter = layer_tensors(rng, ("q8_0", "q8_0", "q8_0"))
    bias = {p: rand_bf16(rng, (E, n), 0.1) for p, n in (("gate", inter), ("up", inter), ("down", H))}
    for p, b in bias.items():
        t[f"blk.1.ffn_{p}_exps.bias"] = (b.view(np.uint16), Q.BF16)
    moe = moejit.gguf.moe_layer(write(tmp_path / "oss.gguf", t, arch="gpt-oss"), 1)
    assert moe.activation == "swiglu_oai"
    lo, hi = moe.source.mapping()
    assert all(lo <= m["bias"] < hi for bank in moe.bank_pointers().values() for m in bank)
    check(moe, g, u, d, rng, act="swiglu_oai", limit=7.0,
          gate_up_bias=np.concatenate([bias["gate"], bias["up"]], axis=1).astype(np.float64),
          down_bias=bias["down"].astype(np.float64))
    # Llama 4 applies the router weight to the experts' input.
    t, g, u, d, _ = layer_tensors(rng, ("q8_0", "q8_0", "q8_0"))
    moe = moejit.gguf.moe_layer(write(tmp_path / "l4.gguf", t, arch="llama4"), 1)
    check(moe, g, u, d, rng, weight_on_input=True)
    # An architecture moejit does not know needs activation=; overrides win.
    path = write(tmp_path / "new.gguf", t, arch="brandnew")
    with pytest.raises(moejit.InvalidArgument, match="architecture 'brandnew': moejit does not know"):
        moejit.gguf.moe_layer(path, 1)
    moe = moejit.gguf.moe_layer(path, 1, activation="gelu", top_k=1)
    assert (moe.activation, moe.top_k) == ("gelu", 1)


def test_metadata_checks_and_overrides(tmp_path, rng):
    t, g, u, d, inter = layer_tensors(rng, ("q8_0", "q8_0", "q8_0"))
    path = write(tmp_path / "bad_meta.gguf", t, meta={"expert_count": E + 4, "expert_used_count": None})
    with pytest.raises(moejit.InvalidArgument, match=r"qwen3moe\.expert_count = 8 but blk\.1\.ffn_gate_exps\.weight "
                                                     r"has 4"):
        moejit.gguf.moe_layer(path, 1)
    with pytest.raises(moejit.InvalidArgument, match=r"no qwen3moe\.expert_used_count: pass top_k"):
        moejit.gguf.moe_layer(path, 1, num_experts=E)
    moe = moejit.gguf.moe_layer(path, 1, num_experts=E, top_k=K)
    check(moe, g, u, d, rng)
    # An override the tensors disagree with is the layer's error.
    with pytest.raises(moejit.InvalidArgument, match="gate"):
        moejit.gguf.moe_layer(path, 1, num_experts=E, top_k=K, intermediate=inter + 32)
    path = write(tmp_path / "bad_ff.gguf", t, meta={"expert_feed_forward_length": inter * 2})
    with pytest.raises(moejit.InvalidArgument, match="expert_feed_forward_length"):
        moejit.gguf.moe_layer(path, 1)


def test_missing_tensors_and_wrong_shapes(tmp_path, rng):
    t, _, _, _, inter = layer_tensors(rng, ("q8_0", "q8_0", "q8_0"), layer=1)
    t["blk.0.ffn_gate.weight"] = (np.zeros((64, H), np.float32), None)  # a dense block
    path = write(tmp_path / "m.gguf", t)
    with pytest.raises(moejit.InvalidArgument, match=r"blk\.0\.ffn_gate_exps\.weight, blk\.0\.ffn_up_exps\.weight, "
                                                     r"blk\.0\.ffn_down_exps\.weight not found \(blocks with routed "
                                                     r"experts: 1\)"):
        moejit.gguf.moe_layer(path, 0)
    no_up = {k: v for k, v in t.items() if "ffn_up_exps" not in k}
    with pytest.raises(moejit.InvalidArgument, match=r"blk\.1\.ffn_up_exps\.weight not found"):
        moejit.gguf.moe_layer(write(tmp_path / "no_up.gguf", no_up), 1)
    with pytest.raises(moejit.InvalidArgument, match="layer must be a block index"):
        moejit.gguf.moe_layer(path, -1)
    # down of the wrong hidden size.
    bad = dict(t)
    bad["blk.1.ffn_down_exps.weight"] = raw(make_bank("q8_0", E, H + 32, inter, rng), "q8_0")
    with pytest.raises(moejit.InvalidArgument, match=r"blk\.1\.ffn_down_exps\.weight: ne = \[128, 288, 4\], expected "
                                                     r"\[128, 256, 4\]"):
        moejit.gguf.moe_layer(write(tmp_path / "bad_down.gguf", bad), 1)
    # up with another expert count.
    bad = dict(t)
    bad["blk.1.ffn_up_exps.weight"] = raw(make_bank("q8_0", E - 1, inter, H, rng), "q8_0")
    with pytest.raises(moejit.InvalidArgument, match=r"ffn_up_exps\.weight: ne = \[256, 128, 3\]"):
        moejit.gguf.moe_layer(write(tmp_path / "bad_up.gguf", bad), 1)
    # Not 3-D.
    bad = dict(t)
    bad["blk.1.ffn_gate_exps.weight"] = (make_bank("q8_0", 1, inter, H, rng).data[0], Q.Q8_0)
    with pytest.raises(moejit.InvalidArgument, match=r"expected 3 dimensions ne = \[K, rows, n_expert\]"):
        moejit.gguf.moe_layer(write(tmp_path / "2d.gguf", bad), 1)
    # Not a GGUF file; no file.
    (tmp_path / "x.gguf").write_bytes(b"not a gguf file at all" * 4)
    with pytest.raises(moejit.InvalidArgument, match="not a GGUF file gguf-py can read"):
        moejit.gguf.moe_layer(tmp_path / "x.gguf", 0)
    with pytest.raises(moejit.InvalidArgument, match="no such file"):
        moejit.gguf.moe_layer(tmp_path / "none.gguf", 0)
    with pytest.raises(moejit.InvalidArgument, match="path is empty"):
        moejit.gguf.moe_layer([], 0)


def test_split_files(tmp_path, rng):
    t, g, u, d, _ = layer_tensors(rng, ("q8_0", "q8_0", "q8_0"))
    names = sorted(t)
    a = write(tmp_path / "m-00001-of-00002.gguf", {n: t[n] for n in names[:2]}, meta={"split.count": 2})
    b = write(tmp_path / "m-00002-of-00002.gguf", {n: t[n] for n in names[2:]}, meta={"split.count": 2})
    with pytest.raises(moejit.InvalidArgument, match="split into 2 files: pass them all"):
        moejit.gguf.moe_layer(a, 1)
    moe = moejit.gguf.moe_layer([a, b], 1)
    check(moe, g, u, d, rng)
    file_of = {x.name: p for p, r in zip(moe.source.paths, moe.source.readers) for x in r.tensors}
    assert len(set(file_of.values())) == 2
    for bank, ptrs in moe.bank_pointers().items():
        lo, hi = moe.source.mapping(file_of[f"blk.1.ffn_{bank}_exps.weight"])
        assert all(lo <= m["data"] < hi for m in ptrs)  # each bank in its own file's map


def test_types_moejit_does_not_serve(tmp_path, rng):
    t, _, _, _, inter = layer_tensors(rng, ("q8_0", "q8_0", "q8_0"))
    w = rng.standard_normal((E, H, inter)).astype(np.float32) * 0.05
    cases = {
        "F16": ((w.astype(np.float16)), None, r"GGML type F16: moejit has no fp16 weight format"),
        "F32": ((w), None, r"GGML type F32: moejit has no fp32 weight format"),
        "IQ4_NL": (rng.integers(0, 256, size=(E, H, inter // 32 * 18), dtype=np.uint8), Q.IQ4_NL,
                   r"GGML type IQ4_NL: moejit has no format for it\. moejit serves BF16 \(bf16\)"),
    }
    if hasattr(Q, "MXFP4"):
        cases["MXFP4"] = (gguf.quants.quantize(w, Q.MXFP4), Q.MXFP4, r"GGML type MXFP4: ggml's MXFP4 blocks .* "
                                                                      r"cannot be read in place")
    for name, (a, qt, match) in cases.items():
        bad = dict(t)
        bad["blk.1.ffn_down_exps.weight"] = (a, qt)
        with pytest.raises(moejit.Unsupported, match=r"blk\.1\.ffn_down_exps\.weight is " + match):
            moejit.gguf.moe_layer(write(tmp_path / f"{name}.gguf", bad), 1)


def test_what_the_layer_would_leave_out(tmp_path, rng):
    t, _, _, _, inter = layer_tensors(rng, ("q8_0", "q8_0", "q8_0"))
    # Per-expert scale tensors (llama.cpp's *_exps_s).
    bad = dict(t)
    bad["blk.1.ffn_gate_exps.scale"] = (np.ones(E, np.float32), None)
    with pytest.raises(moejit.Unsupported, match=r"blk\.1\.ffn_gate_exps\.scale: per-expert tensors other than "
                                                 r"weight and bias \(here 'scale'\)"):
        moejit.gguf.moe_layer(write(tmp_path / "s.gguf", bad), 1)
    # A SwiGLU clamp for this block.
    path = write(tmp_path / "clamp.gguf", t, meta={"swiglu_clamp_exp": [0.0, 7.0]})
    with pytest.raises(moejit.Unsupported, match=r"qwen3moe\.swiglu_clamp_exp = 7\.0 for block 1"):
        moejit.gguf.moe_layer(path, 1)
    # ... but not for block 1 of a file that clamps only block 0.
    t0, g, u, d, _ = layer_tensors(rng, ("q8_0", "q8_0", "q8_0"))
    check(moejit.gguf.moe_layer(write(tmp_path / "clamp0.gguf", t0, meta={"swiglu_clamp_exp": [7.0, 0.0]}), 1),
          g, u, d, rng)
    # f32 biases (gpt-oss's GGUF conversion) would have to be converted.
    bad = dict(t)
    bad["blk.1.ffn_down_exps.bias"] = (np.zeros((E, H), np.float32), None)
    with pytest.raises(moejit.Unsupported, match=r"blk\.1\.ffn_down_exps\.bias is F32: moejit's biases are bf16"):
        moejit.gguf.moe_layer(write(tmp_path / "b.gguf", bad, arch="gpt-oss"), 1)
    bad["blk.1.ffn_down_exps.bias"] = (np.zeros((E, H + 1), np.uint16), Q.BF16)
    with pytest.raises(moejit.InvalidArgument,
                       match=r"ffn_down_exps\.bias: ne = \[257, 4\], expected \[rows, n_expert\] = \[256, 4\]"):
        moejit.gguf.moe_layer(write(tmp_path / "b2.gguf", bad, arch="gpt-oss"), 1)


def test_format_mapping_follows_the_library():
    assert moejit.gguf.format_of(Q.Q8_0, "t") == "q8_0"
    assert moejit.gguf.format_of("BF16", "t") == "bf16"
    for ggml, fmt in moejit.gguf.FORMATS.items():
        if fmt in moejit.formats():
            assert moejit.gguf.format_of(ggml, "t") == fmt
        else:
            with pytest.raises(moejit.Unsupported, match=f"needs moejit format {fmt}"):
                moejit.gguf.format_of(ggml, "t")
