"""Context, MoE, Linear, Task and ProjFormat: the C API's objects with Python names and defaults."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from . import _arrays as A
from . import _banks as B
from . import _core
from . import _names as N
from ._errors import InvalidArgument, Unsupported
from ._layout import BITS16, FLOAT32, layout

ArrayLike = Any  # numpy / ml_dtypes array, np.memmap, torch CPU tensor, DLPack or buffer-protocol object
Bank = Any  # one stacked array [E, ...] or a sequence of E arrays


def _int(value, what: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgument(f"{what} must be an int, got {type(value).__name__}")
    v = int(value)
    if minimum is not None and v < minimum:
        raise InvalidArgument(f"{what} = {v} must be >= {minimum}")
    if not -(2**31) <= v < 2**31:
        raise InvalidArgument(f"{what} = {v} does not fit in int32")
    return v


def _float(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidArgument(f"{what} must be a number, got {type(value).__name__}")
    return float(value)


def _bool(value, what: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgument(f"{what} must be True or False, got {value!r}")
    return bool(value)


class Context:
    """A thread pool, an ISA tier and options shared by the layers created on it
    (``moejit_context_create``).

    Args:
        num_threads: workers per call; None (or 0): ``len(cpu_ids)`` when given,
            else one per CPU of the process affinity mask.
        cpu_ids: optional CPU numbers; worker i is pinned to ``cpu_ids[i % len]``.
            They must be in the process affinity mask.
        max_isa: cap on the tier ("scalar", "avx2", "avx512", "avx512_bf16" or the
            id); None: the host's best. A tier above the host's best raises
            :class:`Unsupported`. ``MOEJIT_MAX_ISA`` in the environment caps it further.
        dedup: False sets ``MOEJIT_CONTEXT_NO_DEDUP`` (one kernel call per route
            instead of one per expert; the same bits, for A/B runs).

    One task is in flight per context: while a :meth:`MoE.submit` has not been
    waited for, every other call on the context's layers raises :class:`Busy`.
    """

    def __init__(
        self,
        num_threads: Optional[int] = None,
        cpu_ids: Optional[Sequence[int]] = None,
        max_isa: N.NameOrId | None = None,
        dedup: bool = True,
    ):
        threads = 0 if num_threads is None else _int(num_threads, "num_threads")
        ids = [] if cpu_ids is None else [_int(c, f"cpu_ids[{i}]") for i, c in enumerate(cpu_ids)]
        if cpu_ids is not None and not ids:
            raise InvalidArgument("cpu_ids is empty: pass None for no pinning")
        isa = N.isa_id(max_isa)
        flags = 0 if _bool(dedup, "dedup") else N.CONTEXT_NO_DEDUP
        self._core = _core.Context(threads, ids, isa, flags)
        self._inflight: Optional[weakref.ref] = None
        self._dedup = bool(dedup)

    @property
    def isa(self) -> str:
        """The tier every kernel of every layer of this context runs (``moejit_context_isa``)."""
        return N.name_of(N.isa_names(), self._core.isa)

    @property
    def num_threads(self) -> int:
        """Participants of each call (``moejit_context_num_threads``)."""
        return self._core.num_threads

    @property
    def dedup(self) -> bool:
        return self._dedup

    def wait(self) -> None:
        """Waits for the task in flight, if any (``moejit_context_wait``); returns at
        once when there is none. The task's :class:`Task` handle then reads as done."""
        task = self._inflight() if self._inflight is not None else None
        self._core.wait()
        if task is not None:
            task._finish()

    def __repr__(self) -> str:
        return f"moejit.Context(isa={self.isa!r}, num_threads={self.num_threads}, dedup={self._dedup})"


