#!/usr/bin/env python3
"""A hybrid GPU + CPU MoE layer: DeepSeek-V3 geometry, fp8_block experts.

A fraction of the experts is resident on the GPU, dequantized to bf16 once when it is
loaded (what an engine keeps ready to multiply); all of them sit in pinned host
memory, where moejit reads them in place. A batch is served three ways, and each is
timed per layer, from x on the GPU to y on the GPU, synchronized:

  (a) fetch: every missed expert's fp8 codes and scales are copied over PCIe (pinned
      host -> GPU, on a copy stream, chunk by chunk), dequantized on the GPU as each
      chunk arrives and computed there, while the GPU computes the resident ones;
  (b) cpu: moejit computes the missed experts on the CPU (x to the host,
      ``MoE.submit``) while the GPU computes the resident ones; then ``Task.wait``, y to
      the GPU and one add;
  (c) split: the way the model of ``moejit-bench --profile`` picks
      (tools/bench_model.h, docs/TOOLS.md): a fraction f of the missed experts on the
      CPU, the rest fetched, all at once;

and the GPU's resident compute alone, for miss rates 10, 25, 50, 75 % (the share of
the experts that are not resident; routing is uniform, so it is also the expected
share of a call's distinct experts that miss) and 1, 4, 16 tokens. The GPU computes a
call's routes as grouped matmuls (torch grouped_mm, or one torch.mm per expert: the
faster that works). Every timed call has a fresh routing and x, and moejit reads
other experts first (``--evict-experts``), so the call's experts come from DRAM.
It prints a markdown table (the model next to the measurements) and writes every
number as JSON to ``--out``.

The model's inputs, each measured alone before the cases (or given):
  - cpu_gbps per token count: moejit on cold experts (or --profile: a moejit-bench
    --profile file of this machine);
  - pcie_gbs: pinned host-to-GPU copies of 1 GiB;
  - dram_gbps: moejit and the copy engine reading host DRAM at once;
  - gpu_call_s and gpu_gbps per token count: the GPU computing, from the bf16 bank, a
    call's routes to one expert and a call's routes to all its experts (every expert
    resident): the line through the two, its fixed time and its GB/s of fp8 expert bytes;
  - gpu_fetch_gbps per token count: the same call's experts dequantized from fp8 staging,
    then computed (copies not timed), past gpu_call_s;
  - cpu_overhead_s per token count: a layer call whose CPU part has nothing to compute
    (x to the host, submit, wait, y to the GPU and the add);
  - fetch_chunk_bytes: --chunk experts, the copies the GPU waits for.

``--replay RUN.json`` recomputes the model from a run's inputs and prints it next to
that run's measurements (docs/PERFORMANCE.md); it needs neither torch nor a GPU.

Everything but the GPU part is importable and runs without torch: the routing
split, the CPU path and the model (tests/python/test_hybrid_example.py), and
``--plan-only`` prints the model's table from a profile without a GPU.

Host memory: the experts' bytes (256 x 44 MB = 11.3 GB at the real geometry)
plus small buffers; ``--experts`` uses fewer, ``--max-host-gb`` (default 60)
refuses more. GPU memory: the resident experts in bf16 (up to 22.5 GB) and staging
for max(tokens) x top_k fetched experts in fp8 and bf16 (17 GB at 16 tokens).
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
# The backend model of moejit-bench --profile (tools/bench_model.cpp, model_backends)
# ---------------------------------------------------------------------------------------------


# Defaults of moejit-bench's --gpu-gbs, --gpu-call-us, --gpu-fetch-gbs, --cpu-overhead-us and
# --fetch-chunk-experts (tools/bench_model.h: H200 + Xeon, hybrid_run2, 16 tokens).
DEFAULT_GPU_GBPS = 1550.0
DEFAULT_GPU_CALL_S = 8.1e-4
DEFAULT_GPU_FETCH_GBPS = 138.0
DEFAULT_CPU_OVERHEAD_S = 8.2e-4
DEFAULT_FETCH_CHUNK_EXPERTS = 8


def _seconds(nbytes: float, gbps: float) -> float:
    if nbytes <= 0:
        return 0.0
    return nbytes / (gbps * 1e9) if gbps > 0 else math.inf


def _gpu_side(m: dict, call: float, g: float, fetch: float, chunk_fetch: float) -> float:
    """G(g): the GPU side with a share g of the missing bytes fetched (tools/bench_model.h)."""
    if g <= 0:
        return m["gpu_resident_s"]
    a, b, b1 = m["gpu_resident_s"], m["gpu_fetched_s"], m["chunk_gpu_fetched_s"]
    return call + max(a + g * b, min(g * fetch, chunk_fetch) + g * b, g * fetch + min(g * b, b1))


def model_backends(missing_bytes: float, resident_bytes: float, cpu_gbps: float, pcie_gbs: float,
                   dram_gbps: float, gpu_gbps: float, gpu_fetch_gbps: float, cpu_overhead_s: float,
                   gpu_call_s: float, fetch_chunk_bytes: float, hybrid_margin: float = 0.10) -> dict:
    """Seconds per layer call on each way, as moejit-bench --profile computes them
    (tools/bench_model.h; docs/TOOLS.md). M = missing bytes, R = resident bytes; rates are
    GB/s of expert bytes; every way starts with x on the GPU and ends with y there:

      a = gpu_resident = gpu_call + R / gpu_gbps (0 without R): the GPU computes the experts
          it holds in every way
      c = M / cpu_gbps, P = M / pcie_gbs, B = M / gpu_fetch_gbps; p1, b1: the same for one
          chunk of fetch_chunk_bytes (infinite when it is 0: one copy of everything)
      G(g) = gpu_call + max(a + g B, min(g P, p1) + g B, g P + min(g B, b1)): the GPU side with
          a share g of M fetched, the copies pipelined with the compute by chunks; G(0) = a
      (b) cpu    = cpu_overhead + max(a, c): the x and y copies, submit and wait are in line
      (a) pcie   = G(1)
      (c) hybrid = cpu_overhead + max(f c / s, G(1 - f) with P and p1 / s) at the f that balances
          the two sides; s = shared_rate = min(1, capacity / (cpu_gbps + pcie_gbs)), capacity =
          max(dram_gbps, cpu_gbps, pcie_gbs): the CPU and the copy engine share host DRAM.

    hybrid is picked only when it beats the better single way by more than
    `hybrid_margin`. A rate of math.inf makes its term 0; cpu_gbps 0 makes the CPU
    ways infinite."""
    m = {"missing_bytes": max(0.0, missing_bytes), "resident_bytes": max(0.0, resident_bytes),
         "gpu_resident_s": 0.0, "cpu_compute_s": 0.0, "fetch_s": 0.0, "gpu_fetched_s": 0.0, "chunk_fetch_s": 0.0,
         "chunk_gpu_fetched_s": 0.0, "cpu_s": 0.0, "pcie_s": 0.0, "shared_rate": 1.0, "cpu_fraction": 0.0,
         "hybrid_ideal_s": 0.0, "dram_capacity_gbps": 0.0, "dram_floor_s": 0.0, "hybrid_s": 0.0, "best": "none",
         "best_s": 0.0}
    call, o = max(0.0, gpu_call_s), cpu_overhead_s
    a = m["gpu_resident_s"] = call + _seconds(m["resident_bytes"], gpu_gbps) if m["resident_bytes"] > 0 else 0.0
    if m["missing_bytes"] <= 0:  # the layer is the GPU's resident compute
        for k in ("cpu_s", "pcie_s", "hybrid_ideal_s", "hybrid_s", "best_s"):
            m[k] = a
        return m
    big_m = m["missing_bytes"]
    c = m["cpu_compute_s"] = _seconds(big_m, cpu_gbps)
    p = m["fetch_s"] = _seconds(big_m, pcie_gbs)
    b = m["gpu_fetched_s"] = _seconds(big_m, gpu_fetch_gbps)
    chunked = fetch_chunk_bytes > 0
    p1 = m["chunk_fetch_s"] = _seconds(fetch_chunk_bytes, pcie_gbs) if chunked else math.inf
    b1 = m["chunk_gpu_fetched_s"] = _seconds(fetch_chunk_bytes, gpu_fetch_gbps) if chunked else math.inf
    m["cpu_s"] = o + max(a, c)
    m["pcie_s"] = _gpu_side(m, call, 1.0, p, p1)
    # CPU and DMA read the same DRAM: at least what each pulled alone; each gets its share of it.
    cap = m["dram_capacity_gbps"] = max(dram_gbps, cpu_gbps, pcie_gbs)
    total = cpu_gbps + pcie_gbs
    k = m["shared_rate"] = cap / total if total > cap else 1.0
    if math.isfinite(c) and math.isfinite(p + b):
        # The CPU side f c' rises with f; the GPU side G(1-f) is the largest of three terms, each the
        # smaller of two lines that fall with f. The balance: the largest of the terms' meeting points.
        cs, ps, p1s = c / k, p / k, p1 / k

        def meet(at0, slope):  # f cs = at0 - f slope
            den = cs + slope
            return at0 / den if den > 0 else 1.0

        resident = meet(call + a + b, b)
        first = min(meet(call + ps + b, ps + b), meet(call + p1s + b, b))
        last = min(meet(call + ps + b, ps + b), meet(call + ps + b1, ps))
        f = min(1.0, max(0.0, max(resident, first, last)))
        m["cpu_fraction"] = f
        if f >= 1:
            m["hybrid_ideal_s"] = m["cpu_s"]
        elif f <= 0:
            m["hybrid_ideal_s"] = m["pcie_s"]
        else:
            m["hybrid_ideal_s"] = o + max(f * cs, _gpu_side(m, call, 1 - f, ps, p1s))
    elif math.isfinite(c):  # nothing can be fetched
        m["cpu_fraction"], m["hybrid_ideal_s"] = 1.0, m["cpu_s"]
    else:
        m["cpu_fraction"], m["hybrid_ideal_s"] = 0.0, m["pcie_s"]
    # The shares keep the two sides' bytes within the capacity: the floor holds by construction (a guard).
    m["dram_floor_s"] = _seconds(big_m, cap)
    m["hybrid_s"] = max(m["hybrid_ideal_s"], m["dram_floor_s"])
    single = min(m["cpu_s"], m["pcie_s"])
    m["best"] = "cpu" if m["cpu_s"] <= m["pcie_s"] else "pcie"
    m["best_s"] = single
    if m["hybrid_s"] < single * (1.0 - hybrid_margin):
        m["best"], m["best_s"] = "hybrid", m["hybrid_s"]
    return m


def split_time(m: dict, cpu_overhead_s: float, gpu_call_s: float, f: float) -> float:
    """t(f) of the split with both sides at work (0 < f < 1), as tools/bench_model.h defines it,
    from a model's terms."""
    k = m["shared_rate"]
    return cpu_overhead_s + max(f * m["cpu_compute_s"] / k,
                                _gpu_side(m, gpu_call_s, 1 - f, m["fetch_s"] / k, m["chunk_fetch_s"] / k))


