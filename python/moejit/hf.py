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

Checkpoints that keep gate and up apart (DeepSeek-V3's fp8 ``weight`` +
``weight_scale_inv`` per expert and projection, Qwen3 MoE) need the separate
gate / up banks of the C API, which this library does not have yet;
:func:`moe_layer` says so (:class:`moejit.Unsupported`) instead of copying them
together.
"""

from __future__ import annotations

import json
import os
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
    directory (its ``*.safetensors``; ``config.json`` there is read when present)."""

    def __init__(self, files: Union[PathLike, Sequence[PathLike]]):
        self.config: dict = {}
        if isinstance(files, (str, os.PathLike)) and os.path.isdir(files):
            d = os.fspath(files)
            paths = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".safetensors"))
            if not paths:
                raise InvalidArgument(f"{d}: no .safetensors files")
            cfg = os.path.join(d, "config.json")
            if os.path.exists(cfg):
                with open(cfg) as f:
                    self.config = json.load(f)
        elif isinstance(files, (str, os.PathLike)):
            paths = [os.fspath(files)]
        else:
            paths = [os.fspath(p) for p in files]
            if not paths:
                raise InvalidArgument("files is empty")
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
              output_dtype="bf16", swiglu_limit: Optional[float] = None, prefix: Optional[str] = None) -> MoE:
    """The routed experts of one layer of a safetensors checkpoint as a :class:`MoE`,
    read in place from memory maps.

    Args:
        files: a .safetensors file, a list of them (shards), a directory, or a
            :class:`Checkpoint`.
        layer: the decoder layer index.
        context: the :class:`Context` (None: a default one).
        top_k: experts per token; None reads config.json (``num_experts_per_tok``,
            ``experts_per_token``).
        swiglu_limit: None reads config.json's ``swiglu_limit`` (gpt-oss: 7.0).
        prefix: the layer's MLP tensor prefix, ``"{layer}"`` substituted (default
            ``model.layers.{layer}.mlp``).
    """
    ckpt = files if isinstance(files, Checkpoint) else Checkpoint(files)
    mlp = _layer_prefix(ckpt, layer, prefix)
    cfg = ckpt.config
    if f"{mlp}.experts.gate_up_proj_blocks" in ckpt:
        return _gpt_oss(ckpt, mlp, cfg, context, top_k, max_tokens, output_dtype, swiglu_limit)
    separate = [k for k in ckpt.keys() if k.startswith(mlp + ".experts.") and
                (".gate_proj." in k or ".up_proj." in k or k.endswith("gate_proj") or k.endswith("up_proj"))]
    if separate:
        raise Unsupported(
            f"{mlp}: gate and up are separate tensors ({separate[0]}, ...): such checkpoints (DeepSeek-V3, "
            "Qwen3 MoE) need the separate gate/up banks of the C API, which this library does not have yet")
    raise InvalidArgument(f"{mlp}: no expert tensors of a known layout (gpt-oss: {mlp}.experts.gate_up_proj_blocks)")


def _gpt_oss(ckpt, mlp, cfg, context, top_k, max_tokens, output_dtype, swiglu_limit) -> MoE:
    ex = f"{mlp}.experts"
    if top_k is None:
        top_k = cfg.get("num_experts_per_tok", cfg.get("experts_per_token"))
        if top_k is None:
            raise InvalidArgument("top_k is not given and no config.json names num_experts_per_tok")
    if swiglu_limit is None:
        swiglu_limit = float(cfg.get("swiglu_limit", 7.0))

    def blocks(name: str) -> np.ndarray:
        b = ckpt.tensor(f"{ex}.{name}_blocks")
        if b.ndim != 4 or b.shape[3] != 16:
            raise InvalidArgument(f"{ex}.{name}_blocks: expected [E, rows, K/32, 16] uint8, got {list(b.shape)}")
        return b

    gu, dn = blocks("gate_up_proj"), blocks("down_proj")
    return MoE(context if context is not None else Context(), format="mxfp4", top_k=int(top_k),
               gate_up=gu, gate_up_scales=ckpt.tensor(f"{ex}.gate_up_proj_scales"),
               gate_up_bias=ckpt.tensor(f"{ex}.gate_up_proj_bias"),
               down=dn, down_scales=ckpt.tensor(f"{ex}.down_proj_scales"),
               down_bias=ckpt.tensor(f"{ex}.down_proj_bias"),
               gate_up_interleaved=True, activation="swiglu_oai", swiglu_alpha=1.702, swiglu_limit=swiglu_limit,
               max_tokens=max_tokens, output_dtype=output_dtype)