class Task:
    """A submitted MoE call (:meth:`MoE.submit`). Holds x, topk_ids, topk_weights and
    the output until :meth:`wait` returns, so their memory outlives the work.
    Dropping an unfinished handle waits for it."""

    __slots__ = ("_context", "_layer", "_keep", "_out", "_done", "__weakref__")

    def __init__(self, context: Context, layer: "MoE", keep: tuple, out):
        self._context = context
        self._layer = layer
        self._keep = keep
        self._out = out
        self._done = False

    @property
    def done(self) -> bool:
        """Whether the task has been waited for (by :meth:`wait` or :meth:`Context.wait`)."""
        return self._done

    def wait(self):
        """Waits until the task is finished (the GIL is released meanwhile) and returns
        its output array."""
        if not self._done:
            self._context._core.wait()
            self._finish()
        return self._out

    def _finish(self) -> None:
        self._done = True
        self._keep = None
        ctx = self._context
        if ctx._inflight is not None and ctx._inflight() is self:
            ctx._inflight = None

    def __enter__(self) -> "Task":
        return self

    def __exit__(self, *exc) -> None:
        self.wait()

    def __del__(self):
        try:
            if not self._done:
                self.wait()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"moejit.Task(done={self._done})"


def _out_like(x: Any, shape: tuple[int, int], dtype: int):
    """A new output array: a torch tensor when x is one, else numpy."""
    if A.is_torch_tensor(x):
        import torch

        return torch.empty(shape, dtype=torch.bfloat16 if dtype == 0 else torch.float32)
    if dtype == 0:
        import ml_dtypes

        return np.empty(shape, dtype=ml_dtypes.bfloat16)
    return np.empty(shape, dtype=np.float32)


def _out_view(out, shape: tuple[int, int], dtype: int, inputs: list[tuple[A.View, str]]) -> A.View:
    v = A.view(out, "out")
    allowed = BITS16 if dtype == 0 else FLOAT32
    A.check_matrix2d(v, shape, allowed, "out", lambda: "the output, dtype " + ("bf16" if dtype == 0 else "f32"))
    A.check_writable(v, "out")
    A.check_no_overlap(v, inputs, "out")
    return v


def _x_view(x, cols: int, what_cols: str) -> tuple[A.View, int]:
    v = A.view(x, "x")
    a = v.array
    if v.dtype in BITS16 and a.ndim == 2 and a.shape[1] == cols and a.flags.c_contiguous:
        return v, int(a.shape[0])
    A.check_dtype(v, BITS16, "x", "the bf16 activations")
    if a.ndim != 2 or a.shape[1] != cols:
        raise InvalidArgument(f"x: expected shape [num_tokens, {cols}] ({what_cols}), got {A.describe(v)}")
    A.check_contiguous(v, "x")
    return v, int(a.shape[0])


def _fmt(format, group_size, what: str = "format") -> tuple[int, str, Any]:
    fid = N.format_id(format, what)
    name = N.name_of(N.format_names(), fid)
    lay = layout(name, 0 if group_size is None else group_size)
    if lay is None:
        raise Unsupported(
            f"format {name} (id {fid}) is known to libmoejit {_core.version()} but not to this moejit package: "
            "its array layout cannot be checked"
        )
    return fid, name, lay


def _scale_dtype(fmt_name: str, scale_dtype, scales: list[A.View] | None, what: str) -> int:
    """fp8_block scales are bf16 or f32: None takes the scale arrays' dtype."""
    if scale_dtype is not None:
        return N.dtype_id(scale_dtype, what)
    if fmt_name != "fp8_block" or not scales:
        return 0
    return 1 if scales[0].dtype == "float32" else 0


def _optional_bank(obj, what: str, e: int) -> list:
    return [None] * e if obj is None else B.experts(obj, what, e)


@dataclass(frozen=True)
class ProjFormat:
    """One projection's encoding (``moejit_proj_format``): for :class:`MoE`'s
    ``up_format`` and ``down_format``.

    Args:
        format: a format name ("q8_0", "fp8_block", ...) or id.
        scale_dtype: fp8_block scales "bf16" or "f32"; None: that projection's
            scale arrays' dtype.
        group_size: mxfp8 group (None or 0 = 32, 32, 64, 128).

    A plain name / id, or a tuple ``(format, scale_dtype, group_size)`` (trailing
    items may be left out), is accepted wherever a ProjFormat is. The
    ``formats`` property of a layer reports each projection's as a ProjFormat of
    names.
    """

    format: N.NameOrId
    scale_dtype: Any = None
    group_size: Optional[int] = None