def cpu_share(model: dict) -> float:
    """The share of the missed experts the recommendation puts on the CPU."""
    return {"cpu": 1.0, "pcie": 0.0, "none": 0.0}.get(model["best"], model["cpu_fraction"])


# The ways the example times, and the one that serves each recommendation.
WAYS = ("fetch", "cpu", "hybrid")  # (a), (b), and the split at the model's balanced f
PICK_WAY = {"pcie": "fetch", "cpu": "cpu", "hybrid": "hybrid", "none": "cpu"}


PROFILE_SCHEMAS = (1, 2)  # the entries' cpu_gbps and dram_gbps, all this example reads, are the same in both


def load_profile(path: str, fmt: str = "fp8_block") -> dict[int, dict]:
    """The fastest entry per token count of a moejit-bench --profile file (schema 1 or 2):
    {tokens: {"cpu_gbps", "dram_gbps", "threads", "isa", "expert_bytes", ...}}."""
    with open(path) as f:
        doc = json.load(f)
    if doc.get("schema_version") not in PROFILE_SCHEMAS:
        raise ValueError(f"{path}: schema_version {doc.get('schema_version')!r}, this example reads 1 and 2")
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


MODEL_INPUTS = ("cpu_gbps", "dram_gbps", "gpu_gbps", "gpu_call_s", "gpu_fetch_gbps", "cpu_overhead_s",
                "fetch_chunk_bytes")  # per token count; and pcie_gbs


def predict(missed_experts: float, resident_experts: float, ebytes: int, inputs: dict, pcie_gbs: float) -> dict:
    """The model of one case from the inputs of its token count (MODEL_INPUTS) and the PCIe GB/s."""
    return model_backends(missed_experts * ebytes, resident_experts * ebytes, inputs["cpu_gbps"], pcie_gbs,
                          inputs["dram_gbps"], inputs["gpu_gbps"], inputs["gpu_fetch_gbps"],
                          inputs["cpu_overhead_s"], inputs["gpu_call_s"], inputs["fetch_chunk_bytes"])


def expected_distinct(tokens: int, experts: int, top_k: int) -> float:
    """Expected distinct experts of a uniform call (the profile's distinct_experts_per_call)."""
    p_unused = 1.0
    for i in range(top_k):  # one token picks top_k distinct: P(expert not picked) = (E - k) / E
        p_unused *= (experts - 1 - i) / (experts - i)
    return experts * (1.0 - p_unused ** tokens)


def expected_missed(tokens: int, experts: int, top_k: int, miss_rate: float) -> float:
    """Expected distinct experts of a uniform call times the miss rate (the profile's
    missing_experts_per_call)."""
    return miss_rate * expected_distinct(tokens, experts, top_k)


def model_ms(model: dict) -> dict:
    """The model's layer time for each way, ms (split: the way it picks, (c))."""
    return {"gpu_resident": 1e3 * model["gpu_resident_s"], "fetch": 1e3 * model["pcie_s"],
            "cpu": 1e3 * model["cpu_s"], "hybrid": 1e3 * model["hybrid_s"], "split": 1e3 * model["best_s"]}


