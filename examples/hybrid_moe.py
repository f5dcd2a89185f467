#!/usr/bin/env python3
"""A hybrid GPU + CPU MoE layer: DeepSeek-V3 geometry, fp8_block experts.

A fraction of the experts is resident on the GPU (torch tensors); all of them sit
in pinned host memory, where moejit reads them in place. A batch is served three
ways, and each is timed per layer:

  (a) fetch: every missed expert is copied over PCIe (pinned host -> GPU, on a
      copy stream, chunk by chunk) and computed on the GPU, while the GPU
      computes the resident ones;
  (b) cpu: moejit computes the missed experts on the CPU (``MoE.submit``) while
      the GPU computes the resident ones; then ``Task.wait`` and one add;
  (c) split: the split the model of ``moejit-bench --profile`` recommends
      (tools/bench_profile.cpp, docs/TOOLS.md): a fraction f of the missed
      experts on the CPU, the rest fetched, all at once.

for miss rates 10, 25, 50, 75 % (the share of the experts that are not
resident; routing is uniform, so it is also the expected share of a call's
distinct experts that miss) and 1, 4, 16 tokens. It prints a markdown table
(model predictions next to measurements) and writes every number as JSON to
``--out``.

The model's inputs are the CPU's GB/s on this layer per token count, the DRAM
read GB/s and the PCIe GB/s: from a profile written on the same machine
(``moejit-bench --preset deepseek-v3 --format fp8_block --tokens 1,4,16
--profile prof.json``; ``--profile prof.json``) or measured here (moejit on
cold experts alone; pinned host-to-GPU copies). The GPU computes by
dequantizing fp8 to bf16 with torch ops (correctness first, not speed); its
time is reported separately.

Everything but the GPU part is importable and runs without torch: the routing
split, the CPU path and the model (tests/python/test_hybrid_example.py), and
``--plan-only`` prints the model's table from a profile without a GPU.

Host memory: the experts' bytes (256 x 44 MB = 11.3 GB at the real geometry)
plus small buffers; ``--experts`` uses fewer, ``--max-host-gb`` (default 60)
refuses more.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

import numpy as np

import moejit

BLOCK = 128  # fp8_block scale block (rows and columns)
DEEPSEEK_V3 = {"hidden": 7168, "intermediate": 2048, "experts": 256, "top_k": 8}
MISS_RATES = (0.10, 0.25, 0.50, 0.75)
TOKENS = (1, 4, 16)


# ---------------------------------------------------------------------------------------------
# The backend model of moejit-bench --profile (tools/bench_profile.cpp, model_backends)
# ---------------------------------------------------------------------------------------------


def model_backends(missing_bytes: float, cpu_gbps: float, pcie_gbs: float, dram_gbps: float,
                   hybrid_margin: float = 0.10) -> dict:
    """Expected seconds per call for the missing experts' bytes on each backend, as
    moejit-bench --profile computes them: cpu = bytes / CPU GB/s; pcie = bytes / PCIe
    GB/s (GPU compute assumed negligible); hybrid = a share f on the CPU with
    f cpu = (1 - f) pcie, held at the DRAM floor bytes / max(DRAM GB/s, PCIe GB/s)
    (CPU and DMA read the same DRAM). hybrid is picked only when it beats the better
    single backend by more than `hybrid_margin`."""
    m = {"missing_bytes": missing_bytes, "cpu_s": 0.0, "pcie_s": 0.0, "cpu_fraction": 0.0, "hybrid_ideal_s": 0.0,
         "dram_capacity_gbps": 0.0, "dram_floor_s": 0.0, "hybrid_s": 0.0, "best": "none", "best_s": 0.0}
    if missing_bytes <= 0:
        return m
    cpu = missing_bytes / (cpu_gbps * 1e9) if cpu_gbps > 0 else math.inf
    pcie = missing_bytes / (pcie_gbs * 1e9)
    m["cpu_s"], m["pcie_s"] = cpu, pcie
    if math.isfinite(cpu):
        m["cpu_fraction"] = pcie / (cpu + pcie)
        m["hybrid_ideal_s"] = cpu * pcie / (cpu + pcie)
    else:
        m["hybrid_ideal_s"] = pcie
    m["dram_capacity_gbps"] = max(dram_gbps, pcie_gbs)
    m["dram_floor_s"] = missing_bytes / (m["dram_capacity_gbps"] * 1e9)
    m["hybrid_s"] = max(m["hybrid_ideal_s"], m["dram_floor_s"])
    single = min(cpu, pcie)
    m["best"] = "cpu" if cpu <= pcie else "pcie"
    m["best_s"] = single
    if m["hybrid_s"] < single * (1.0 - hybrid_margin):
        m["best"], m["best_s"] = "hybrid", m["hybrid_s"]
    return m


def cpu_share(model: dict) -> float:
    """The share of the missed experts the recommendation puts on the CPU."""
    return {"cpu": 1.0, "pcie": 0.0, "none": 0.0}.get(model["best"], model["cpu_fraction"])


def load_profile(path: str, fmt: str = "fp8_block") -> dict[int, dict]:
    """The fastest entry per token count of a moejit-bench --profile file (schema 1):
    {tokens: {"cpu_gbps", "dram_gbps", "threads", "isa", "expert_bytes", ...}}."""
    with open(path) as f:
        doc = json.load(f)
    if doc.get("schema_version") != 1:
        raise ValueError(f"{path}: schema_version {doc.get('schema_version')!r}, this example reads 1")
    best: dict[int, dict] = {}
    for e in doc["entries"]:
        if e["format"] != fmt:
            continue
        t = int(e["tokens"])
        if t not in best or e["cpu_gbps"] > best[t]["cpu_gbps"]:
            best[t] = e
    if not best:
        raise ValueError(f"{path}: no {fmt} entries")
    return best


# ---------------------------------------------------------------------------------------------
# The layer in host memory
# ---------------------------------------------------------------------------------------------


def scale_shape(rows: int, k: int) -> tuple[int, int]:
    return -(-rows // BLOCK), -(-k // BLOCK)


def expert_bytes(hidden: int, intermediate: int) -> int:
    """Weight + scale bytes of one expert (e4m3 weights, bf16 128x128 scales)."""
    gr, gc = scale_shape(2 * intermediate, hidden)
    dr, dc = scale_shape(hidden, intermediate)
    return 2 * intermediate * hidden + hidden * intermediate + 2 * (gr * gc + dr * dc)


@dataclass
class HostLayer:
    """The banks of every expert, stacked: e4m3 codes as uint8, bf16 scales as uint16 bits."""

    w13: np.ndarray  # [E, 2I, H] uint8
    s13: np.ndarray  # [E, ceil(2I/128), ceil(H/128)] uint16
    w2: np.ndarray  # [E, H, I] uint8
    s2: np.ndarray  # [E, ceil(H/128), ceil(I/128)] uint16
    keep: list = field(default_factory=list)  # owners of the memory (pinned tensors)

    @property
    def experts(self) -> int:
        return self.w13.shape[0]

    @property
    def hidden(self) -> int:
        return self.w13.shape[2]

    @property
    def intermediate(self) -> int:
        return self.w2.shape[2]


def fill_e4m3(a: np.ndarray, rng) -> None:
    """Random e4m3 codes, never 0x7F / 0xFF (NaN to torch's float8_e4m3fn, +-480 to moejit)."""
    r = rng.integers(0, 254, size=a.shape, dtype=np.uint8)
    np.add(r, r >= 127, out=a, casting="unsafe")


def fill_scales(a: np.ndarray, rng) -> None:
    """bf16 scales in [2^-12, 2^-11): keeps a layer of random codes in range."""
    v = np.exp2(-12 + rng.random(a.shape)).astype(np.float32)
    a[...] = (v.view(np.uint32) >> 16).astype(np.uint16)


def make_host_layer(experts: int, hidden: int, intermediate: int, seed: int = 0, empty=None) -> HostLayer:
    """Random fp8_block experts. `empty(shape, np_dtype) -> (numpy view, owner)` allocates
    (default numpy; the GPU run passes pinned torch tensors)."""
    if empty is None:
        def empty(shape, dtype):
            a = np.empty(shape, dtype)
            return a, a
    rng = np.random.default_rng(seed)
    keep = []

    def alloc(shape, dtype):
        a, owner = empty(shape, dtype)
        keep.append(owner)
        return a

    w13 = alloc((experts, 2 * intermediate, hidden), np.uint8)
    w2 = alloc((experts, hidden, intermediate), np.uint8)
    s13 = alloc((experts,) + scale_shape(2 * intermediate, hidden), np.uint16)
    s2 = alloc((experts,) + scale_shape(hidden, intermediate), np.uint16)
    for e in range(experts):  # per expert: bounded temporaries
        fill_e4m3(w13[e], rng)
        fill_e4m3(w2[e], rng)
    fill_scales(s13, rng)
    fill_scales(s2, rng)
    return HostLayer(w13, s13, w2, s2, keep)


def cpu_layer(ctx: moejit.Context, layer: HostLayer, top_k: int, max_tokens: int) -> moejit.MoE:
    """The moejit layer over every expert of the host banks, read in place."""
    return moejit.MoE(ctx, format="fp8_block", gate_up=layer.w13, down=layer.w2, gate_up_scales=layer.s13,
                      down_scales=layer.s2, scale_dtype="bf16", top_k=top_k, max_tokens=max_tokens,
                      output_dtype="bf16")


# ---------------------------------------------------------------------------------------------
# Routing and the split
# ---------------------------------------------------------------------------------------------


def resident_mask(experts: int, miss_rate: float, rng) -> np.ndarray:
    """Which experts the GPU holds: round((1 - miss_rate) * E) of them, at random."""
    n = int(round((1.0 - miss_rate) * experts))
    mask = np.zeros(experts, bool)
    mask[rng.choice(experts, size=n, replace=False)] = True
    return mask


def route(rng, tokens: int, experts: int, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Uniform routing: top_k distinct experts per token, router weights summing to 1."""
    ids = np.stack([rng.choice(experts, size=top_k, replace=False) for _ in range(tokens)]).astype(np.int32)
    w = rng.random((tokens, top_k)).astype(np.float32) + 0.1
    return ids, (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


@dataclass
class Split:
    """One call's routes, each in exactly one part (-1 elsewhere)."""

    resident: np.ndarray  # [T, k] ids the GPU holds
    cpu: np.ndarray  # [T, k] missed ids moejit computes
    fetch: np.ndarray  # [T, k] missed ids copied to the GPU
    missed: np.ndarray  # distinct missed experts, ascending
    cpu_experts: np.ndarray  # the missed experts on the CPU
    fetch_experts: np.ndarray  # the missed experts fetched


def split_routes(ids: np.ndarray, resident: np.ndarray, cpu_fraction: float) -> Split:
    """Resident routes stay on the GPU; of the distinct missed experts, the first
    round(cpu_fraction * M) (ascending id) go to the CPU, the rest are fetched."""
    if not 0.0 <= cpu_fraction <= 1.0:
        raise ValueError(f"cpu_fraction = {cpu_fraction} is not in [0, 1]")
    valid = ids >= 0
    on_gpu = np.zeros(ids.shape, bool)
    on_gpu[valid] = resident[ids[valid]]
    missed = np.unique(ids[valid & ~on_gpu])
    n_cpu = int(round(cpu_fraction * len(missed)))
    cpu_experts, fetch_experts = missed[:n_cpu], missed[n_cpu:]
    to_cpu = valid & ~on_gpu & np.isin(ids, cpu_experts)
    to_fetch = valid & ~on_gpu & ~to_cpu
    neg = np.int32(-1)
    return Split(np.where(on_gpu, ids, neg), np.where(to_cpu, ids, neg), np.where(to_fetch, ids, neg), missed,
                 cpu_experts, fetch_experts)


def groups(ids: np.ndarray, weights: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """expert -> (token indices, router weights) of its routes (ascending expert id)."""
    out: dict[int, tuple[list, list]] = {}
    for t, j in zip(*np.nonzero(ids >= 0)):
        e = int(ids[t, j])
        out.setdefault(e, ([], []))
        out[e][0].append(t)
        out[e][1].append(weights[t, j])
    return {e: (np.array(ts, np.int64), np.array(ws, np.float32)) for e, (ts, ws) in sorted(out.items())}


# ---------------------------------------------------------------------------------------------
# A float64 reference for small layers (tests; the GPU run checks against moejit instead)
# ---------------------------------------------------------------------------------------------


def bf16_to_f64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def dequant_e4m3(codes: np.ndarray) -> np.ndarray:
    import ml_dtypes

    return codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def dequant(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    rows, k = w.shape
    full = np.repeat(np.repeat(bf16_to_f64(s), BLOCK, 0), BLOCK, 1)[:rows, :k]
    return dequant_e4m3(w) * full


def reference(layer: HostLayer, x_bits: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """float64 y of the routes in `ids` (docs/FORMATS.md, g rounded to bf16)."""
    import ml_dtypes

    x = bf16_to_f64(x_bits)
    y = np.zeros((x.shape[0], layer.hidden))
    inter = layer.intermediate
    for e, (toks, ws) in groups(ids, weights).items():
        h = x[toks] @ dequant(layer.w13[e], layer.s13[e]).T
        gate, up = h[:, :inter], h[:, inter:]
        g = (gate / (1 + np.exp(-gate)) * up).astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
        y[toks] += ws[:, None].astype(np.float64) * (g @ dequant(layer.w2[e], layer.s2[e]).T)
    return y


# ---------------------------------------------------------------------------------------------
# Predictions: the model per token count and miss rate
# ---------------------------------------------------------------------------------------------


def predict(missed_experts: float, ebytes: int, cpu_gbps: float, pcie_gbs: float, dram_gbps: float) -> dict:
    return model_backends(missed_experts * ebytes, cpu_gbps, pcie_gbs, dram_gbps)


def expected_missed(tokens: int, experts: int, top_k: int, miss_rate: float) -> float:
    """Expected distinct experts of a uniform call times the miss rate (the profile's
    missing_experts_per_call)."""
    p_unused = 1.0
    for i in range(top_k):  # one token picks top_k distinct: P(expert not picked) = (E - k) / E
        p_unused *= (experts - 1 - i) / (experts - i)
    distinct = experts * (1.0 - p_unused ** tokens)
    return miss_rate * distinct


def markdown_table(rows: list[dict], measured: bool) -> str:
    head = ["tokens", "miss %", "missed experts", "model cpu ms", "model pcie ms", "model hybrid ms (f)",
            "model picks"]
    if measured:
        head += ["(a) fetch ms", "(b) cpu ms", "(c) split ms", "GPU resident ms", "fastest", "model right"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        m = r["model"]
        cells = [str(r["tokens"]), f"{100 * r['miss_rate']:.0f}", f"{r['missed_experts']:.1f}",
                 f"{1e3 * m['cpu_s']:.2f}", f"{1e3 * m['pcie_s']:.2f}",
                 f"{1e3 * m['hybrid_s']:.2f} ({m['cpu_fraction']:.2f})", m["best"]]
        if measured:
            ms = r["measured_ms"]
            cells += [f"{ms['fetch']:.2f}", f"{ms['cpu']:.2f}", f"{ms['split']:.2f}", f"{ms['gpu_resident']:.2f}",
                      r["fastest"], "yes" if r["model_right"] else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fastest(measured_ms: dict) -> str:
    """The fastest way as the model names it (fetch = pcie, split = hybrid)."""
    names = {"fetch": "pcie", "cpu": "cpu", "split": "hybrid"}
    return names[min(("fetch", "cpu", "split"), key=lambda k: measured_ms[k])]


def model_right(measured_ms: dict, tolerance: float = 0.10) -> bool:
    """Whether (c), the way the model picked, is within `tolerance` of the fastest
    way measured."""
    best = min(measured_ms["fetch"], measured_ms["cpu"], measured_ms["split"])
    return measured_ms["split"] <= best * (1 + tolerance)


# ---------------------------------------------------------------------------------------------
# The GPU side (torch)
# ---------------------------------------------------------------------------------------------


class Gpu:
    """Resident experts and fetch staging on the GPU; computes routes by dequantizing
    fp8 to bf16 with torch ops, in chunks of experts (batched matmuls)."""

    def __init__(self, torch, layer: HostLayer, host_t: dict, max_fetch: int, chunk: int):
        self.torch = torch
        self.dev = torch.device("cuda")
        self.layer = layer
        self.host = host_t  # pinned torch views of the host banks: w13, s13, w2, s2
        self.chunk = chunk
        self.copy_stream = torch.cuda.Stream()
        e, h, i = layer.experts, layer.hidden, layer.intermediate
        self.slots_of: dict[int, int] = {}
        self.bank = None
        n = max(1, max_fetch)
        # e4m3 codes are kept as uint8 (index_select and copies are not implemented for
        # float8 dtypes in every torch) and viewed as float8_e4m3fn only to convert.
        self.stage = {
            "w13": torch.empty((n, 2 * i, h), dtype=torch.uint8, device=self.dev),
            "w2": torch.empty((n, h, i), dtype=torch.uint8, device=self.dev),
            "s13": torch.empty((n,) + tuple(layer.s13.shape[1:]), dtype=torch.bfloat16, device=self.dev),
            "s2": torch.empty((n,) + tuple(layer.s2.shape[1:]), dtype=torch.bfloat16, device=self.dev),
        }

    def load_resident(self, mask: np.ndarray) -> None:
        t = self.torch
        experts = np.flatnonzero(mask)
        self.bank = None
        t.cuda.empty_cache()
        self.bank = {k: t.empty((max(1, len(experts)),) + tuple(v.shape[1:]), dtype=v.dtype, device=self.dev)
                     for k, v in self.host.items()}
        for s, e in enumerate(experts):  # expert by expert: no host-side temporary of the whole set
            for k, v in self.host.items():
                self.bank[k][s].copy_(v[int(e)], non_blocking=True)
        t.cuda.synchronize()
        self.slots_of = {int(e): s for s, e in enumerate(experts)}

    def _dequant(self, w, s):
        n, rows, k = w.shape
        b = BLOCK
        wd = w.view(self.torch.float8_e4m3fn).to(self.torch.bfloat16).view(n, rows // b, b, k // b, b)
        return wd.mul_(s.view(n, rows // b, 1, k // b, 1)).view(n, rows, k)

    def compute(self, y, x, bank: dict, work: list[tuple[int, np.ndarray, np.ndarray]], ready=None) -> None:
        """y[T, H] fp32 += the routes of `work` (slot in `bank`, tokens, weights); chunk c
        waits for event ready[c] when given (its experts' copies)."""
        t = self.torch
        inter = self.layer.intermediate
        for c0 in range(0, len(work), self.chunk):
            part = work[c0:c0 + self.chunk]
            if ready is not None:
                t.cuda.current_stream().wait_event(ready[c0 // self.chunk])
            slots = t.tensor([p[0] for p in part], device=self.dev)
            n, maxt = len(part), max(len(p[1]) for p in part)
            e_idx = np.concatenate([np.full(len(p[1]), j) for j, p in enumerate(part)])
            pos = np.concatenate([np.arange(len(p[1])) for p in part])
            tok = np.concatenate([p[1] for p in part])
            wts = np.concatenate([p[2] for p in part])
            e_idx, pos, tok = (t.from_numpy(a.astype(np.int64)).to(self.dev) for a in (e_idx, pos, tok))
            wts = t.from_numpy(wts).to(self.dev)
            xp = t.zeros((n, maxt, x.shape[1]), dtype=t.bfloat16, device=self.dev)
            xp[e_idx, pos] = x[tok]
            w13 = self._dequant(bank["w13"].index_select(0, slots), bank["s13"].index_select(0, slots))
            h = t.bmm(xp, w13.transpose(1, 2)).float()
            del w13
            g = (t.nn.functional.silu(h[..., :inter]) * h[..., inter:]).to(t.bfloat16)
            w2 = self._dequant(bank["w2"].index_select(0, slots), bank["s2"].index_select(0, slots))
            o = t.bmm(g, w2.transpose(1, 2)).float()
            y.index_add_(0, tok, o[e_idx, pos] * wts[:, None])

    def fetch(self, experts: np.ndarray) -> list:
        """Copies the experts into staging slots 0.. on the copy stream; one event per chunk."""
        t = self.torch
        events = []
        self.copy_stream.wait_stream(t.cuda.current_stream())  # the slots' previous readers are done
        with t.cuda.stream(self.copy_stream):
            for c0 in range(0, len(experts), self.chunk):
                for j in range(c0, min(c0 + self.chunk, len(experts))):
                    e = int(experts[j])
                    for k in ("w13", "s13", "w2", "s2"):
                        self.stage[k][j].copy_(self.host[k][e], non_blocking=True)
                ev = t.cuda.Event()
                ev.record(self.copy_stream)
                events.append(ev)
        return events

    def resident_work(self, ids, w):
        return [(self.slots_of[e], toks, ws) for e, (toks, ws) in groups(ids, w).items()]


def measure_pcie_gbs(torch, nbytes: int = 1 << 30, reps: int = 5) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def measure_cpu_gbps(moe: moejit.MoE, layer: HostLayer, tokens: int, top_k: int, rng, calls: int) -> dict:
    """moejit alone on cold experts (uniform routing): GB/s of the distinct experts' bytes."""
    ebytes = expert_bytes(layer.hidden, layer.intermediate)
    x = np.zeros((tokens, layer.hidden), np.uint16)
    x[:] = 0x3F80  # 1.0
    gbps, secs = [], []
    for c in range(calls + 2):
        ids, w = route(rng, tokens, layer.experts, top_k)
        t0 = time.perf_counter()
        moe.forward(x, ids, w)
        s = time.perf_counter() - t0
        if c >= 2:
            secs.append(s)
            gbps.append(len(np.unique(ids)) * ebytes / s / 1e9)
    return {"cpu_gbps": statistics.median(gbps), "median_call_s": statistics.median(secs)}


def serve(gpu: Gpu, moe: moejit.MoE, x_gpu, x_host, y_host, ids, w, split: Split, way: str) -> tuple[float, object]:
    """One layer call served `way` ("fetch", "cpu", "split"); returns (seconds, y on the GPU, fp32)."""
    t = gpu.torch
    if way == "fetch":  # every missed expert over PCIe
        cpu_ids, fetch_ids = None, np.where(split.cpu >= 0, split.cpu, split.fetch)
    elif way == "cpu":  # every missed expert on the CPU
        cpu_ids, fetch_ids = np.where(split.fetch >= 0, split.fetch, split.cpu), None
    else:
        cpu_ids, fetch_ids = split.cpu, split.fetch
    fetched = np.unique(fetch_ids[fetch_ids >= 0]) if fetch_ids is not None else np.zeros(0, np.int32)
    t.cuda.synchronize()
    t0 = time.perf_counter()
    y = t.zeros(x_gpu.shape, dtype=t.float32, device=gpu.dev)
    task = None
    if cpu_ids is not None and (cpu_ids >= 0).any():
        x_host.copy_(x_gpu)  # the activations come from the GPU (synchronous, T x H bf16)
        task = moe.submit(x_host, cpu_ids, w, out=y_host)  # pinned torch tensors, read and written in place
    events = gpu.fetch(fetched) if len(fetched) else None
    gpu.compute(y, x_gpu, gpu.bank, gpu.resident_work(split.resident, w))
    if events:
        slot = {int(e): j for j, e in enumerate(fetched)}
        work = [(slot[e], toks, ws) for e, (toks, ws) in groups(fetch_ids, w).items()]
        gpu.compute(y, x_gpu, gpu.stage, work, ready=events)
    if task is not None:
        task.wait()
        y += y_host.to(gpu.dev, non_blocking=True).float()
    t.cuda.synchronize()
    return time.perf_counter() - t0, y


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experts", type=int, default=DEEPSEEK_V3["experts"], help="experts in the layer (256)")
    p.add_argument("--hidden", type=int, default=DEEPSEEK_V3["hidden"])
    p.add_argument("--intermediate", type=int, default=DEEPSEEK_V3["intermediate"])
    p.add_argument("--top-k", type=int, default=DEEPSEEK_V3["top_k"])
    p.add_argument("--tokens", type=lambda s: [int(v) for v in s.split(",")], default=list(TOKENS))
    p.add_argument("--miss-rates", type=lambda s: [float(v) for v in s.split(",")], default=list(MISS_RATES))
    p.add_argument("--iters", type=int, default=10, help="timed calls per way and case (median reported)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=None,
                   help="moejit workers (default: the CPUs of the affinity mask but one, left to the GPU driver)")
    p.add_argument("--chunk", type=int, default=8, help="experts per batched GPU matmul")
    p.add_argument("--profile", help="moejit-bench --profile JSON of this machine (CPU and DRAM GB/s)")
    p.add_argument("--pcie-gbs", type=float, help="host-to-GPU GB/s (default: measured)")
    p.add_argument("--max-host-gb", type=float, default=60.0, help="refuse layers with more host bytes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plan-only", action="store_true",
                   help="no GPU: print the model's table from --profile and --pcie-gbs")
    p.add_argument("--out", help="write every number as JSON here")
    a = p.parse_args(argv)
    if a.hidden % BLOCK or a.intermediate % BLOCK:
        p.error("--hidden and --intermediate must be multiples of 128 (the GPU dequantizes whole blocks)")
    if not 1 <= a.top_k <= a.experts:
        p.error("--top-k must be in [1, --experts]")
    if any(not 0 <= m <= 1 for m in a.miss_rates):
        p.error("--miss-rates must be in [0, 1]")
    host_gb = a.experts * expert_bytes(a.hidden, a.intermediate) / 1e9
    if host_gb > a.max_host_gb:
        p.error(f"{a.experts} experts need {host_gb:.1f} GB of host memory, over --max-host-gb {a.max_host_gb}: "
                "pass fewer --experts")
    if a.plan_only and not (a.profile and a.pcie_gbs):
        p.error("--plan-only needs --profile and --pcie-gbs")
    return a


def model_rows(a, ebytes: int, cpu: dict[int, dict], pcie_gbs: float, missed_of=None) -> list[dict]:
    rows = []
    for tokens in a.tokens:
        for m in a.miss_rates:
            missed = missed_of(tokens, m) if missed_of else expected_missed(tokens, a.experts, a.top_k, m)
            c = cpu[tokens]
            rows.append({"tokens": tokens, "miss_rate": m, "missed_experts": missed,
                         "model": predict(missed, ebytes, c["cpu_gbps"], pcie_gbs, c["dram_gbps"])})
    return rows


def write_json(path: str | None, doc: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")


def cpu_inputs_from_profile(path: str, tokens: list[int]) -> dict[int, dict]:
    prof = load_profile(path)
    missing = [t for t in tokens if t not in prof]
    if missing:
        raise SystemExit(f"{path}: no fp8_block entries for tokens {missing}")
    return {t: {"cpu_gbps": prof[t]["cpu_gbps"], "dram_gbps": prof[t]["dram_gbps"], "source": path}
            for t in tokens}


def main(argv=None) -> int:
    a = parse_args(argv)
    ebytes = expert_bytes(a.hidden, a.intermediate)
    geometry = {"hidden": a.hidden, "intermediate": a.intermediate, "experts": a.experts, "top_k": a.top_k,
                "format": "fp8_block", "expert_bytes": ebytes}
    if a.plan_only:
        cpu = cpu_inputs_from_profile(a.profile, a.tokens)
        rows = model_rows(a, ebytes, cpu, a.pcie_gbs)
        print(markdown_table(rows, measured=False))
        write_json(a.out, {"geometry": geometry, "inputs": {"pcie_gbs": a.pcie_gbs, "cpu": cpu}, "rows": rows})
        return 0
    return run_gpu(a, ebytes, geometry)


def run_gpu(a, ebytes: int, geometry: dict) -> int:
    try:
        import torch
    except ImportError:
        raise SystemExit("the GPU run needs torch; --plan-only prints the model's table without it") from None

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: use --plan-only for the model's table")
    affinity = sorted(os.sched_getaffinity(0))
    threads = a.threads or max(1, len(affinity) - 1)
    ctx = moejit.Context(cpu_ids=affinity[-threads:]) if threads < len(affinity) else moejit.Context()
    if threads < len(affinity):
        os.sched_setaffinity(0, {affinity[0]})  # this (GPU driving) thread off the moejit workers' CPUs

    def pinned(shape, dtype):  # uint16 (bf16 bits) as int16: torch's uint16 has no .numpy() everywhere
        t = torch.empty(shape, dtype=torch.uint8 if dtype == np.uint8 else torch.int16, pin_memory=True)
        return t.numpy().view(dtype), t

    t0 = time.perf_counter()
    layer = make_host_layer(a.experts, a.hidden, a.intermediate, a.seed, empty=pinned)
    print(f"host layer: {a.experts} experts x {ebytes / 1e6:.1f} MB in pinned memory "
          f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    host_t = {"w13": layer.keep[0], "w2": layer.keep[1],  # uint8 e4m3 codes, int16 bf16 bits: pinned
              "s13": layer.keep[2].view(torch.bfloat16), "s2": layer.keep[3].view(torch.bfloat16)}
    max_tokens = max(a.tokens)
    moe = cpu_layer(ctx, layer, a.top_k, max_tokens)
    rng = np.random.default_rng(a.seed + 1)

    pcie = a.pcie_gbs or measure_pcie_gbs(torch)
    if a.profile:
        cpu = cpu_inputs_from_profile(a.profile, a.tokens)
    else:  # measured here; the DRAM capacity is taken as what moejit reached (no probe)
        cpu = {}
        for t in a.tokens:
            m = measure_cpu_gbps(moe, layer, t, a.top_k, rng, calls=max(5, a.iters))
            cpu[t] = {"cpu_gbps": m["cpu_gbps"], "dram_gbps": m["cpu_gbps"], "median_call_s": m["median_call_s"],
                      "source": "measured by this example"}
    per_tokens = ", ".join(f"{t}: {v['cpu_gbps']:.1f}" for t, v in cpu.items())
    print(f"inputs: pcie {pcie:.1f} GB/s; cpu GB/s per tokens {per_tokens}; moejit {ctx.isa} x {ctx.num_threads}",
          file=sys.stderr)

    gpu = Gpu(torch, layer, host_t, max_fetch=max_tokens * a.top_k, chunk=a.chunk)
    x_host = torch.empty((max_tokens, a.hidden), dtype=torch.bfloat16, pin_memory=True)
    y_host = torch.empty((max_tokens, a.hidden), dtype=torch.bfloat16, pin_memory=True)
    rows, checks = [], []
    ways = ("fetch", "cpu", "split")
    for m in a.miss_rates:
        mask = resident_mask(a.experts, m, rng)
        gpu.load_resident(mask)
        for tokens in a.tokens:
            c = cpu[tokens]
            # The recommendation's CPU share depends on the GB/s only, not on the bytes.
            f = cpu_share(predict(expected_missed(tokens, a.experts, a.top_k, m), ebytes, c["cpu_gbps"], pcie,
                                  c["dram_gbps"]))
            xh, yh = x_host[:tokens], y_host[:tokens]

            def call():
                ids, w = route(rng, tokens, a.experts, a.top_k)
                x = torch.randn((tokens, a.hidden), device="cuda").to(torch.bfloat16)
                return ids, w, split_routes(ids, mask, f), x

            # Correctness: the three ways on one routing against moejit computing every route.
            ids, w, sp, x = call()
            ref = moe.forward(x.cpu().view(torch.int16).numpy(), ids, w)
            ref_t = torch.from_numpy(ref.view(np.int16)).view(torch.bfloat16).float().cuda()
            scale = ref_t.abs().max().item() or 1.0
            for way in ways:
                err = (serve(gpu, moe, x, xh, yh, ids, w, sp, way)[1] - ref_t).abs().max().item() / scale
                checks.append({"tokens": tokens, "miss_rate": m, "way": way, "max_rel_err": err})
                if err > 2e-2:
                    raise SystemExit(f"{way} at {tokens} tokens, miss {m}: max error {err:.3g} of max |y|")
            # Timing: every call a fresh routing (cold experts for each way, whatever ran before),
            # the ways in rotating order.
            times = {k: [] for k in ways + ("gpu_resident",)}
            missed_counts = []
            for it in range(a.warmup + a.iters):
                for j in range(len(ways)):
                    way = ways[(it + j) % len(ways)]
                    ids, w, sp, x = call()
                    dt = serve(gpu, moe, x, xh, yh, ids, w, sp, way)[0]
                    if it >= a.warmup:
                        times[way].append(dt)
                        missed_counts.append(len(sp.missed))
                ids, w, sp, x = call()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                gpu.compute(torch.zeros((tokens, a.hidden), device="cuda"), x, gpu.bank,
                            gpu.resident_work(sp.resident, w))
                torch.cuda.synchronize()
                if it >= a.warmup:
                    times["gpu_resident"].append(time.perf_counter() - t0)
            missed = statistics.mean(missed_counts)
            model = predict(missed, ebytes, c["cpu_gbps"], pcie, c["dram_gbps"])
            ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
            rows.append({"tokens": tokens, "miss_rate": m, "missed_experts": missed, "model": model,
                         "cpu_share_run": f, "measured_ms": ms,
                         "samples_ms": {k: [1e3 * v for v in vs] for k, vs in times.items()},
                         "fastest": fastest(ms), "model_right": model_right(ms)})
            print(f"tokens {tokens} miss {m:.2f}: {ms}", file=sys.stderr)
    print(markdown_table(rows, measured=True))
    doc = {"geometry": geometry,
           "machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "moejit": moejit.info(),
                       "cpu_threads": ctx.num_threads, "isa": ctx.isa},
           "inputs": {"pcie_gbs": pcie, "cpu": cpu}, "rows": rows, "checks": checks}
    write_json(a.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