def _proj_spec(spec, what: str) -> ProjFormat:
    if isinstance(spec, ProjFormat):
        return spec
    if isinstance(spec, (str, int)) and not isinstance(spec, bool):
        return ProjFormat(spec)
    if isinstance(spec, (tuple, list)) and 1 <= len(spec) <= 3:
        return ProjFormat(*spec)
    raise InvalidArgument(
        f"{what} must be a format name or id, a (format, scale_dtype, group_size) tuple or a moejit.ProjFormat, "
        f"got {spec!r}"
    )


class _Proj:
    """One projection's resolved encoding: ids for the C descriptor, the layout for
    the array checks."""

    def __init__(self, fid: int, name: str, lay, scale_dtype: int, group: int):
        self.fid, self.name, self.lay, self.scale_dtype, self.group = fid, name, lay, scale_dtype, group

    def c(self) -> tuple[int, int, int]:
        return (self.fid, self.scale_dtype, self.group)

    def public(self) -> ProjFormat:
        return ProjFormat(self.name, N.name_of(N.DTYPES, self.scale_dtype), self.group)


def _resolve_proj(spec, what: str, scales: list, inherit: _Proj) -> _Proj:
    """`spec` None: as gate (C: a NULL up_format / down_format). Else its own format,
    with scale_dtype None taken from that projection's scale arrays."""
    if spec is None:
        return inherit
    ps = _proj_spec(spec, what)
    group = 0 if ps.group_size is None else _int(ps.group_size, f"{what}.group_size")
    fid, name, lay = _fmt(ps.format, group, f"{what}.format")
    sdt = _scale_dtype(name, ps.scale_dtype, [s for s in scales if s is not None], f"{what}.scale_dtype")
    return _Proj(fid, name, lay, sdt, group)


def _check_bank_form(gate_up, gate, up, interleaved: bool, up_format, fused_extras: dict,
                     separate_extras: dict) -> bool:
    """The C rules on the banks, checked before the call: exactly one of gate_up and
    (gate, up); interleaving and up_format only where they mean something; each
    bank's scales and biases with their bank. Returns whether the banks are separate."""
    pair = gate is not None or up is not None
    if gate_up is not None and pair:
        given = "gate and up" if gate is not None and up is not None else ("gate" if gate is not None else "up")
        raise InvalidArgument(
            f"gate_up and {given} are both given: pass either the fused gate_up bank or the separate gate and up "
            "banks, not both")
    if gate_up is None and not pair:
        raise InvalidArgument("no gate and up weights: pass gate_up (one fused bank) or gate and up (two banks)")
    if pair and (gate is None or up is None):
        have, missing = ("gate", "up") if gate is not None else ("up", "gate")
        raise InvalidArgument(f"{missing} is missing but {have} is given: separate banks need both gate and up")
    wrong = separate_extras if gate_up is not None else fused_extras
    for name, value in wrong.items():
        if value is not None:
            if gate_up is not None:
                raise InvalidArgument(f"{name} is given but the layer has a fused gate_up bank: pass "
                                      f"gate_up{name[name.index('_'):]} (or separate gate and up banks)")
            raise InvalidArgument(f"{name} is given but the layer has separate gate and up banks: pass "
                                  f"gate{name[len('gate_up'):]} and up{name[len('gate_up'):]}")
    if pair and interleaved:
        raise InvalidArgument("gate_up_interleaved=True needs the fused gate_up bank: separate gate and up banks "
                              "are each their own matrix")
    if gate_up is not None and up_format is not None:
        raise InvalidArgument("up_format needs separate gate and up banks: a fused gate_up is one matrix in one "
                              "format (format= gives it)")
    return pair


