"""MoE layers from Hugging Face safetensors checkpoints, read in place.

Files are memory-mapped (``np.memmap``, read-only) and every bank is a view of
the map: nothing is read into memory until a call touches it, and nothing is
copied. The layer holds the views, so the maps live as long as the layer.

Layouts served:

* **gpt-oss** (``openai/gpt-oss-*``): per layer one interleaved gate_up bank in
  mxfp4, ``mlp.experts.gate_up_proj_blocks`` ``[E, 2I, H/32, 16]`` uint8 (two
  e2m1 codes per byte, low nibble first), ``gate_up_proj_scales`` ``[E, 2I, H/32]``
  uint8 (e8m0), ``gate_up_proj_bias`` ``[E, 2I]`` bf16 (row 2j gate j, 2j+1 up j),
  and ``down_proj_{blocks,scales,bias}`` ``[E, H, I/32, 16]``, ``[E, H, I/32]``,
  ``[E, H]``; activation swiglu_oai (alpha 1.702, limit ``swiglu_limit`` of
  config.json, 7.0).
* **One tensor per expert and projection** (DeepSeek-V3 / R1, Qwen3 MoE, Qwen3
  MoE FP8): ``mlp.experts.{e}.{gate,up,down}_proj.weight``, gate and up ``[I, H]``,
  down ``[H, I]``, in separate gate and up banks, each projection in its own
  format:

  - bf16 weights (Qwen3 MoE): bf16;
  - ``float8_e4m3fn`` weights with ``weight_scale_inv`` (DeepSeek-V3, Qwen3
    FP8): fp8_block, the scales fp32 (or bf16) ``[ceil(rows/128),
    ceil(K/128)]``, the multiplier of the 128x128 block despite the name
    (``quantization_config.weight_block_size`` must be ``[128, 128]``).

  Expert count and shapes come from the tensors; top_k
  (``num_experts_per_tok``) and the activation (``hidden_act``) from a
  config.json next to the files, or keyword arguments.

The engine computes the router (``mlp.gate``, DeepSeek's grouped top-k and
``routed_scaling_factor``, Qwen's ``norm_topk_prob``) and the shared experts;
the layer is the routed experts.

Why not ``safetensors.safe_open(..., framework="numpy")``: its ``get_tensor``
returns a new, writable copy of the tensor at each call (tests/python/test_hf.py
checks it), so the files are mapped here and the header's data offsets viewed.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Sequence
from typing import Optional, Union

import numpy as np

from ._api import Context, MoE
from ._errors import InvalidArgument, Unsupported

__all__ = ["SafetensorsFile", "Checkpoint", "moe_layer"]

PathLike = Union[str, os.PathLike]

_DTYPES = {"U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "U32": "uint32", "I32": "int32",
           "U64": "uint64", "I64": "int64", "F16": "float16", "F32": "float32", "F64": "float64", "BOOL": "bool",
           "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu"}


def _np_dtype(name: str, path: str, tensor: str) -> np.dtype:
    n = _DTYPES.get(name)
    if n is None:
        raise InvalidArgument(f"{path}: tensor {tensor} has dtype {name}, which moejit does not read")
    if n in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, n))
    return np.dtype(n)


class SafetensorsFile:
    """One .safetensors file, memory-mapped read-only. ``tensor(name)`` is a numpy view
    of the map (zero copy); the format is an 8-byte little-endian header size, a JSON
    header ``{name: {dtype, shape, data_offsets}}`` and the data."""

    def __init__(self, path: PathLike):
        self.path = os.fspath(path)
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise InvalidArgument(f"{self.path}: not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", head)
            size = os.fstat(f.fileno()).st_size
            if n > size - 8:
                raise InvalidArgument(f"{self.path}: header size {n} beyond the file ({size} bytes)")
            try:
                header = json.loads(f.read(n))
            except ValueError as e:
                raise InvalidArgument(f"{self.path}: header is not JSON ({e})") from None
        self.metadata = header.pop("__metadata__", {}) or {}
        self._start = 8 + n
        self._entries = header
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r") if size > 0 else None
        for name, e in header.items():
            b, end = e["data_offsets"]
            if not 0 <= b <= end <= size - self._start:
                raise InvalidArgument(f"{self.path}: tensor {name} lies outside the file")

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def tensor(self, name: str) -> np.ndarray:
        e = self._entries[name]
        dt = _np_dtype(e["dtype"], self.path, name)
        b, end = e["data_offsets"]
        shape = tuple(int(s) for s in e["shape"])
        if int(np.prod(shape, dtype=np.int64)) * dt.itemsize != end - b:
            raise InvalidArgument(f"{self.path}: tensor {name}: shape {list(shape)} of {e['dtype']} is not "
                                  f"{end - b} bytes")
        return self._map[self._start + b:self._start + end].view(dt).reshape(shape)


class Checkpoint:
    """A checkpoint's tensors over one or more files: a file, a list of files, or a
    directory (its ``*.safetensors``). ``config.json`` in the directory (of the
    first file, when files are given) is read when present, as :attr:`config`."""

    def __init__(self, files: Union[PathLike, Sequence[PathLike]]):
        self.config: dict = {}
        if isinstance(files, (str, os.PathLike)) and os.path.isdir(files):
            d = os.fspath(files)
            paths = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".safetensors"))
            if not paths:
                raise InvalidArgument(f"{d}: no .safetensors files")
        elif isinstance(files, (str, os.PathLike)):
            paths = [os.fspath(files)]
            d = os.path.dirname(os.path.abspath(paths[0]))
        else:
            paths = [os.fspath(p) for p in files]
            if not paths:
                raise InvalidArgument("files is empty")
            d = os.path.dirname(os.path.abspath(paths[0]))
        cfg = os.path.join(d, "config.json")
        if os.path.exists(cfg):
            try:
                with open(cfg) as f:
                    self.config = json.load(f)
            except ValueError as e:
                raise InvalidArgument(f"{cfg}: not JSON ({e})") from None
            if not isinstance(self.config, dict):
                raise InvalidArgument(f"{cfg}: not a JSON object")
        self.files = [SafetensorsFile(p) for p in paths]
        self._where = {}
        for f in self.files:
            for k in f.keys():
                self._where[k] = f

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def tensor(self, name: str) -> np.ndarray:
        f = self._where.get(name)
        if f is None:
            raise InvalidArgument(f"tensor {name} is in none of {[x.path for x in self.files]}")
        return f.tensor(name)


def _layer_prefix(ckpt: Checkpoint, layer: int, prefix: Optional[str]) -> str:
    if prefix is not None:
        return prefix.format(layer=layer)
    for p in (f"model.layers.{layer}.mlp", f"block.{layer}.mlp"):
        if any(k.startswith(p + ".") for k in ckpt.keys()):
            return p
    raise InvalidArgument(f"no tensors of layer {layer} (model.layers.{layer}.mlp.*) in the checkpoint")


def moe_layer(files: Union[PathLike, Sequence[PathLike], Checkpoint], layer: int, *,
              context: Optional[Context] = None, top_k: Optional[int] = None, max_tokens: int = 16,
              output_dtype="bf16", swiglu_limit: Optional[float] = None, prefix: Optional[str] = None,
              activation: Optional[str] = None) -> MoE:
    """The routed experts of one layer of a safetensors checkpoint as a :class:`MoE`,
    read in place from memory maps.

    Args:
        files: a .safetensors file, a list of them (shards), a directory, or a
            :class:`Checkpoint`.
        layer: the decoder layer index.
        context: the :class:`Context` (None: a default one).
        top_k: experts per token; None reads config.json (``num_experts_per_tok``,
            ``experts_per_token``).
        swiglu_limit: gpt-oss; None reads config.json's ``swiglu_limit`` (7.0).
        prefix: the layer's MLP tensor prefix, ``"{layer}"`` substituted (default
            ``model.layers.{layer}.mlp``).
        activation: per-expert layouts; None reads config.json's ``hidden_act``
            (``silu``, ``gelu``, ``gelu_pytorch_tanh``, ...).
    """
    ckpt = files if isinstance(files, Checkpoint) else Checkpoint(files)
    mlp = _layer_prefix(ckpt, layer, prefix)
    cfg = ckpt.config
    if f"{mlp}.experts.gate_up_proj_blocks" in ckpt:
        return _gpt_oss(ckpt, mlp, cfg, context, top_k, max_tokens, output_dtype, swiglu_limit)
    if f"{mlp}.experts.0.gate_proj.weight" in ckpt:
        return _per_expert(ckpt, mlp, cfg, context, top_k, max_tokens, output_dtype, activation)
    dense = [k for k in (f"{mlp}.gate_proj.weight", f"{mlp}.experts.gate_up_proj") if k in ckpt]
    if dense:
        raise InvalidArgument(f"{mlp}: {dense[0]} but no routed experts of a known layout ({mlp}.experts.0."
                              "gate_proj.weight per expert, or gpt-oss's experts.gate_up_proj_blocks)")
    raise InvalidArgument(f"{mlp}: no expert tensors of a known layout ({mlp}.experts.0.gate_proj.weight per "
                          f"expert, or gpt-oss's {mlp}.experts.gate_up_proj_blocks)")


_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh"}
_EXPERT_RE = re.compile(r"\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.(.+)$")


def _top_k(cfg, top_k):
    if top_k is None:
        top_k = cfg.get("num_experts_per_tok", cfg.get("experts_per_token"))
        if top_k is None:
            raise InvalidArgument("top_k is not given and no config.json names num_experts_per_tok")
    return int(top_k)


def _per_expert(ckpt, mlp, cfg, context, top_k, max_tokens, output_dtype, activation) -> MoE:
    """DeepSeek-V3 / Qwen3 MoE: one weight (and fp8 scale) tensor per expert and projection."""
    ex = f"{mlp}.experts"
    found: dict[int, dict[str, set]] = {}
    for k in ckpt.keys():
        if k.startswith(ex + "."):
            m = _EXPERT_RE.match(k[len(mlp):])
            if m:
                found.setdefault(int(m.group(1)), {}).setdefault(m.group(2), set()).add(m.group(3))
    e = len(found)
    if sorted(found) != list(range(e)):
        gap = min(set(range(max(found) + 1)) - set(found))
        raise InvalidArgument(f"{ex}: experts 0..{max(found)} have tensors but expert {gap} has none")
    want = cfg.get("n_routed_experts", cfg.get("num_experts", cfg.get("num_local_experts")))
    if want is not None and int(want) != e:
        raise InvalidArgument(f"config.json has {want} routed experts but the checkpoint {ex}.0 .. {ex}.{e - 1}")
    qc = cfg.get("quantization_config") or {}
    block = qc.get("weight_block_size")
    if block is not None and list(block) != [128, 128]:
        raise Unsupported(f"config.json: quantization_config.weight_block_size = {block}: moejit's fp8_block "
                          "scales are per 128x128 block")

    banks: dict[str, object] = {}
    formats: dict[str, str] = {}
    shape0: dict[str, tuple] = {}
    for proj in ("gate", "up", "down"):
        weights, scales, biases, kinds = [], [], [], set()
        for x in range(e):
            base = f"{ex}.{x}.{proj}_proj"
            have = found[x].get(f"{proj}_proj", set())
            if "weight" not in have:
                raise InvalidArgument(f"{base}.weight is missing (expert {x} of {e})")
            extra = have - {"weight", "weight_scale_inv", "bias"}
            if extra:
                raise Unsupported(f"{base}.{sorted(extra)[0]}: moejit reads weight, weight_scale_inv (128x128 fp8 "
                                  "block scales) and bias per expert, not this quantization's tensors")
            w = ckpt.tensor(f"{base}.weight")
            dt = w.dtype.name
            if dt == "bfloat16":
                kinds.add("bf16")
                if "weight_scale_inv" in have:
                    raise InvalidArgument(f"{base}.weight_scale_inv: a bf16 weight has no block scales")
            elif dt == "float8_e4m3fn":
                kinds.add("fp8_block")
                if "weight_scale_inv" not in have:
                    raise InvalidArgument(f"{base}.weight is fp8 (e4m3) but {base}.weight_scale_inv, its 128x128 "
                                          "block scales, is missing")
                scales.append(ckpt.tensor(f"{base}.weight_scale_inv"))
            else:
                raise Unsupported(f"{base}.weight has dtype {dt}: moejit reads bf16 or float8_e4m3fn (with "
                                  "weight_scale_inv) expert weights")
            if len(kinds) > 1:
                raise InvalidArgument(f"{base}.weight is {dt} but {ex}.0.{proj}_proj.weight is not: one format per "
                                      "projection")
            if w.ndim != 2:
                raise InvalidArgument(f"{base}.weight: expected [rows, K], got {list(w.shape)}")
            if x == 0:
                shape0[proj] = w.shape
            elif w.shape != shape0[proj]:
                raise InvalidArgument(f"{base}.weight: shape {list(w.shape)}, but {ex}.0.{proj}_proj.weight is "
                                      f"{list(shape0[proj])}")
            weights.append(w)
            if "bias" in have:
                biases.append(ckpt.tensor(f"{base}.bias"))
        if biases and len(biases) != e:
            raise InvalidArgument(f"{ex}.*.{proj}_proj.bias: {len(biases)} of {e} experts have a bias")
        formats[proj] = kinds.pop()
        banks[proj] = weights
        if scales:
            banks[f"{proj}_scales"] = scales
        if biases:
            banks[f"{proj}_bias"] = biases
    (i, h), (i_up, h_up), (h_dn, i_dn) = shape0["gate"], shape0["up"], shape0["down"]
    if (i_up, h_up) != (i, h) or (h_dn, i_dn) != (h, i):
        raise InvalidArgument(f"{ex}: gate_proj [{i}, {h}], up_proj [{i_up}, {h_up}] and down_proj [{h_dn}, {i_dn}] "
                              "do not fit one layer (gate and up [I, H], down [H, I])")
    if activation is None:
        act = cfg.get("hidden_act")
        if act is None:
            raise InvalidArgument("activation is not given and no config.json names hidden_act")
        activation = _ACTIVATIONS.get(act)
        if activation is None:
            raise Unsupported(f"config.json: hidden_act = {act!r} is none of moejit's activations "
                              f"({', '.join(_ACTIVATIONS)})")
    return MoE(context if context is not None else Context(), format=formats["gate"], up_format=formats["up"],
               down_format=formats["down"], top_k=_top_k(cfg, top_k), activation=activation, max_tokens=max_tokens,
               output_dtype=output_dtype, source=ckpt, **banks)


def _gpt_oss(ckpt, mlp, cfg, context, top_k, max_tokens, output_dtype, swiglu_limit) -> MoE:
    ex = f"{mlp}.experts"
    top_k = _top_k(cfg, top_k)
    if swiglu_limit is None:
        swiglu_limit = float(cfg.get("swiglu_limit", 7.0))

    def blocks(name: str) -> np.ndarray:
        b = ckpt.tensor(f"{ex}.{name}_blocks")
        if b.ndim != 4 or b.shape[3] != 16:
            raise InvalidArgument(f"{ex}.{name}_blocks: expected [E, rows, K/32, 16] uint8, got {list(b.shape)}")
        return b

    gu, dn = blocks("gate_up_proj"), blocks("down_proj")
    return MoE(context if context is not None else Context(), format="mxfp4", top_k=top_k, source=ckpt,
               gate_up=gu, gate_up_scales=ckpt.tensor(f"{ex}.gate_up_proj_scales"),
               gate_up_bias=ckpt.tensor(f"{ex}.gate_up_proj_bias"),
               down=dn, down_scales=ckpt.tensor(f"{ex}.down_proj_scales"),
               down_bias=ckpt.tensor(f"{ex}.down_proj_bias"),
               gate_up_interleaved=True, activation="swiglu_oai", swiglu_alpha=1.702, swiglu_limit=swiglu_limit,
               max_tokens=max_tokens, output_dtype=output_dtype)
