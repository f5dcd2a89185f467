"""MoE layers from GGUF files (llama.cpp's format), read in place.

A GGUF file keeps a MoE layer's routed experts as three stacked tensors,
``blk.N.ffn_gate_exps.weight``, ``blk.N.ffn_up_exps.weight`` and
``blk.N.ffn_down_exps.weight`` (newer conversions: one ``ffn_gate_up_exps``,
gate rows first), each in its own GGML type (a Q4_K_M file has q4_K gate / up
and, in many layers, a q6_K down). GGUF lists dimensions contiguous one first:
``ne = [K, rows, n_expert]``, which is numpy's ``[n_expert, rows, K]`` (of
bytes for the block types). gguf-py's :class:`gguf.GGUFReader` maps the file
(``np.memmap``, read-only) and its tensors are views of that map, so the
layer's banks are the file's bytes: nothing is read until a call touches it,
nothing is copied, and the layer holds the reader (:attr:`moejit.MoE.source`).

GGML types and moejit formats:

======================  ===============================================
GGML type               moejit format
======================  ===============================================
BF16                    bf16
Q8_0, Q4_0              q8_0, q4_0
Q4_K Q5_K Q6_K Q2_K     q4_K q5_K q6_K q2_K q3_K (when the loaded
Q3_K                    library has them: :func:`moejit.formats`)
MXFP4, NVFP4, F16, F32  not served (:class:`moejit.Unsupported`): ggml's
and the rest            MXFP4 / NVFP4 blocks carry their scales inline
                        and pair codes j and j+16 (j+8) in a byte: not
                        moejit's mxfp4 / nvfp4 layout (codes ``[rows,
                        K/2]`` even/odd, scales apart), so they cannot
                        be read in place; moejit has no fp16 / fp32
                        weights
======================  ===============================================

The engine computes the router (``ffn_gate_inp``, the gating function,
``expert_weights_scale`` / ``_norm``) and the shared experts; this layer is the
routed experts: ``forward(x, topk_ids, topk_weights)``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import numpy as np

from . import _names as N
from ._api import Context, MoE
from ._core import version as _lib_version
from ._errors import InternalError, InvalidArgument, Unsupported

__all__ = ["FORMATS", "GGUFLayer", "open_files", "moe_layer", "format_of"]

PathLike = Union[str, os.PathLike]

# GGML type name -> moejit format name. The name, not the enum: gguf-py versions differ
# in which types they have.
FORMATS = {
    "BF16": "bf16",
    "Q8_0": "q8_0",
    "Q4_0": "q4_0",
    "Q4_K": "q4_K",
    "Q5_K": "q5_K",
    "Q6_K": "q6_K",
    "Q2_K": "q2_K",
    "Q3_K": "q3_K",
}

_WHY_NOT = {
    "MXFP4": "ggml's MXFP4 blocks (17 bytes: an e8m0 scale, then 16 bytes holding elements j and j+16 in one byte) "
             "are not moejit's mxfp4 layout (codes [rows, K/2], even element in the low nibble, e8m0 scales in "
             "their own array), so they cannot be read in place",
    "NVFP4": "ggml's NVFP4 blocks (4 unsigned e4m3 scales inline per 64 weights, elements j and j+8 of each 16 in "
             "one byte, no per-row global) are not moejit's nvfp4 layout (codes [rows, K/2] even/odd, scales and "
             "per-row globals in their own arrays)",
    "F16": "moejit has no fp16 weight format",
    "F32": "moejit has no fp32 weight format",
}

# The activation of the routed experts of each llama.cpp architecture that moejit
# knows (llm_build_* pass it to build_moe_ffn): keyword arguments of MoE.
_SILU = {"activation": "silu"}
ARCH_OPTIONS: dict[str, dict[str, Any]] = {
    **{a: _SILU for a in ("llama", "qwen2moe", "qwen3moe", "qwen3vlmoe", "deepseek", "deepseek2", "olmoe",
                          "granitemoe", "phimoe", "glm4moe", "dots1", "ernie4_5-moe", "hunyuan-moe", "bailingmoe",
                          "bailingmoe2", "minimax-m2")},
    # Llama 4 multiplies the router weight into the experts' input.
    "llama4": {"activation": "silu", "router_weight_on_input": True},
    "gpt-oss": {"activation": "swiglu_oai", "swiglu_alpha": 1.702, "swiglu_limit": 7.0},
}

_PROJS = ("gate", "up", "down", "gate_up")


@dataclass
class GGUFLayer:
    """What a GGUF layer was built from (``MoE.source``); holding it holds the maps.

    Attributes:
        paths: the files read.
        layer: the block index.
        arch: ``general.architecture``.
        tensors: projection ("gate", "up", "down" or "gate_up") -> (tensor name,
            GGML type name).
        readers: the :class:`gguf.GGUFReader` objects whose maps the banks view.
    """

    paths: list[str]
    layer: int
    arch: str
    tensors: dict[str, tuple[str, str]]
    readers: list[Any] = field(repr=False)

    def mapping(self, path: Optional[str] = None) -> tuple[int, int]:
        """[start, end) addresses of a file's map (the first file's by default)."""
        i = 0 if path is None else self.paths.index(os.fspath(path))
        m = self.readers[i].data
        lo = m.__array_interface__["data"][0]
        return lo, lo + m.nbytes


def _gguf():
    try:
        import gguf  # gguf-py, PyPI `gguf`
    except ImportError as e:  # pragma: no cover (the test venv has it)
        raise Unsupported(f"moejit.gguf needs gguf-py (pip install gguf): {e}") from None
    return gguf


def open_files(path: Union[PathLike, Sequence[PathLike], Any]) -> tuple[list[str], list[Any]]:
    """(paths, readers) for a file, a list of split files (``*-00001-of-00003.gguf``),
    a :class:`gguf.GGUFReader` or a list of readers."""
    gguf = _gguf()
    items = list(path) if isinstance(path, (list, tuple)) else [path]
    if not items:
        raise InvalidArgument("path is empty: pass a .gguf file, its split files or a GGUFReader")
    paths, readers = [], []
    for p in items:
        if isinstance(p, gguf.GGUFReader):
            r = p
            p = getattr(p.data, "filename", None) or "<GGUFReader>"
        else:
            p = os.fspath(p)
            if not os.path.isfile(p):
                raise InvalidArgument(f"{p}: no such file")
            try:
                r = gguf.GGUFReader(p, "r")
            except (ValueError, OSError, KeyError, IndexError) as e:
                raise InvalidArgument(f"{p}: not a GGUF file gguf-py can read ({type(e).__name__}: {e})") from None
        if r.byte_order != "I":
            raise Unsupported(f"{p}: a big-endian GGUF file; moejit reads little-endian weights in place")
        paths.append(os.fspath(p))
        readers.append(r)
    return paths, readers


def _field(readers, key: str):
    for r in readers:
        f = r.get_field(key)
        if f is not None:
            return f.contents()
    return None


def _meta_int(readers, key: str, layer: int) -> Optional[int]:
    """An integer key, or a per-layer array's entry for `layer`."""
    v = _field(readers, key)
    if isinstance(v, list):
        if not 0 <= layer < len(v):
            return None
        v = v[layer]
    return None if v is None else int(v)