def markdown_table(rows: list[dict], measured: bool) -> str:
    head = ["tokens", "miss %", "missed experts", "model GPU resident ms", "model pcie ms", "model cpu ms",
            "model hybrid ms (f)", "model picks"]
    if measured:
        head += ["GPU resident ms", "(a) fetch ms", "(b) cpu ms", "hybrid ms (f)", "(c) picked ms",
                 "model error % (res/a/b/hyb)", "fastest", "model right"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        m = r["model"]
        cells = [str(r["tokens"]), f"{100 * r['miss_rate']:.0f}", f"{r['missed_experts']:.1f}",
                 f"{1e3 * m['gpu_resident_s']:.2f}", f"{1e3 * m['pcie_s']:.2f}", f"{1e3 * m['cpu_s']:.2f}",
                 f"{1e3 * m['hybrid_s']:.2f} ({m['cpu_fraction']:.2f})", m["best"]]
        if measured:
            ms, err = r["measured_ms"], r["model_error"]
            cells += [f"{ms['gpu_resident']:.2f}", f"{ms['fetch']:.2f}", f"{ms['cpu']:.2f}",
                      f"{ms['hybrid']:.2f} ({r['cpu_fraction_run']:.2f})", f"{ms['split']:.2f} ({r['pick_run']})",
                      " / ".join(f"{100 * err[k]:+.0f}" for k in ("gpu_resident",) + WAYS),
                      r["fastest"], "yes" if r["model_right"] else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def model_error(model: dict, measured_ms: dict) -> dict:
    """(model - measured) / measured per way (and for the GPU's resident compute)."""
    pred = model_ms(model)
    return {k: (pred[k] - measured_ms[k]) / measured_ms[k] if measured_ms[k] > 0 else 0.0
            for k in ("gpu_resident",) + WAYS + ("split",)}


def fastest(measured_ms: dict) -> str:
    """The fastest way measured, as the model names it (fetch = pcie)."""
    names = {"fetch": "pcie", "cpu": "cpu", "hybrid": "hybrid"}
    return names[min(WAYS, key=lambda k: measured_ms[k])]


def model_right(measured_ms: dict, pick: str, tolerance: float = 0.10) -> bool:
    """Whether (c), the way the model picked, is within `tolerance` of the fastest
    way measured."""
    best = min(measured_ms[k] for k in WAYS)
    return measured_ms[PICK_WAY[pick]] <= best * (1 + tolerance)


# ---------------------------------------------------------------------------------------------
# --replay: the model recomputed from a run's inputs, beside its measurements
# ---------------------------------------------------------------------------------------------


def replay_inputs(run: dict) -> dict[int, dict]:
    """The model's inputs per token count from a run's JSON, as the run measured them. A run
    from before gpu_call_s (hybrid_run2) timed no call with one resident expert: its line goes
    through the case with the fewest resident experts (its highest miss rate) instead, and the
    every-expert-resident time; source says which."""
    geo = run["geometry"]
    eb = geo["expert_bytes"]
    out = {}
    for key, pt in run["inputs"]["per_tokens"].items():
        t = int(key)
        i = {k: pt[k] for k in ("cpu_gbps", "dram_gbps", "cpu_overhead_s")}
        i["fetch_chunk_bytes"] = pt.get("fetch_chunk_bytes", run["settings"]["chunk"] * eb)
        if "gpu_call_s" in pt:
            i.update({k: pt[k] for k in ("gpu_gbps", "gpu_call_s", "gpu_fetch_gbps")})
            i["source"] = "the run's inputs"
        else:
            few = min((r for r in run["rows"] if r["tokens"] == t), key=lambda r: r["resident_experts"])
            n_all = pt.get("distinct_experts") or expected_distinct(t, geo["experts"], geo["top_k"])
            i.update(gpu_line(eb, few["resident_experts"], few["measured_ms"]["gpu_resident"] / 1e3, n_all,
                              pt["gpu_resident_call_s"], pt["gpu_fetched_call_s"]))
            i["source"] = (f"gpu_call_s, gpu_gbps: the line through the run's GPU resident time at miss "
                           f"{few['miss_rate']:g} and with every expert resident; gpu_fetch_gbps past gpu_call_s")
        out[t] = i
    return out


def replay(run: dict) -> list[dict]:
    """Per case of a run: its measurements, its own model (as it ran) and the model recomputed
    from its inputs (replay_inputs): the times at the case's measured expert counts, the
    hybrid way at the share f the run measured it at, and the pick at the expected counts (what
    the run would have served as (c))."""
    geo = run["geometry"]
    eb = geo["expert_bytes"]
    pcie = run["inputs"]["pcie_gbs"]
    inputs = replay_inputs(run)
    rows = []
    for r in run["rows"]:
        t, mr, ms = r["tokens"], r["miss_rate"], r["measured_ms"]
        c = inputs[t]
        distinct = expected_distinct(t, geo["experts"], geo["top_k"])
        plan = predict(mr * distinct, (1 - mr) * distinct, eb, c, pcie)
        model = predict(r["missed_experts"], r["resident_experts"], eb, c, pcie)
        f_run = r["cpu_fraction_run"]
        pred = model_ms(model)
        if 0 < f_run < 1:
            pred["hybrid"] = 1e3 * split_time(model, c["cpu_overhead_s"], c["gpu_call_s"], f_run)
        else:
            pred["hybrid"] = pred["cpu"] if f_run >= 1 else pred["fetch"]
        keys = ("gpu_resident",) + WAYS
        rows.append({
            "tokens": t, "miss_rate": mr, "missed_experts": r["missed_experts"],
            "resident_experts": r["resident_experts"], "measured_ms": {k: ms[k] for k in keys},
            "cpu_fraction_run": f_run, "fastest": r["fastest"],
            "old": {"ms": {k: r["model_ms"][k] for k in keys}, "error": {k: r["model_error"][k] for k in keys},
                    "cpu_fraction": r["model"]["cpu_fraction"], "pick": r["pick_run"], "right": r["model_right"]},
            "new": {"ms": pred, "error": {k: pred[k] / ms[k] - 1 for k in keys}, "pick": plan["best"],
                    "cpu_fraction": plan["cpu_fraction"], "pick_ms": 1e3 * plan["best_s"],
                    "right": model_right(ms, plan["best"]),
                    # the pick is a hybrid split other than the one the run measured
                    "unmeasured_split": plan["best"] == "hybrid" and abs(plan["cpu_fraction"] - f_run) > 0.05},
            "inputs": c})
    return rows


def _errs(e: dict) -> str:
    return " / ".join(f"{100 * e[k]:+.0f}" for k in ("gpu_resident",) + WAYS)


def replay_tables(rows: list[dict]) -> str:
    """Markdown: the measurements, the run's model, the recomputed model, and a summary."""
    def table(head, cells):
        return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                         + ["| " + " | ".join(c) + " |" for c in cells])

    case = lambda r: [str(r["tokens"]), f"{100 * r['miss_rate']:.0f}"]  # noqa: E731
    out = ["Measured (medians):", "", table(
        ["tokens", "miss %", "missed experts", "resident experts", "GPU resident ms", "(a) fetch ms", "(b) cpu ms",
         "hybrid ms (f)", "fastest"],
        [case(r) + [f"{r['missed_experts']:.1f}", f"{r['resident_experts']:.1f}"]
         + [f"{r['measured_ms'][k]:.2f}" for k in ("gpu_resident", "fetch", "cpu")]
         + [f"{r['measured_ms']['hybrid']:.2f} ({r['cpu_fraction_run']:.2f})", r["fastest"]] for r in rows])]
    out += ["", "The run's model (at the measured expert counts; hybrid at its own f):", "", table(
        ["tokens", "miss %", "GPU resident ms", "fetch ms", "cpu ms", "hybrid ms (f)", "error % (res/a/b/hyb)",
         "picks", "right"],
        [case(r) + [f"{r['old']['ms'][k]:.2f}" for k in ("gpu_resident", "fetch", "cpu")]
         + [f"{r['old']['ms']['hybrid']:.2f} ({r['old']['cpu_fraction']:.2f})", _errs(r["old"]["error"]),
            r["old"]["pick"], "yes" if r["old"]["right"] else "no"] for r in rows])]
    out += ["", "The model recomputed from the run's inputs (at the measured expert counts; hybrid at the run's "
                "f; the pick at the expected counts, as the run would serve it):", "", table(
        ["tokens", "miss %", "GPU resident ms", "fetch ms", "cpu ms", "hybrid ms at the run's f",
         "error % (res/a/b/hyb)", "picks (f) ms", "right"],
        [case(r) + [f"{r['new']['ms'][k]:.2f}" for k in ("gpu_resident", "fetch", "cpu", "hybrid")]
         + [_errs(r["new"]["error"]),
            f"{r['new']['pick']}" + (f" ({r['new']['cpu_fraction']:.2f})" if r["new"]["pick"] == "hybrid" else "")
            + f" {r['new']['pick_ms']:.2f}",
            ("yes" if r["new"]["right"] else "no") + ("*" if r["new"]["unmeasured_split"] else "")] for r in rows])]
    lines = []
    for name in ("old", "new"):
        e = {k: [abs(r[name]["error"][k]) for r in rows] for k in ("gpu_resident",) + WAYS}
        lines.append(f"- {name}: mean |error| " + ", ".join(
            f"{k} {100 * sum(v) / len(v):.0f}% (max {100 * max(v):.0f}%)" for k, v in e.items())
            + f"; picks right {sum(r[name]['right'] for r in rows)} of {len(rows)}")
    if any(r["new"]["unmeasured_split"] for r in rows):
        lines.append("- *: the pick is a hybrid split more than 0.05 from the one the run measured; judged "
                     "by the run's hybrid time")
    return "\n".join(out + [""] + lines)


# ---------------------------------------------------------------------------------------------
# The GPU side (torch)
# ---------------------------------------------------------------------------------------------


@dataclass
class Routes:
    """One part of a call's routes, sorted by the slot of their expert: the matmuls'
    groups. counts[s] routes of slot s; tokens and router weights per route."""

    counts: np.ndarray  # [slots] int64
    tokens: np.ndarray  # [R] int64
    weights: np.ndarray  # [R] float32

    @property
    def routes(self) -> int:
        return len(self.tokens)


def sort_routes(ids: np.ndarray, weights: np.ndarray, slot_of: np.ndarray, slots: int) -> Routes:
    """The routes of `ids` (>= 0) by slot; slot_of maps an expert id to its slot."""
    t_idx, j_idx = np.nonzero(ids >= 0)
    s = slot_of[ids[t_idx, j_idx]]
    if (s < 0).any():
        raise ValueError("a route's expert has no slot")
    order = np.argsort(s, kind="stable")
    return Routes(np.bincount(s, minlength=slots).astype(np.int64), t_idx[order].astype(np.int64),
                  weights[t_idx, j_idx][order].astype(np.float32))


class Gpu:
    """The GPU side of the layer, as an engine holds it:

    - the resident experts, dequantized to bf16 once when they are loaded
      (``load_resident``), ready to multiply;
    - staging for fetched experts: their fp8 codes and bf16 scales cross PCIe (what an
      engine transfers) on a copy stream, chunk by chunk, and are dequantized to bf16 on
      the GPU as each chunk arrives, then computed;
    - the routes of a call computed as grouped matmuls: ``torch._grouped_mm`` (one kernel
      per projection for all experts) when it works on this GPU, else one ``torch.mm``
      per expert and projection into shared buffers; the gather, activation and
      weighted scatter are one batched op each."""

    def __init__(self, torch, layer: HostLayer, host_t: dict, max_fetch: int, chunk: int, matmul: str = "auto",
                 device: str = "cuda"):
        self.torch = torch
        self.dev = torch.device(device)
        self.cuda = self.dev.type == "cuda"  # "cpu": the same code without streams (a functional check)
        self.layer = layer
        self.host = host_t  # pinned torch views of the host banks: w13, s13, w2, s2
        self.chunk = max(1, chunk)
        self.copy_stream = torch.cuda.Stream() if self.cuda else None
        h, i = layer.hidden, layer.intermediate
        n = self.stage_slots = max(1, max_fetch)
        # e4m3 codes are kept as uint8 (copies are not implemented for float8 dtypes in every
        # torch) and viewed as float8_e4m3fn only to convert.
        self.stage8 = {
            "w13": torch.empty((n, 2 * i, h), dtype=torch.uint8, device=self.dev),
            "w2": torch.empty((n, h, i), dtype=torch.uint8, device=self.dev),
            "s13": torch.empty((n,) + tuple(layer.s13.shape[1:]), dtype=torch.bfloat16, device=self.dev),
            "s2": torch.empty((n,) + tuple(layer.s2.shape[1:]), dtype=torch.bfloat16, device=self.dev),
        }
        self.stage = {"w13": torch.empty((n, 2 * i, h), dtype=torch.bfloat16, device=self.dev),
                      "w2": torch.empty((n, h, i), dtype=torch.bfloat16, device=self.dev)}
        self.bank = None
        self.slot_of = np.full(layer.experts, -1, np.int64)
        self.grouped_failure = None  # why grouped_mm was given up mid-run, if it was
        self._grouped_mm = getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
        self.matmul = "grouped" if matmul == "auto" and self._grouped_mm is not None else matmul
        if self.matmul == "auto":
            self.matmul = "loop"
        if self.matmul == "grouped" and self._grouped_mm is None:
            raise SystemExit("--gpu-matmul grouped: this torch has no grouped_mm")

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def randn_x(self, tokens: int):
        return self.torch.randn((tokens, self.layer.hidden), device=self.dev).to(self.torch.bfloat16)

    def zeros_y(self, tokens: int):
        return self.torch.zeros((tokens, self.layer.hidden), dtype=self.torch.float32, device=self.dev)

    # -- weights ------------------------------------------------------------------------------

    def _dequant_into(self, dst, w8, s) -> None:
        """dst[n, R, K] bf16 = e4m3 codes w8[n, R, K] x their 128 x 128 block scales s."""
        t = self.torch
        n, rows, k = w8.shape
        b = BLOCK
        d5 = dst.view(n, rows // b, b, k // b, b)
        d5.copy_(w8.view(t.float8_e4m3fn).view(n, rows // b, b, k // b, b))
        d5.mul_(s.view(n, rows // b, 1, k // b, 1))

    def _copy_in(self, experts: np.ndarray, at: int = 0) -> None:
        """The experts' fp8 codes and scales into staging slots at.. (on the current stream)."""
        for j, e in enumerate(experts):
            for k in ("w13", "s13", "w2", "s2"):
                self.stage8[k][at + j].copy_(self.host[k][int(e)], non_blocking=True)

    def _dequant_stage(self, c0: int, c1: int) -> None:
        self._dequant_into(self.stage["w13"][c0:c1], self.stage8["w13"][c0:c1], self.stage8["s13"][c0:c1])
        self._dequant_into(self.stage["w2"][c0:c1], self.stage8["w2"][c0:c1], self.stage8["s2"][c0:c1])

    def load_resident(self, mask: np.ndarray) -> float:
        """Holds the experts of `mask`, dequantized to bf16 (the engine's load time, not a
        call's); returns its seconds."""
        t = self.torch
        experts = np.flatnonzero(mask)
        self.bank = None
        if self.cuda:
            t.cuda.empty_cache()
        self.sync()
        t0 = time.perf_counter()
        h, i = self.layer.hidden, self.layer.intermediate
        n = max(1, len(experts))
        self.bank = {"w13": t.empty((n, 2 * i, h), dtype=t.bfloat16, device=self.dev),
                     "w2": t.empty((n, h, i), dtype=t.bfloat16, device=self.dev)}
        for c0 in range(0, len(experts), self.stage_slots):  # through the fp8 staging, a slot per expert
            part = experts[c0:c0 + self.stage_slots]
            self._copy_in(part)
            m = len(part)
            self._dequant_into(self.bank["w13"][c0:c0 + m], self.stage8["w13"][:m], self.stage8["s13"][:m])
            self._dequant_into(self.bank["w2"][c0:c0 + m], self.stage8["w2"][:m], self.stage8["s2"][:m])
        self.sync()
        self.slot_of = np.full(self.layer.experts, -1, np.int64)
        self.slot_of[experts] = np.arange(len(experts))
        return time.perf_counter() - t0

    # -- compute ------------------------------------------------------------------------------

    def _to_dev(self, a: np.ndarray):
        """A small host array to the device, asynchronously: through pinned memory (a copy from
        pageable memory would wait for the stream's earlier work)."""
        h = self.torch.from_numpy(np.ascontiguousarray(a))
        return (h.pin_memory() if self.cuda else h).to(self.dev, non_blocking=True)

    def _matmul(self, a, w, counts: np.ndarray, offs, out_cols: int):
        """a[R, K] (rows grouped by slot, counts[s] of slot s) times w[s]^T ([slots, N, K]) -> [R, N]."""
        t = self.torch
        if self.matmul == "grouped":
            try:
                return self._grouped_mm(a, w.transpose(1, 2), offs=offs)
            except (RuntimeError, TypeError, ValueError) as e:  # no kernel for this shape: the loop from now on
                self.grouped_failure = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
                self.matmul = "loop"
        out = t.empty((a.shape[0], out_cols), dtype=t.bfloat16, device=self.dev)
        r0 = 0
        for s in np.flatnonzero(counts):
            r1 = r0 + int(counts[s])
            t.mm(a[r0:r1], w[int(s)].t(), out=out[r0:r1])
            r0 = r1
        return out

    def compute(self, y, x, w13, w2, r: Routes) -> None:
        """y[T, H] fp32 += the routes r over the slots of w13 [S, 2I, H] and w2 [S, H, I] (bf16)."""
        if r.routes == 0:
            return
        t = self.torch
        inter = self.layer.intermediate
        tok = self._to_dev(r.tokens)
        wts = self._to_dev(r.weights)
        offs = self._to_dev(np.cumsum(r.counts).astype(np.int32)) if self.matmul == "grouped" else None
        xs = x.index_select(0, tok)  # [R, H] bf16, grouped by slot
        h = self._matmul(xs, w13, r.counts, offs, 2 * inter)
        g = (t.nn.functional.silu(h[:, :inter].float()) * h[:, inter:].float()).to(t.bfloat16)
        o = self._matmul(g, w2, r.counts, offs, x.shape[1])
        y.index_add_(0, tok, o.float() * wts[:, None])

    def compute_resident(self, y, x, ids: np.ndarray, w: np.ndarray) -> None:
        """The routes of `ids` (all resident) from the bf16 bank."""
        r = sort_routes(ids, w, self.slot_of, len(self.bank["w13"]))
        self.compute(y, x, self.bank["w13"], self.bank["w2"], r)

    def fetch(self, experts: np.ndarray) -> list:
        """Copies the experts' fp8 codes and scales into staging slots 0.. on the copy stream;
        one event per chunk of `chunk` experts."""
        t = self.torch
        if len(experts) > self.stage_slots:
            raise ValueError(f"{len(experts)} experts to fetch, {self.stage_slots} staging slots")
        if not self.cuda:
            self._copy_in(experts)
            return [None] * -(-len(experts) // self.chunk)
        events = []
        self.copy_stream.wait_stream(t.cuda.current_stream())  # the slots' previous readers are done
        with t.cuda.stream(self.copy_stream):
            for c0 in range(0, len(experts), self.chunk):
                self._copy_in(experts[c0:c0 + self.chunk], at=c0)
                ev = t.cuda.Event()
                ev.record(self.copy_stream)
                events.append(ev)
        return events

    def compute_fetched(self, y, x, ids: np.ndarray, w: np.ndarray, experts: np.ndarray, events=None) -> None:
        """The routes of `ids` over the fetched experts (staging slot j holds experts[j]):
        chunk c is dequantized and computed once event c (its copies) has fired; without
        events the staging is taken as filled."""
        t = self.torch
        slot_of = np.full(self.layer.experts, -1, np.int64)
        slot_of[experts] = np.arange(len(experts))
        r = sort_routes(ids, w, slot_of, len(experts))
        ends = np.cumsum(r.counts)
        for c, c0 in enumerate(range(0, len(experts), self.chunk)):
            c1 = min(c0 + self.chunk, len(experts))
            if events is not None and events[c] is not None:
                t.cuda.current_stream().wait_event(events[c])
            self._dequant_stage(c0, c1)
            r0, r1 = (int(ends[c0 - 1]) if c0 else 0), int(ends[c1 - 1])
            part = Routes(r.counts[c0:c1], r.tokens[r0:r1], r.weights[r0:r1])
            self.compute(y, x, self.stage["w13"][c0:c1], self.stage["w2"][c0:c1], part)


def measure_pcie_gbs(torch, nbytes: int = 1 << 30, reps: int = 5, device: str = "cuda") -> float:
    cuda = device == "cuda"
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dst.copy_(src, non_blocking=True)
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


class Evictor:
    """Reads `experts` random experts' host bytes with moejit before a timed call, so that
    the call finds its experts in DRAM, not in the L3 (as after an engine's other layers)."""

    def __init__(self, moe: moejit.MoE, layer: HostLayer, top_k: int, experts: int, seed: int):
        self.moe, self.rng = moe, np.random.default_rng(seed)
        self.n = min(experts, layer.experts)
        self.tokens = -(-self.n // top_k) if self.n else 0
        self.x = np.full((max(1, self.tokens), layer.hidden), 0x3F80, np.uint16)
        self.top_k, self.experts = top_k, layer.experts

    def __call__(self, avoid: np.ndarray | None = None) -> None:
        """Reads experts other than `avoid` (the next call's)."""
        pool = np.arange(self.experts) if avoid is None else np.setdiff1d(np.arange(self.experts), avoid)
        n = min(self.n, len(pool))
        if not n:
            return
        ids = np.full(self.tokens * self.top_k, -1, np.int32)
        ids[:n] = self.rng.choice(pool, size=n, replace=False)
        w = np.full((self.tokens, self.top_k), 1.0 / self.top_k, np.float32)
        self.moe.forward(self.x, ids.reshape(self.tokens, self.top_k), w)


def measure_cpu_gbps(moe: moejit.MoE, layer: HostLayer, tokens: int, top_k: int, rng, calls: int,
                     evict=None) -> dict:
    """moejit alone on cold experts (uniform routing): GB/s of the distinct experts' bytes."""
    ebytes = expert_bytes(layer.hidden, layer.intermediate)
    x = np.zeros((tokens, layer.hidden), np.uint16)
    x[:] = 0x3F80  # 1.0
    gbps, secs = [], []
    for c in range(calls + 2):
        ids, w = route(rng, tokens, layer.experts, top_k)
        if evict:
            evict(ids)
        t0 = time.perf_counter()
        moe.forward(x, ids, w)
        s = time.perf_counter() - t0
        if c >= 2:
            secs.append(s)
            gbps.append(len(np.unique(ids)) * ebytes / s / 1e9)
    return {"cpu_gbps": statistics.median(gbps), "median_call_s": statistics.median(secs)}


def gpu_line(ebytes: int, n_one: float, one_s: float, n_all: float, all_s: float, fetched_all_s: float) -> dict:
    """The model's GPU inputs from the resident compute of a call's routes to n_one of its
    experts (one_s; the example measures one expert) and to all n_all of them (all_s), and
    the fetched compute of all of them (fetched_all_s): the line through the two resident
    times gives the fixed time of a compute part (gpu_call_s) and the GB/s past it
    (gpu_gbps; math.inf when the time does not grow with the experts); the fetched compute
    pays the same fixed time, gpu_fetch_gbps is its rate past it. At n_all experts the
    model gives all_s and fetched_all_s back."""
    per = max(0.0, (all_s - one_s) / (n_all - n_one)) if n_all > n_one else all_s / max(n_all, 1.0)
    call = all_s - n_all * per
    if call < 0:  # a line below the origin: no fixed part
        call, per = 0.0, all_s / n_all
    fetched = fetched_all_s - call
    return {"gpu_call_s": call, "gpu_gbps": ebytes / per / 1e9 if per > 0 else math.inf,
            "gpu_fetch_gbps": n_all * ebytes / fetched / 1e9 if fetched > 0 else math.inf}


def measure_gpu_gbps(gpu: Gpu, tokens: int, top_k: int, rng, calls: int) -> dict:
    """The GPU's inputs with every expert resident (load_resident of all of them first), per
    call of uniform routing: the resident compute of its routes to one of its experts and
    of all of them (from the bf16 bank), and the fetched compute of the same (dequantized
    from fp8 staging, then computed; the copies are not timed); medians, and gpu_line's
    inputs from them."""
    layer = gpu.layer
    ebytes = expert_bytes(layer.hidden, layer.intermediate)
    times = {"gpu_resident_one_s": [], "gpu_resident_call_s": [], "gpu_fetched_one_s": [], "gpu_fetched_call_s": []}
    counts = []

    def timed(fn):
        gpu.sync()
        t0 = time.perf_counter()
        fn()
        gpu.sync()
        return time.perf_counter() - t0

    for c in range(calls + 2):
        ids, w = route(rng, tokens, layer.experts, top_k)
        x = gpu.randn_x(tokens)
        distinct = np.unique(ids)
        one = distinct[:1]
        ids_one = np.where(ids == one[0], ids, np.int32(-1))
        t = {"gpu_resident_one_s": timed(lambda: gpu.compute_resident(gpu.zeros_y(tokens), x, ids_one, w)),
             "gpu_resident_call_s": timed(lambda: gpu.compute_resident(gpu.zeros_y(tokens), x, ids, w))}
        gpu.fetch(one)
        gpu.sync()  # the copies are not timed
        t["gpu_fetched_one_s"] = timed(lambda: gpu.compute_fetched(gpu.zeros_y(tokens), x, ids_one, w, one))
        gpu.fetch(distinct)
        gpu.sync()
        t["gpu_fetched_call_s"] = timed(lambda: gpu.compute_fetched(gpu.zeros_y(tokens), x, ids, w, distinct))
        if c >= 2:
            counts.append(len(distinct))
            for k, v in t.items():
                times[k].append(v)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["distinct_experts"] = statistics.median(counts)  # the medians of a time linear in it agree
    out.update(gpu_line(ebytes, 1, out["gpu_resident_one_s"], out["distinct_experts"], out["gpu_resident_call_s"],
                        out["gpu_fetched_call_s"]))
    return out


def choose_matmul(gpu: Gpu, tokens: int, top_k: int, rng, calls: int = 5) -> dict:
    """With every expert resident: grouped_mm against the per-expert loop, checked against
    each other and timed; keeps the faster (the loop when grouped_mm fails)."""
    layer = gpu.layer
    out = {"grouped_available": gpu._grouped_mm is not None, "grouped_error": None, "median_ms": {}}
    if gpu._grouped_mm is None:
        gpu.matmul = "loop"
        out["used"] = "loop"
        return out
    ids, w = route(rng, tokens, layer.experts, top_k)
    x = gpu.randn_x(tokens)
    ys = {}
    for kind in ("loop", "grouped"):
        gpu.matmul = kind
        y = gpu.zeros_y(tokens)
        try:
            gpu.compute_resident(y, x, ids, w)
            gpu.sync()
        except (RuntimeError, TypeError, ValueError) as e:  # no kernel for this GPU, layout or torch
            out["grouped_error"] = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            break
        if gpu.matmul != kind:  # _matmul gave grouped_mm up
            out["grouped_error"] = gpu.grouped_failure
            gpu.grouped_failure = None
            break
        ys[kind] = y
    if "grouped" in ys:
        scale = ys["loop"].abs().max().item() or 1.0
        err = (ys["grouped"] - ys["loop"]).abs().max().item() / scale
        out["grouped_vs_loop_max_rel_err"] = err
        if err > 1e-2:
            out["grouped_error"] = f"grouped_mm differs from the loop by {err:.3g} of max |y|"
            del ys["grouped"]
    for kind in ys:
        gpu.matmul = kind
        times = []
        for _ in range(calls + 1):
            ids, w = route(rng, tokens, layer.experts, top_k)
            gpu.sync()
            t0 = time.perf_counter()
            gpu.compute_resident(gpu.zeros_y(tokens), x, ids, w)
            gpu.sync()
            times.append(time.perf_counter() - t0)
        out["median_ms"][kind] = 1e3 * statistics.median(times[1:])
    gpu.matmul = out["used"] = min(out["median_ms"], key=out["median_ms"].get)
    return out


def measure_cpu_overhead(gpu: Gpu, moe: moejit.MoE, x_host, y_host, tokens: int, top_k: int, calls: int) -> float:
    """The fixed cost of involving the CPU in a layer call, nothing to compute: x to the
    host, submit (every route -1), wait, y back to the GPU and the add; median seconds."""
    ids = np.full((tokens, top_k), -1, np.int32)
    w = np.full((tokens, top_k), 1.0 / top_k, np.float32)
    xh, yh = x_host[:tokens], y_host[:tokens]
    times = []
    for c in range(calls + 2):
        x = gpu.randn_x(tokens)
        gpu.sync()
        t0 = time.perf_counter()
        y = gpu.zeros_y(tokens)
        xh.copy_(x)
        moe.submit(xh, ids, w, out=yh).wait()
        y += yh.to(gpu.dev, non_blocking=True).float()
        gpu.sync()
        if c >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_host_read_gbps(gpu: Gpu, moe: moejit.MoE, tokens: int, top_k: int, rng, calls: int,
                           evict=None) -> dict:
    """What host DRAM gives moejit and the GPU's copy engine reading at once (the model's
    DRAM capacity, dram_gbps): moejit computes a call of `tokens` tokens on cold experts
    while about half as many other experts are copied to the GPU's staging. Returns the
    median GB/s of each side and of both, (CPU + DMA bytes) / the longer of the two."""
    t = gpu.torch
    layer = gpu.layer
    ebytes = expert_bytes(layer.hidden, layer.intermediate)
    x = np.full((tokens, layer.hidden), 0x3F80, np.uint16)
    cpu, dma, both = [], [], []
    for c in range(calls + 1):
        ids, w = route(rng, tokens, layer.experts, top_k)
        on_cpu = np.unique(ids)
        pool = np.setdiff1d(np.arange(layer.experts), on_cpu)
        n = min(gpu.stage_slots, len(pool), max(1, len(on_cpu) // 2))
        fetched = rng.choice(pool, size=n, replace=False)
        if evict:
            evict(np.concatenate([on_cpu, fetched]))
        gpu.sync()
        if gpu.cuda:
            start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            start.record(gpu.copy_stream)
        t0 = time.perf_counter()
        task = moe.submit(x, ids, w)
        gpu.fetch(fetched)
        if gpu.cuda:
            end.record(gpu.copy_stream)
        task.wait()
        t_cpu = time.perf_counter() - t0
        gpu.sync()
        t_dma = start.elapsed_time(end) / 1e3 if gpu.cuda else time.perf_counter() - t0
        if c >= 1:
            cpu.append(len(on_cpu) * ebytes / t_cpu / 1e9)
            dma.append(n * ebytes / t_dma / 1e9)
            both.append((len(on_cpu) + n) * ebytes / max(t_cpu, t_dma) / 1e9)
    return {"cpu_gbps": statistics.median(cpu), "dma_gbps": statistics.median(dma),
            "dram_gbps": statistics.median(both)}


def serve(gpu: Gpu, moe: moejit.MoE, x_gpu, x_host, y_host, ids, w, split: Split, way: str) -> tuple[float, object]:
    """One layer call served `way` ("fetch", "cpu", "hybrid": split's parts); returns (seconds, y on
    the GPU, fp32).
    It starts with x on the GPU and ends, synchronized, with y there: the CPU part's copies
    of x and y are inside the time."""
    if way == "fetch":  # every missed expert over PCIe
        cpu_ids, fetch_ids = None, np.where(split.cpu >= 0, split.cpu, split.fetch)
    elif way == "cpu":  # every missed expert on the CPU
        cpu_ids, fetch_ids = np.where(split.fetch >= 0, split.fetch, split.cpu), None
    else:
        cpu_ids, fetch_ids = split.cpu, split.fetch
    fetched = np.unique(fetch_ids[fetch_ids >= 0]) if fetch_ids is not None else np.zeros(0, np.int32)
    gpu.sync()
    t0 = time.perf_counter()
    y = gpu.zeros_y(x_gpu.shape[0])
    task = None
    if cpu_ids is not None and (cpu_ids >= 0).any():
        x_host.copy_(x_gpu)  # the activations come from the GPU (synchronous, T x H bf16)
        task = moe.submit(x_host, cpu_ids, w, out=y_host)  # pinned torch tensors, read and written in place
    events = gpu.fetch(fetched) if len(fetched) else None
    gpu.compute_resident(y, x_gpu, split.resident, w)
    if events:
        gpu.compute_fetched(y, x_gpu, fetch_ids, w, fetched, events)
    if task is not None:
        task.wait()
        y += y_host.to(gpu.dev, non_blocking=True).float()
    gpu.sync()
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
    p.add_argument("--chunk", type=int, default=8, help="fetched experts per copy event (pipelined with compute)")
    p.add_argument("--gpu-matmul", choices=("auto", "grouped", "loop"), default="auto",
                   help="grouped: torch grouped_mm; loop: torch.mm per expert; auto: the faster that works")
    p.add_argument("--evict-experts", type=int, default=16,
                   help="experts moejit reads before each timed call to push the call's out of the L3 (0: off)")
    p.add_argument("--profile", help="moejit-bench --profile JSON of this machine (CPU and DRAM GB/s)")
    p.add_argument("--pcie-gbs", type=float, help="host-to-GPU GB/s (default: measured)")
    p.add_argument("--dram-gbs", type=float,
                   help="host DRAM GB/s with moejit and the copy engine reading at once (default: measured; "
                        "--plan-only: the profile's entry)")
    p.add_argument("--gpu-gbs", type=float,
                   help=f"GPU GB/s of expert bytes from resident experts, past the fixed time (default: measured; "
                        f"--plan-only {DEFAULT_GPU_GBPS:g})")
    p.add_argument("--gpu-call-us", type=float,
                   help=f"fixed time of a GPU compute part per layer call, us (default: measured; --plan-only "
                        f"{1e6 * DEFAULT_GPU_CALL_S:g})")
    p.add_argument("--gpu-fetch-gbs", type=float,
                   help=f"GPU GB/s of expert bytes dequantized and computed after a fetch, past the fixed time "
                        f"(default: measured; --plan-only {DEFAULT_GPU_FETCH_GBPS:g})")
    p.add_argument("--cpu-overhead-us", type=float,
                   help=f"fixed cost of a layer call with a CPU part, us (default: measured; --plan-only "
                        f"{1e6 * DEFAULT_CPU_OVERHEAD_S:g})")
    p.add_argument("--max-host-gb", type=float, default=60.0, help="refuse layers with more host bytes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plan-only", action="store_true",
                   help="no GPU: print the model's table from --profile and --pcie-gbs")
    p.add_argument("--replay", metavar="RUN_JSON",
                   help="no GPU: recompute the model from a run's --out JSON and print it beside the run's "
                        "measurements and the run's own model")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: run the GPU side with torch on the CPU (checks the code; its times mean nothing)")
    p.add_argument("--out", help="write every number as JSON here")
    a = p.parse_args(argv)
    if a.hidden % BLOCK or a.intermediate % BLOCK:
        p.error("--hidden and --intermediate must be multiples of 128 (the GPU dequantizes whole blocks)")
    if not 1 <= a.top_k <= a.experts:
        p.error("--top-k must be in [1, --experts]")
    if any(not 0 <= m <= 1 for m in a.miss_rates):
        p.error("--miss-rates must be in [0, 1]")
    if a.iters < 1 or a.warmup < 0 or a.chunk < 1 or a.evict_experts < 0 or min(a.tokens) < 1:
        p.error("--iters, --chunk and --tokens must be >= 1, --warmup and --evict-experts >= 0")
    for name in ("pcie_gbs", "dram_gbs", "gpu_gbs", "gpu_fetch_gbs"):  # the GPU rates may be inf (no term)
        v = getattr(a, name)
        if v is not None and not (v > 0 and (math.isfinite(v) or name.startswith("gpu"))):
            p.error(f"--{name.replace('_', '-')} must be > 0")
    for name in ("gpu_call_us", "cpu_overhead_us"):
        v = getattr(a, name)
        if v is not None and not (math.isfinite(v) and v >= 0):
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    host_gb = a.experts * expert_bytes(a.hidden, a.intermediate) / 1e9
    if host_gb > a.max_host_gb:
        p.error(f"{a.experts} experts need {host_gb:.1f} GB of host memory, over --max-host-gb {a.max_host_gb}: "
                "pass fewer --experts")
    if a.plan_only and not (a.profile and a.pcie_gbs):
        p.error("--plan-only needs --profile and --pcie-gbs")
    return a


def model_rows(a, ebytes: int, inputs: dict[int, dict], pcie_gbs: float) -> list[dict]:
    rows = []
    for tokens in a.tokens:
        distinct = expected_distinct(tokens, a.experts, a.top_k)
        for m in a.miss_rates:
            missed, resident = m * distinct, (1 - m) * distinct
            rows.append({"tokens": tokens, "miss_rate": m, "missed_experts": missed, "resident_experts": resident,
                         "model": predict(missed, resident, ebytes, inputs[tokens], pcie_gbs)})
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


def gpu_inputs_given(a) -> dict:
    """The GPU-side inputs given on the command line (None where not given)."""
    us = lambda v: None if v is None else 1e-6 * v  # noqa: E731
    return {"gpu_gbps": a.gpu_gbs, "gpu_call_s": us(a.gpu_call_us), "gpu_fetch_gbps": a.gpu_fetch_gbs,
            "cpu_overhead_s": us(a.cpu_overhead_us)}


GPU_DEFAULTS = {"gpu_gbps": DEFAULT_GPU_GBPS, "gpu_call_s": DEFAULT_GPU_CALL_S,
                "gpu_fetch_gbps": DEFAULT_GPU_FETCH_GBPS, "cpu_overhead_s": DEFAULT_CPU_OVERHEAD_S}


def bench_options(pcie_gbs: float, inputs: dict, chunk: int) -> str:
    """The moejit-bench --profile options that model a machine from one token count's inputs."""
    return (f"--pcie-gbs {pcie_gbs:.1f} --dram-gbs {inputs['dram_gbps']:.1f} --gpu-gbs {inputs['gpu_gbps']:.0f} "
            f"--gpu-call-us {1e6 * inputs['gpu_call_s']:.0f} --gpu-fetch-gbs {inputs['gpu_fetch_gbps']:.0f} "
            f"--cpu-overhead-us {1e6 * inputs['cpu_overhead_s']:.0f} --fetch-chunk-experts {chunk}")


def main(argv=None) -> int:
    a = parse_args(argv)
    ebytes = expert_bytes(a.hidden, a.intermediate)
    geometry = {"hidden": a.hidden, "intermediate": a.intermediate, "experts": a.experts, "top_k": a.top_k,
                "format": "fp8_block", "expert_bytes": ebytes}
    if a.replay:
        with open(a.replay) as f:
            run = json.load(f)
        rows = replay(run)
        print(replay_tables(rows))
        write_json(a.out, {"replay_of": a.replay, "rows": rows})
        return 0
    if a.plan_only:
        inputs = cpu_inputs_from_profile(a.profile, a.tokens)
        for k, v in gpu_inputs_given(a).items():
            for t in a.tokens:
                inputs[t][k] = GPU_DEFAULTS[k] if v is None else v
        for t in a.tokens:
            inputs[t]["fetch_chunk_bytes"] = a.chunk * ebytes
            if a.dram_gbs:
                inputs[t]["dram_gbps"] = a.dram_gbs
        rows = model_rows(a, ebytes, inputs, a.pcie_gbs)
        print(markdown_table(rows, measured=False))
        write_json(a.out, {"geometry": geometry, "inputs": {"pcie_gbs": a.pcie_gbs, "per_tokens": inputs},
                           "rows": rows})
        return 0
    return run_gpu(a, ebytes, geometry)


def run_gpu(a, ebytes: int, geometry: dict) -> int:
    try:
        import torch
    except ImportError:
        raise SystemExit("the GPU run needs torch; --plan-only prints the model's table without it") from None

    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: use --plan-only for the model's table")
    if not cuda:
        torch.set_num_threads(1)  # beside moejit's workers, on the one CPU left to this thread
    t_start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:6.1f} s] {msg}", file=sys.stderr, flush=True)

    affinity = sorted(os.sched_getaffinity(0))
    threads = a.threads or max(1, len(affinity) - 1)
    ctx = moejit.Context(cpu_ids=affinity[-threads:]) if threads < len(affinity) else moejit.Context()
    if threads < len(affinity):
        os.sched_setaffinity(0, {affinity[0]})  # this (GPU driving) thread off the moejit workers' CPUs

    def pinned(shape, dtype):  # uint16 (bf16 bits) as int16: torch's uint16 has no .numpy() everywhere
        t = torch.empty(shape, dtype=torch.uint8 if dtype == np.uint8 else torch.int16, pin_memory=cuda)
        return t.numpy().view(dtype), t

    layer = make_host_layer(a.experts, a.hidden, a.intermediate, a.seed, empty=pinned)
    log(f"host layer: {a.experts} experts x {ebytes / 1e6:.1f} MB in pinned memory")
    host_t = {"w13": layer.keep[0], "w2": layer.keep[1],  # uint8 e4m3 codes, int16 bf16 bits: pinned
              "s13": layer.keep[2].view(torch.bfloat16), "s2": layer.keep[3].view(torch.bfloat16)}
    max_tokens = max(a.tokens)
    evict_tokens = -(-min(a.evict_experts, a.experts) // a.top_k)
    moe = cpu_layer(ctx, layer, a.top_k, max(max_tokens, evict_tokens, 1))
    evict = Evictor(moe, layer, a.top_k, a.evict_experts, a.seed + 2)
    rng = np.random.default_rng(a.seed + 1)
    calib_calls = max(5, a.iters)

    # The model's inputs, each measured alone (or given).
    pcie = a.pcie_gbs or measure_pcie_gbs(torch, device=a.device)
    given = gpu_inputs_given(a)
    if a.profile:
        inputs = cpu_inputs_from_profile(a.profile, a.tokens)
    else:  # measured here
        inputs = {}
        for t in a.tokens:
            m = measure_cpu_gbps(moe, layer, t, a.top_k, rng, calls=calib_calls, evict=evict)
            inputs[t] = {"cpu_gbps": m["cpu_gbps"], "dram_gbps": m["cpu_gbps"], "median_call_s": m["median_call_s"],
                         "source": "measured by this example"}
    log(f"pcie {pcie:.1f} GB/s; cpu GB/s per tokens "
        + ", ".join(f"{t}: {v['cpu_gbps']:.1f}" for t, v in inputs.items())
        + f"; moejit {ctx.isa} x {ctx.num_threads}")

    gpu = Gpu(torch, layer, host_t, max_fetch=max_tokens * a.top_k, chunk=a.chunk, matmul=a.gpu_matmul,
              device=a.device)
    x_host = torch.empty((max_tokens, a.hidden), dtype=torch.bfloat16, pin_memory=cuda)
    y_host = torch.empty((max_tokens, a.hidden), dtype=torch.bfloat16, pin_memory=cuda)
    host = measure_host_read_gbps(gpu, moe, max_tokens, a.top_k, rng, calls=max(3, a.iters // 3), evict=evict)
    for t in a.tokens:  # the model's DRAM capacity: what both read at once (or given)
        inputs[t]["dram_gbps_before"] = inputs[t]["dram_gbps"]
        inputs[t]["dram_gbps"] = a.dram_gbs or host["dram_gbps"]
        inputs[t]["fetch_chunk_bytes"] = a.chunk * ebytes
    log(f"host reads at once: moejit {host['cpu_gbps']:.1f} + copies {host['dma_gbps']:.1f} GB/s, "
        f"{host['dram_gbps']:.1f} GB/s together")
    load_s = {"all": gpu.load_resident(np.ones(a.experts, bool))}
    matmul = choose_matmul(gpu, max_tokens, a.top_k, rng) if a.gpu_matmul == "auto" else {"used": gpu.matmul}
    log(f"every expert resident: loaded and dequantized in {load_s['all']:.2f} s; GPU matmul {matmul}")
    for t in a.tokens:
        g = measure_gpu_gbps(gpu, t, a.top_k, rng, calls=calib_calls)
        o = measure_cpu_overhead(gpu, moe, x_host, y_host, t, a.top_k, calls=calib_calls)
        inputs[t].update({f"measured_{k}": g[k] for k in ("gpu_gbps", "gpu_call_s", "gpu_fetch_gbps")})
        inputs[t].update({k: g[k] for k in ("gpu_resident_one_s", "gpu_resident_call_s", "gpu_fetched_one_s",
                                            "gpu_fetched_call_s", "distinct_experts")})
        inputs[t]["measured_cpu_overhead_s"] = o
        for k, v in given.items():
            inputs[t][k] = inputs[t][f"measured_{k}"] if v is None else v
    log("gpu (fixed us, GB/s resident, GB/s fetched) and cpu overhead us per tokens: " + ", ".join(
        f"{t}: {1e6 * v['gpu_call_s']:.0f}, {v['gpu_gbps']:.1f}, {v['gpu_fetch_gbps']:.1f}, "
        f"{1e6 * v['cpu_overhead_s']:.0f}" for t, v in inputs.items()))
    log(f"moejit-bench --profile P --miss-rate R {bench_options(pcie, inputs[max_tokens], a.chunk)} "
        f"models this machine at {max_tokens} tokens")

    rows, checks = [], []
    for m in a.miss_rates:
        mask = resident_mask(a.experts, m, rng)
        load_s[str(m)] = gpu.load_resident(mask)
        for tokens in a.tokens:
            c = inputs[tokens]
            # The model at the expected counts of this case: its pick, (c), and its balanced split.
            distinct = expected_distinct(tokens, a.experts, a.top_k)
            plan = predict(m * distinct, (1 - m) * distinct, ebytes, c, pcie)
            pick, f = plan["best"], plan["cpu_fraction"]
            xh, yh = x_host[:tokens], y_host[:tokens]

            def call():
                ids, w = route(rng, tokens, a.experts, a.top_k)
                return ids, w, split_routes(ids, mask, f), gpu.randn_x(tokens)

            # Correctness: the three ways on one routing against moejit computing every route.
            ids, w, sp, x = call()
            ref = moe.forward(x.cpu().view(torch.int16).numpy(), ids, w)
            ref_t = torch.from_numpy(ref.view(np.int16)).view(torch.bfloat16).float().to(gpu.dev)
            scale = ref_t.abs().max().item() or 1.0
            for way in WAYS:
                err = (serve(gpu, moe, x, xh, yh, ids, w, sp, way)[1] - ref_t).abs().max().item() / scale
                checks.append({"tokens": tokens, "miss_rate": m, "way": way, "max_rel_err": err})
                if err > 2e-2:
                    raise SystemExit(f"{way} at {tokens} tokens, miss {m}: max error {err:.3g} of max |y|")
            # Timing: every call a fresh routing and x, its experts pushed out of the L3 first,
            # the ways in rotating order; the GPU's resident compute alone as a fourth.
            times = {k: [] for k in WAYS + ("gpu_resident",)}
            missed_counts, resident_counts = [], []
            for it in range(a.warmup + a.iters):
                for j in range(len(WAYS)):
                    way = WAYS[(it + j) % len(WAYS)]
                    ids, w, sp, x = call()
                    evict(ids)
                    dt = serve(gpu, moe, x, xh, yh, ids, w, sp, way)[0]
                    if it >= a.warmup:
                        times[way].append(dt)
                        missed_counts.append(len(sp.missed))
                        resident_counts.append(len(np.unique(sp.resident[sp.resident >= 0])))
                ids, w, sp, x = call()
                gpu.sync()
                t0 = time.perf_counter()
                gpu.compute_resident(gpu.zeros_y(tokens), x, sp.resident, w)
                gpu.sync()
                if it >= a.warmup:
                    times["gpu_resident"].append(time.perf_counter() - t0)
            missed, resident = statistics.mean(missed_counts), statistics.mean(resident_counts)
            model = predict(missed, resident, ebytes, c, pcie)
            ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
            ms["split"] = ms[PICK_WAY[pick]]  # (c): the way the model picked
            rows.append({"tokens": tokens, "miss_rate": m, "missed_experts": missed, "resident_experts": resident,
                         "model": model, "model_ms": model_ms(model), "pick_run": pick, "cpu_fraction_run": f,
                         "measured_ms": ms, "model_error": model_error(model, ms),
                         "samples_ms": {k: [1e3 * v for v in vs] for k, vs in times.items()},
                         "fastest": fastest(ms), "model_right": model_right(ms, pick)})
            log(f"tokens {tokens} miss {m:.2f}: " + ", ".join(f"{k} {v:.2f}" for k, v in ms.items()) + " ms")
    print(markdown_table(rows, measured=True))
    doc = {"geometry": geometry,
           "machine": {"gpu": torch.cuda.get_device_name() if cuda else "none (--device cpu)",
                       "torch": torch.__version__, "moejit": moejit.info(), "cpu_threads": ctx.num_threads,
                       "isa": ctx.isa},
           "settings": {"iters": a.iters, "warmup": a.warmup, "chunk": a.chunk, "evict_experts": a.evict_experts,
                        "gpu_matmul": matmul, "gpu_matmul_at_end": gpu.matmul,
                        "grouped_failure": gpu.grouped_failure, "resident_load_s": load_s,
                        "wall_s": time.perf_counter() - t_start},
           "inputs": {"pcie_gbs": pcie, "host_reads_at_once": host, "per_tokens": inputs}, "rows": rows,
           "checks": checks}
    write_json(a.out, doc)
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