class MoE:
    """A MoE layer of routed experts over the caller's weight banks
    (``moejit_moe_create``); kernels are generated here.

    Gate and up come either as one fused bank ``gate_up`` or as two separate banks
    ``gate`` and ``up`` (exactly one of the two forms; GGUF files and Hugging Face
    checkpoints store them apart). Banks, per expert e (each bank stacked
    ``[E, ...]`` or a sequence of E arrays):
        gate_up[e]: ``[2 * intermediate, ...]`` encoded weights of gate and up
            (rows ``[0, I)`` gate, ``[I, 2I)`` up; interleaved when
            ``gate_up_interleaved``: row 2j gate j, 2j+1 up j), each row the
            format's bytes for K = hidden (docs/FORMATS.md): bf16 ``[2I, H]``
            bf16, fp8_block / mxfp8 ``[2I, H]`` of 1-byte elements, mxfp4 / ds_fp4
            / nvfp4 ``[2I, H/2]`` uint8 (or ``[2I, H/32, 16]``), q4_0 / q8_0
            ``[2I, H/32 * 18 or 34]`` uint8, the GGUF K-quants q4_K / q5_K / q6_K /
            q2_K / q3_K ``[2I, H/256 * 144, 176, 210, 84 or 110]`` uint8 (or any
            shape whose rows hold those bytes, e.g. a GGUF tensor's).
        gate[e], up[e]: ``[intermediate, ...]`` each, rows of K = hidden (instead
            of gate_up).
        down[e]: ``[hidden, ...]``, rows of K = intermediate.
        *_scales[e]: block scales: fp8_block ``[ceil(rows/128), >= ceil(K/128)]``
            bf16 or f32; mxfp4 / ds_fp4 / mxfp8 ``[rows, >= K/g]`` e8m0 (uint8);
            nvfp4 ``[rows, >= K/16]`` e4m3. Wider rows (padding), or a column slice
            of a wider tensor, give the scale row stride. None for bf16, q4_0, q8_0
            and the K-quants (their scales are inside the weight bytes).
        *_row_scales[e]: nvfp4 only, fp32 ``[rows]``.
        *_bias[e]: optional bf16 ``[rows]``.

    Nothing is copied: the layer reads the arrays in place and holds references
    to them until it is closed or collected. Do not write into them meanwhile.

    Args:
        context: the :class:`Context` whose threads and tier the layer uses.
        format: "bf16", "fp8_block", "mxfp4", "q8_0", ... or the format id: the
            format of gate_up, or of gate (and of up and down unless up_format /
            down_format say otherwise).
        top_k: routes per token (topk_ids / topk_weights have top_k columns).
        hidden, intermediate, num_experts: None infers them from the banks.
        max_tokens: the largest num_tokens a call may pass (scratch is sized once).
        scale_dtype: fp8_block scales "bf16" or "f32"; None: the scale arrays' dtype.
        group_size: mxfp8 group (None or 0 = 32, 32, 64, 128).
        up_format, down_format: that projection's own encoding (a format name or
            id, a ``(format, scale_dtype, group_size)`` tuple or a
            :class:`ProjFormat`); None: as gate. up_format needs separate banks.
        activation: "silu", "gelu", "gelu_tanh", "swiglu_oai", "swiglu_clamp".
        swiglu_alpha: None = 1.702. swiglu_limit: None = no clamp.
        gate_up_interleaved: the fused bank's rows alternate gate and up (only
            with gate_up).
        router_weight_on_input: multiply the router weight into gate/up instead of
            the output.
        output_dtype: "bf16" or "f32" (the dtype of forward's output).
        source: any object the layer should hold for its lifetime and report as
            :attr:`source` (the loaders put the file reader whose maps the banks
            view there).
    """

    def __init__(
        self,
        context: Context,
        *,
        format: N.NameOrId,
        down: Bank,
        top_k: int,
        gate_up: Optional[Bank] = None,
        gate: Optional[Bank] = None,
        up: Optional[Bank] = None,
        gate_up_scales: Optional[Bank] = None,
        gate_scales: Optional[Bank] = None,
        up_scales: Optional[Bank] = None,
        down_scales: Optional[Bank] = None,
        gate_up_row_scales: Optional[Bank] = None,
        gate_row_scales: Optional[Bank] = None,
        up_row_scales: Optional[Bank] = None,
        down_row_scales: Optional[Bank] = None,
        gate_up_bias: Optional[Bank] = None,
        gate_bias: Optional[Bank] = None,
        up_bias: Optional[Bank] = None,
        down_bias: Optional[Bank] = None,
        hidden: Optional[int] = None,
        intermediate: Optional[int] = None,
        num_experts: Optional[int] = None,
        max_tokens: int = 16,
        scale_dtype: Any = None,
        group_size: Optional[int] = None,
        up_format: Any = None,
        down_format: Any = None,
        activation: N.NameOrId = "silu",
        swiglu_alpha: Optional[float] = None,
        swiglu_limit: Optional[float] = None,
        gate_up_interleaved: bool = False,
        router_weight_on_input: bool = False,
        output_dtype: Any = "bf16",
        source: Any = None,
    ):
        if not isinstance(context, Context):
            raise InvalidArgument(f"context must be a moejit.Context, got {type(context).__name__}")
        interleaved = _bool(gate_up_interleaved, "gate_up_interleaved")
        separate = _check_bank_form(
            gate_up, gate, up, interleaved, up_format,
            {"gate_up_scales": gate_up_scales, "gate_up_row_scales": gate_up_row_scales,
             "gate_up_bias": gate_up_bias},
            {"gate_scales": gate_scales, "up_scales": up_scales, "gate_row_scales": gate_row_scales,
             "up_row_scales": up_row_scales, "gate_bias": gate_bias, "up_bias": up_bias})
        group = 0 if group_size is None else _int(group_size, "group_size")
        fid, fname, lay = _fmt(format, group)
        e = None if num_experts is None else _int(num_experts, "num_experts", 1)
        first = "gate" if separate else "gate_up"
        g0 = B.experts(gate if separate else gate_up, first, e)
        e = len(g0)
        if e < 1:
            raise InvalidArgument(f"{first}: no experts")
        dn = B.experts(down, "down", e)
        dn_s = _optional_bank(down_scales, "down_scales", e)
        dn_r = _optional_bank(down_row_scales, "down_row_scales", e)
        dn_b = _optional_bank(down_bias, "down_bias", e)
        if separate:
            up_v = B.experts(up, "up", e)
            g_s, u_s = _optional_bank(gate_scales, "gate_scales", e), _optional_bank(up_scales, "up_scales", e)
            g_r = _optional_bank(gate_row_scales, "gate_row_scales", e)
            u_r = _optional_bank(up_row_scales, "up_row_scales", e)
            g_b, u_b = _optional_bank(gate_bias, "gate_bias", e), _optional_bank(up_bias, "up_bias", e)
        else:
            g_s = _optional_bank(gate_up_scales, "gate_up_scales", e)
            g_r = _optional_bank(gate_up_row_scales, "gate_up_row_scales", e)
            g_b = _optional_bank(gate_up_bias, "gate_up_bias", e)

        # Each projection's encoding: gate's from the layer's fields, up's and down's
        # their own or gate's.
        sdt = _scale_dtype(fname, scale_dtype, [s for s in g_s if s is not None], "scale_dtype")
        gp = _Proj(fid, fname, lay, sdt, group)
        upp = _resolve_proj(up_format, "up_format", u_s, gp) if separate else gp
        dnp = _resolve_proj(down_format, "down_format", dn_s, gp)

        # Geometry: given, or read from expert 0's shapes (then every expert is checked).
        g_rows, h = B.infer_k(gp.lay, g0[0], f"{first}[0]")
        B.infer_k(dnp.lay, dn[0], "down[0]")
        if hidden is None:
            hidden = h
        if intermediate is None:
            if separate:
                intermediate = g_rows
            else:
                if g_rows % 2:
                    raise InvalidArgument(f"gate_up[0]: {g_rows} rows, expected 2 * intermediate")
                intermediate = g_rows // 2
        hidden = _int(hidden, "hidden", 1)
        intermediate = _int(intermediate, "intermediate", 1)
        B.check_k(gp.lay, hidden, "hidden")
        if upp is not gp:
            B.check_k(upp.lay, hidden, "hidden (up's K)")
        B.check_k(dnp.lay, intermediate, "intermediate" if dnp is gp else "intermediate (down's K)")

        def names(bank: str, x: int) -> dict[str, str]:
            return {k: f"{bank}{suffix}[{x}]" for k, suffix in
                    (("data", ""), ("scales", "_scales"), ("row_scales", "_row_scales"), ("bias", "_bias"))}

        i_desc = f"intermediate = {intermediate}"
        if separate:
            g_m = [B.matrix(gp.lay, intermediate, hidden, gp.scale_dtype, g0[x], g_s[x], g_r[x], g_b[x],
                            names("gate", x), i_desc) for x in range(e)]
            u_m = [B.matrix(upp.lay, intermediate, hidden, upp.scale_dtype, up_v[x], u_s[x], u_r[x], u_b[x],
                            names("up", x), i_desc) for x in range(e)]
            gu_m = None
            self._formats = {"gate": gp.public(), "up": upp.public(), "down": dnp.public()}
        else:
            gu_m = [B.matrix(gp.lay, 2 * intermediate, hidden, gp.scale_dtype, g0[x], g_s[x], g_r[x], g_b[x],
                             names("gate_up", x), f"2 * intermediate = {2 * intermediate}") for x in range(e)]
            g_m = u_m = None
            self._formats = {"gate_up": gp.public(), "down": dnp.public()}
        dn_m = [
            B.matrix(dnp.lay, hidden, intermediate, dnp.scale_dtype, dn[x], dn_s[x], dn_r[x], dn_b[x],
                     names("down", x), f"hidden = {hidden}")
            for x in range(e)
        ]
        self._context = context
        self._format = fname
        self._top_k = _int(top_k, "top_k")
        self._hidden = hidden
        self._intermediate = intermediate
        self._num_experts = e
        self._max_tokens = _int(max_tokens, "max_tokens")
        self._out_dtype = N.dtype_id(output_dtype, "output_dtype")
        self._activation = N.activation_id(activation)
        self._scale_dtype = sdt
        self._group_size = group
        self._separate = separate
        self._core = _core.MoE(
            context._core,
            fid,
            sdt,
            group,
            hidden,
            intermediate,
            e,
            self._top_k,
            self._max_tokens,
            self._activation,
            0.0 if swiglu_alpha is None else _float(swiglu_alpha, "swiglu_alpha"),
            0.0 if swiglu_limit is None else _float(swiglu_limit, "swiglu_limit"),
            interleaved,
            _bool(router_weight_on_input, "router_weight_on_input"),
            self._out_dtype,
            gu_m,
            dn_m,
            g_m,
            u_m,
            None if up_format is None or not separate else upp.c(),
            None if down_format is None else dnp.c(),
        )
        self._source = source

    # ---- calls ----

    def _prepare(self, x, topk_ids, topk_weights, out):
        xv, t = _x_view(x, self._hidden, f"hidden = {self._hidden}")
        k = self._top_k
        iv = A.view(topk_ids, "topk_ids")
        A.check_matrix2d(iv, (t, k), ("int32",), "topk_ids", lambda: f"int32 expert ids, [num_tokens = {t}, top_k = {k}]")
        wv = A.view(topk_weights, "topk_weights")
        A.check_matrix2d(wv, (t, k), FLOAT32, "topk_weights", lambda: f"float32 router weights, [{t}, top_k = {k}]")
        if out is None:
            out = _out_like(x, (t, self._hidden), self._out_dtype)
        ov = _out_view(out, (t, self._hidden), self._out_dtype,
                       [(xv, "x"), (iv, "topk_ids"), (wv, "topk_weights")])
        return t, xv, iv, wv, out, ov

    def forward(self, x: ArrayLike, topk_ids: ArrayLike, topk_weights: ArrayLike, out: ArrayLike = None):
        """One call (``moejit_moe_forward``); the GIL is released while it runs.

        Args:
            x: ``[num_tokens, hidden]`` bf16 (ml_dtypes.bfloat16, torch.bfloat16, or
                uint16 / int16 bits), C-contiguous.
            topk_ids: ``[num_tokens, top_k]`` int32 expert ids; a negative id is a
                route computed elsewhere and is skipped.
            topk_weights: ``[num_tokens, top_k]`` float32 router weights.
            out: optional ``[num_tokens, hidden]`` output of the layer's
                output_dtype (bf16 or float32), C-contiguous, writable, sharing no
                memory with the inputs. None allocates one (a torch tensor when x
                is one, else numpy).

        Returns:
            out. ``num_tokens`` may be 0 (nothing runs). On error nothing is written.
        """
        t, xv, iv, wv, out, ov = self._prepare(x, topk_ids, topk_weights, out)
        self._core.forward(t, xv.array, iv.array, wv.array, ov.array)
        return out

    def submit(self, x: ArrayLike, topk_ids: ArrayLike, topk_weights: ArrayLike, out: ArrayLike = None) -> Task:
        """The same call, asynchronous (``moejit_moe_submit``): returns once the work is
        handed to the context's workers. ``Task.wait()`` ends it and returns out; the
        handle holds every array until then. Errors of the arguments are raised here,
        and nothing is queued; another call on the context before the wait raises
        :class:`Busy`."""
        t, xv, iv, wv, out, ov = self._prepare(x, topk_ids, topk_weights, out)
        self._core.submit(t, xv.array, iv.array, wv.array, ov.array)
        task = Task(self._context, self, (xv, iv, wv, ov, x, topk_ids, topk_weights), out)
        if t > 0:
            self._context._inflight = weakref.ref(task)
        else:
            task._done = True  # nothing was queued
        return task

    def stats(self) -> dict[str, int]:
        """Cumulative counters since creation, over successful calls with num_tokens > 0
        (``moejit_moe_stats_get``): calls, routes (non-negative routes served),
        unique_experts (sum over calls of distinct experts), weight_bytes_read
        (weight + scale bytes the plan streamed)."""
        return self._core.stats()

    def close(self) -> None:
        """Destroys the C layer (waiting for its task in flight) and drops the
        references to the banks. Later calls raise InvalidArgument."""
        self._core.close()

    def __enter__(self) -> "MoE":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- what it is ----

    @property
    def closed(self) -> bool:
        return self._core.closed

    @property
    def context(self) -> Context:
        return self._context

    @property
    def isa(self) -> str:
        return self._context.isa

    @property
    def format(self) -> str:
        """The format of gate_up, or of gate with separate banks (see :attr:`formats`)."""
        return self._format

    @property
    def formats(self) -> dict[str, ProjFormat]:
        """Each projection's encoding, by bank: ``{"gate_up": ..., "down": ...}`` or
        ``{"gate": ..., "up": ..., "down": ...}``, as :class:`ProjFormat` of names
        (group_size 0 = the format's default)."""
        return dict(self._formats)

    @property
    def separate_banks(self) -> bool:
        """Whether gate and up are separate banks (else one fused gate_up bank)."""
        return self._separate

    @property
    def source(self) -> Any:
        """What the layer was built from and holds for its lifetime (the loaders'
        file reader and layer description), or the ``source`` given; None by default."""
        return self._source

    @property
    def hidden(self) -> int:
        return self._hidden

    @property
    def intermediate(self) -> int:
        return self._intermediate

    @property
    def num_experts(self) -> int:
        return self._num_experts

    @property
    def top_k(self) -> int:
        return self._top_k

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    @property
    def activation(self) -> str:
        return N.name_of(N.ACTIVATIONS, self._activation)

    @property
    def output_dtype(self) -> str:
        return N.name_of(N.DTYPES, self._out_dtype)

    @property
    def scale_dtype(self) -> str:
        return N.name_of(N.DTYPES, self._scale_dtype)

    def bank_pointers(self) -> dict[str, list[dict[str, int]]]:
        """The addresses the C layer reads, per bank and expert: ``{"gate_up": [{"data",
        "scales", "row_scales", "bias", "scale_row_stride"}, ...], "down": [...]}``
        (``"gate"``, ``"up"``, ``"down"`` with separate banks; 0 where absent).
        Compare with your arrays' addresses to see that nothing was copied."""
        if self.closed:
            raise InvalidArgument("MoE is closed")
        banks = ("gate", "up", "down") if self._separate else ("gate_up", "down")
        return {b: [_ptrs(m) for m in getattr(self._core, b)] for b in banks}

    def __repr__(self) -> str:
        return (f"moejit.MoE(format={self._format!r}, hidden={self._hidden}, intermediate={self._intermediate}, "
                f"num_experts={self._num_experts}, top_k={self._top_k}, max_tokens={self._max_tokens}, "
                f"isa={self.isa!r})")