def _meta_float(readers, key: str, layer: int) -> Optional[float]:
    v = _field(readers, key)
    if isinstance(v, list):
        v = v[layer] if 0 <= layer < len(v) else None
    return None if v is None else float(v)


def format_of(tensor_type: Any, what: str) -> str:
    """The moejit format of a GGML type (a GGMLQuantizationType or its name), checked
    against the loaded library's formats; :class:`Unsupported` otherwise."""
    tname = getattr(tensor_type, "name", str(tensor_type))
    fmt = FORMATS.get(tname)
    if fmt is None:
        why = _WHY_NOT.get(tname, "moejit has no format for it")
        served = ", ".join(f"{k} ({v})" for k, v in FORMATS.items() if v in N.format_names())
        raise Unsupported(f"{what} is GGML type {tname}: {why}. moejit serves {served}")
    if fmt not in N.format_names():
        raise Unsupported(
            f"{what} is GGML type {tname}, which needs moejit format {fmt}: libmoejit {_lib_version()} does not "
            f"have it (its formats: {', '.join(N.format_names())})")
    return fmt


def _check_in_map(a: np.ndarray, reader, path: str, name: str) -> None:
    m = reader.data
    lo = m.__array_interface__["data"][0]
    start = a.__array_interface__["data"][0]
    if not (lo <= start and start + a.nbytes <= lo + m.nbytes):  # pragma: no cover (gguf-py views its map)
        raise InternalError(f"{path}: tensor {name} is not a view of the file's map (gguf-py copied it)")


def moe_layer(path: Union[PathLike, Sequence[PathLike], Any], layer: int, ctx: Optional[Context] = None, *,
              top_k: Optional[int] = None, num_experts: Optional[int] = None, hidden: Optional[int] = None,
              intermediate: Optional[int] = None, activation: Optional[N.NameOrId] = None,
              swiglu_alpha: Optional[float] = None, swiglu_limit: Optional[float] = None,
              router_weight_on_input: Optional[bool] = None, max_tokens: int = 16, output_dtype="bf16") -> MoE:
    """The routed experts of block `layer` of a GGUF file as a :class:`moejit.MoE`,
    read in place from the file's map.

    Args:
        path: a .gguf file, the list of a split model's files, or an open
            :class:`gguf.GGUFReader` (or a list of them, to parse a file once for
            many layers).
        layer: the block index N of ``blk.N.*``.
        ctx: the :class:`moejit.Context` (None: a default one).
        top_k: experts per token; None reads ``{arch}.expert_used_count``.
        num_experts, hidden, intermediate: checked against the tensors; None
            checks the tensors against ``{arch}.expert_count``,
            ``{arch}.embedding_length`` and ``{arch}.expert_feed_forward_length``
            where the file has them.
        activation, swiglu_alpha, swiglu_limit, router_weight_on_input: None
            takes the architecture's (:data:`ARCH_OPTIONS`); an architecture
            moejit does not know needs ``activation``.
        max_tokens, output_dtype: as for :class:`moejit.MoE`.

    Gate, up and down each get their own format (``up_format`` / ``down_format``
    of the C API): a Q4_K_M layer is q4_K gate and up with a q6_K down. Raises
    :class:`moejit.InvalidArgument` for missing tensors, wrong shapes and
    metadata that disagrees with them, :class:`moejit.Unsupported` for GGML types
    moejit does not serve and for what the layer would silently leave out (per
    expert scale tensors, a SwiGLU clamp, non-bf16 biases).
    """
    paths, readers = open_files(path)
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or layer < 0:
        raise InvalidArgument(f"layer must be a block index >= 0, got {layer!r}")
    layer = int(layer)
    where: dict[str, tuple[Any, Any, str]] = {}  # tensor name -> (tensor, reader, path)
    for p, r in zip(paths, readers):
        for t in r.tensors:
            where[t.name] = (t, r, p)
    arch = _field(readers, "general.architecture")
    if not isinstance(arch, str):
        raise InvalidArgument(f"{paths[0]}: no general.architecture key: not a llama.cpp model file")

    pre = f"blk.{layer}"
    names = {p: f"{pre}.ffn_{p}_exps.weight" for p in _PROJS}
    fused = names["gate_up"] in where
    need = ("gate_up", "down") if fused else ("gate", "up", "down")
    missing = [names[p] for p in need if names[p] not in where]
    if missing:
        have = sorted({int(n.split(".")[1]) for n in where if n.startswith("blk.") and "_exps." in n})
        split = _meta_int(readers, "split.count", 0)
        hint = (f"; the model is split into {split} files: pass them all" if split and split > len(paths) else "")
        layers = f"blocks with routed experts: {_ranges(have)}" if have else "the file has no routed expert tensors"
        raise InvalidArgument(f"{paths[0]}: {', '.join(missing)} not found ({layers}){hint}")

    # Anything else of these tensors that the layer would have to apply.
    for n in where:
        if n.startswith(f"{pre}.ffn_") and "_exps." in n:
            proj, suffix = n[len(pre) + 5:].split("_exps.", 1)
            if proj in _PROJS and suffix not in ("weight", "bias"):
                raise Unsupported(f"{n}: per-expert tensors other than weight and bias (here {suffix!r}) are not "
                                  "applied by moejit")
    clamp = _meta_float(readers, f"{arch}.swiglu_clamp_exp", layer)
    if clamp is not None and clamp > 1e-6:
        raise Unsupported(f"{arch}.swiglu_clamp_exp = {clamp} for block {layer}: llama.cpp clamps silu(gate) and "
                          "up there, which no moejit activation does")

    tensors, arrays, fmts, biases = {}, {}, {}, {}
    for p in need:
        t, r, fp = where[names[p]]
        what = f"{fp}: {names[p]}"
        fmt = format_of(t.tensor_type, what)
        ne = [int(d) for d in t.shape]
        if len(ne) != 3:
            raise InvalidArgument(f"{what}: expected 3 dimensions ne = [K, rows, n_expert] (numpy "
                                  f"[n_expert, rows, K]), got ne = {ne}")
        a = t.data
        if fmt == "bf16":
            a = a.view(np.uint16) if a.dtype == np.uint8 else a
        _check_in_map(a, r, fp, names[p])
        tensors[p] = (names[p], t.tensor_type.name)
        arrays[p] = (a, ne)
        fmts[p] = fmt
        bname = f"{pre}.ffn_{p}_exps.bias"
        if bname in where:
            bt, br, bp = where[bname]
            if bt.tensor_type.name != "BF16":
                raise Unsupported(f"{bp}: {bname} is {bt.tensor_type.name}: moejit's biases are bf16, read in place; "
                                  "converting would copy and round them")
            b = bt.data.view(np.uint16) if bt.data.dtype == np.uint8 else bt.data
            bne = [int(d) for d in bt.shape]
            if bne != ne[1:]:
                raise InvalidArgument(f"{bp}: {bname}: ne = {bne}, expected [rows, n_expert] = {ne[1:]}")
            _check_in_map(b, br, bp, bname)
            biases[p] = b
            tensors[f"{p}_bias"] = (bname, "BF16")

    # Geometry from the shapes: gate/up ne [H, I, E] (gate_up [H, 2I, E]), down [I, H, E].
    first = "gate_up" if fused else "gate"
    h, rows, e = arrays[first][1]
    i = rows // 2 if fused else rows
    if fused and rows % 2:
        raise InvalidArgument(f"{tensors['gate_up'][0]}: {rows} rows; gate and up need 2 * intermediate")
    expect = {"down": [i, h, e]} if fused else {"up": [h, i, e], "down": [i, h, e]}
    for p, ne in expect.items():
        if arrays[p][1] != ne:
            raise InvalidArgument(
                f"{tensors[p][0]}: ne = {arrays[p][1]}, expected {ne} (from {tensors[first][0]}'s ne = "
                f"{arrays[first][1]}: hidden {h}, intermediate {i}, {e} experts)")
    for key, value, given in ((f"{arch}.expert_count", e, num_experts), (f"{arch}.embedding_length", h, hidden),
                              (f"{arch}.expert_feed_forward_length", i, intermediate)):
        meta = _meta_int(readers, key, layer)
        if given is None and meta is not None and meta != value:
            raise InvalidArgument(f"{paths[0]}: {key} = {meta} but {tensors[first][0]} has {value}: pass the value "
                                  "to use as a keyword argument to override the key")
    if top_k is None:
        top_k = _meta_int(readers, f"{arch}.expert_used_count", layer)
        if top_k is None:
            raise InvalidArgument(f"{paths[0]}: no {arch}.expert_used_count: pass top_k")

    opts = dict(ARCH_OPTIONS.get(arch, {}))
    for k, v in (("activation", activation), ("swiglu_alpha", swiglu_alpha), ("swiglu_limit", swiglu_limit),
                 ("router_weight_on_input", router_weight_on_input)):
        if v is not None:
            opts[k] = v
    if "activation" not in opts:
        raise InvalidArgument(f"architecture {arch!r}: moejit does not know its experts' activation; pass "
                              f"activation= ({', '.join(N.ACTIVATIONS)})")

    source = GGUFLayer(paths, layer, arch, tensors, readers)
    banks: dict[str, Any] = {}
    for p in need:
        banks["gate_up" if p == "gate_up" else p] = arrays[p][0]
        if p in biases:
            banks[f"{p}_bias"] = biases[p]
    formats = {"format": fmts[first], "down_format": fmts["down"]}
    if not fused:
        formats["up_format"] = fmts["up"]
    return MoE(ctx if ctx is not None else Context(), top_k=int(top_k), num_experts=num_experts, hidden=hidden,
               intermediate=intermediate, max_tokens=max_tokens, output_dtype=output_dtype, source=source,
               **formats, **banks, **opts)


def _ranges(xs: list[int]) -> str:
    out, start = [], None
    for k, x in enumerate(xs):
        if start is None:
            start = x
        if k + 1 == len(xs) or xs[k + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ", ".join(out)