def _ptrs(m) -> dict[str, int]:
    return {"data": m.data_ptr, "scales": m.scales_ptr, "row_scales": m.row_scales_ptr, "bias": m.bias_ptr,
            "scale_row_stride": m.scale_row_stride}


class Linear:
    """A dense layer ``y[T, rows] = x[T, cols] W^T + bias`` over the caller's weight
    (``moejit_linear_create``), read in place like a MoE bank's matrix.

    Args:
        context: the :class:`Context`.
        format: as for :class:`MoE`.
        weight: ``[rows, ...]`` encoded weights, each row the format's bytes for K = cols.
        scales, row_scales, bias: as one expert's arrays of a :class:`MoE` bank.
        rows, cols: None infers them from weight.
        max_tokens, scale_dtype, group_size, output_dtype: as for :class:`MoE`.
    """

    def __init__(
        self,
        context: Context,
        *,
        format: N.NameOrId,
        weight: ArrayLike,
        scales: ArrayLike = None,
        row_scales: ArrayLike = None,
        bias: ArrayLike = None,
        rows: Optional[int] = None,
        cols: Optional[int] = None,
        max_tokens: int = 16,
        scale_dtype: Any = None,
        group_size: Optional[int] = None,
        output_dtype: Any = "bf16",
    ):
        if not isinstance(context, Context):
            raise InvalidArgument(f"context must be a moejit.Context, got {type(context).__name__}")
        group = 0 if group_size is None else _int(group_size, "group_size")
        fid, fname, lay = _fmt(format, group)
        wv = A.view(weight, "weight")
        r, c = B.infer_k(lay, wv, "weight")
        rows = r if rows is None else _int(rows, "rows", 1)
        cols = c if cols is None else _int(cols, "cols", 1)
        B.check_k(lay, cols, "cols")
        sv = None if scales is None else A.view(scales, "scales")
        rv = None if row_scales is None else A.view(row_scales, "row_scales")
        bv = None if bias is None else A.view(bias, "bias")
        sdt = _scale_dtype(fname, scale_dtype, [sv] if sv is not None else None, "scale_dtype")
        m = B.matrix(lay, rows, cols, sdt, wv, sv, rv, bv,
                     {"data": "weight", "scales": "scales", "row_scales": "row_scales", "bias": "bias"},
                     f"rows = {rows}")
        self._context = context
        self._format = fname
        self._rows = rows
        self._cols = cols
        self._max_tokens = _int(max_tokens, "max_tokens")
        self._out_dtype = N.dtype_id(output_dtype, "output_dtype")
        self._core = _core.Linear(context._core, fid, sdt, group, rows, cols, self._max_tokens, self._out_dtype, m)

    def forward(self, x: ArrayLike, out: ArrayLike = None):
        """``y = x W^T + bias`` (``moejit_linear_forward``), the GIL released meanwhile.

        Args:
            x: ``[num_tokens, cols]`` bf16, C-contiguous.
            out: optional ``[num_tokens, rows]`` of output_dtype (see :meth:`MoE.forward`).

        Returns:
            out (allocated when None).
        """
        xv, t = _x_view(x, self._cols, f"cols = {self._cols}")
        if out is None:
            out = _out_like(x, (t, self._rows), self._out_dtype)
        ov = _out_view(out, (t, self._rows), self._out_dtype, [(xv, "x")])
        self._core.forward(t, xv.array, ov.array)
        return out

    def close(self) -> None:
        """Destroys the C layer and drops the reference to the weight."""
        self._core.close()

    def __enter__(self) -> "Linear":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._core.closed

    @property
    def context(self) -> Context:
        return self._context

    @property
    def format(self) -> str:
        return self._format

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def cols(self) -> int:
        return self._cols

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    @property
    def output_dtype(self) -> str:
        return N.name_of(N.DTYPES, self._out_dtype)

    def weight_pointers(self) -> dict[str, int]:
        """The addresses the C layer reads (see :meth:`MoE.bank_pointers`)."""
        if self.closed:
            raise InvalidArgument("Linear is closed")
        return _ptrs(self._core.weight)

    def __repr__(self) -> str:
        return f"moejit.Linear(format={self._format!r}, rows={self._rows}, cols={self._cols}, isa={self._context.isa!r})"
