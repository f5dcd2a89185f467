"""The CPU-only parts of examples/hybrid_moe.py: the backend model (against
moejit-bench --profile itself when CTest names the tool), the routing split, the
CPU path on a small layer against a float64 reference, and --plan-only."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import moejit
from moejit_ref import BF16, assert_close, moe_reference

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import hybrid_moe as hm  # noqa: E402

BENCH = os.environ.get("MOEJIT_BENCH_EXE")

try:  # the GPU side's code, run with torch on the CPU (--device cpu): where torch is installed
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


INF = float("inf")


def model(missing, resident, cpu, pcie, dram, gpu=INF, gpu_fetch=INF, overhead=0.0, call=0.0, chunk=0.0):
    return hm.model_backends(missing, resident, cpu, pcie, dram, gpu, gpu_fetch, overhead, call, chunk)


def gpu_side(m, call, g, fetch, chunk_fetch):
    """G(g) of tools/bench_model.h, evaluated directly from the model's terms (g: a number or an array)."""
    a, b, b1 = m["gpu_resident_s"], m["gpu_fetched_s"], m["chunk_gpu_fetched_s"]
    side = call + np.maximum.reduce([a + g * b, np.minimum(g * fetch, chunk_fetch) + g * b,
                                     g * fetch + np.minimum(g * b, b1)])
    return np.where(g > 0, side, a)


def split_time(m, overhead, call, f):
    """t(f) of the split with both sides at work, as tools/bench_model.h defines it."""
    k = m["shared_rate"]
    return overhead + np.maximum(f * m["cpu_compute_s"] / k,
                                 gpu_side(m, call, 1 - f, m["fetch_s"] / k, m["chunk_fetch_s"] / k))


# The same cases as tests/test_bench_model.cpp (BackendModel.*): the two copies of the model agree,
# and each case fails if its term is dropped.
def test_model_without_gpu_terms_is_cpu_against_pcie():
    m = model(1e9, 0, 100, 25, 200)  # DRAM to spare: 125 of 200 GB/s
    assert m["cpu_s"] == pytest.approx(0.01) and m["pcie_s"] == pytest.approx(0.04) and m["shared_rate"] == 1.0
    assert m["cpu_fraction"] == pytest.approx(0.8) and m["hybrid_s"] == pytest.approx(0.008)
    assert m["best"] == "hybrid" and hm.cpu_share(m) == pytest.approx(0.8)
    h = model(1e9, 0, 25, 25, 200)  # equal ways: the split halves the time
    assert h["best"] == "hybrid" and h["best_s"] == pytest.approx(0.02) and hm.cpu_share(h) == pytest.approx(0.5)
    assert model(1e9, 0, 10, 25, 25)["best"] == "pcie"


def test_model_cpu_and_copy_engine_share_dram():
    m = model(1e9, 0, 100, 25, 100)  # 125 GB/s asked of 100: each side at 0.8
    assert m["dram_capacity_gbps"] == 100 and m["shared_rate"] == pytest.approx(0.8)
    assert m["cpu_fraction"] == pytest.approx(0.8) and m["hybrid_ideal_s"] == pytest.approx(0.01)
    assert m["dram_floor_s"] == pytest.approx(0.01) and m["best"] == "cpu" and hm.cpu_share(m) == 1.0
    low = model(1e9, 0, 100, 25, 60)  # the capacity is at least what each side pulled alone
    assert low["dram_capacity_gbps"] == 100 and low["shared_rate"] == pytest.approx(0.8)
    close = model(1e9, 0, 25, 25, 27.0)  # the split must beat the better single way by more than 10%
    assert close["shared_rate"] == pytest.approx(27 / 50)
    assert close["best"] in ("cpu", "pcie") and close["hybrid_s"] == pytest.approx(1 / 27.0)
    assert close["cpu_s"] == pytest.approx(0.04) and close["pcie_s"] == pytest.approx(0.04)  # alone: no share


def test_model_cpu_overhead_is_in_line_with_the_gpus_compute():
    # 10 GB resident at 1000 GB/s: 10 ms; 0.1 GB missing: 1 ms on the CPU, 4 ms over PCIe.
    m = model(1e8, 1e10, 100, 25, 200, 1000, 500, 5e-4)
    assert m["gpu_resident_s"] == pytest.approx(0.01) and m["cpu_compute_s"] == pytest.approx(0.001)
    assert m["cpu_s"] == pytest.approx(0.0105)  # the CPU's compute hides behind the GPU's, the overhead does not
    assert m["pcie_s"] == pytest.approx(0.0102)  # the fetched experts' compute after the resident ones
    assert m["cpu_fraction"] == 1.0 and m["hybrid_s"] == pytest.approx(m["cpu_s"])
    assert m["best"] == "pcie" and m["best_s"] == pytest.approx(0.0102)
    none = model(0, 1e10, 100, 25, 200, 1000, 500, 5e-4)  # nothing missing: the resident compute
    assert none["best"] == "none" and hm.cpu_share(none) == 0
    assert none["best_s"] == none["cpu_s"] == pytest.approx(0.01) and none["cpu_fraction"] == 0


def test_model_cpu_overhead_can_make_fetching_win():
    cheap = model(1e8, 0, 100, 25, 100, INF, 500, 0.0)
    assert cheap["cpu_s"] == pytest.approx(0.001) and cheap["best"] == "cpu"
    dear = model(1e8, 0, 100, 25, 100, INF, 500, 0.004)
    assert dear["cpu_s"] == pytest.approx(0.005) and dear["pcie_s"] == pytest.approx(0.0042)
    assert dear["best"] == "pcie" and hm.cpu_share(dear) == 0.0
    # The split pays the overhead on both sides: its balance is the overhead-free one.
    assert dear["cpu_fraction"] == pytest.approx(0.0052 / 0.00645)
    assert dear["hybrid_s"] == pytest.approx(0.004 + dear["cpu_fraction"] * 0.00125, abs=1e-15)


def test_model_every_gpu_compute_part_pays_the_fixed_time():
    m = model(1e8, 1e9, 100, 25, 200, 1000, 500, 0.0, 3e-4)
    assert m["gpu_resident_s"] == pytest.approx(1.3e-3) and m["cpu_s"] == pytest.approx(1.3e-3)
    assert m["pcie_s"] == pytest.approx(3e-4 + 4e-3 + 2e-4)  # the fetched experts: a second compute part
    assert model(1e8, 1e9, 100, 25, 200, INF, 500, 0.0, 3e-4)["gpu_resident_s"] == pytest.approx(3e-4)
    no_resident = model(1e8, 0, 100, 25, 200, 1000, 500, 0.0, 3e-4)
    assert no_resident["gpu_resident_s"] == 0 and no_resident["pcie_s"] == pytest.approx(4.5e-3)
    big = model(1e9, 1e9, 100, 25, 200, 1000, 500, 0.0, 3e-4)
    assert big["cpu_fraction"] == pytest.approx((3e-4 + 0.042) / 0.052)
    assert big["hybrid_s"] == pytest.approx(big["cpu_fraction"] * 0.01, abs=1e-15)


def test_model_fetched_experts_cost_gpu_compute_after_the_fetch():
    m = model(1e9, 0, 10, 25, 200, INF, 50, 0.0)
    assert m["fetch_s"] == pytest.approx(0.04) and m["gpu_fetched_s"] == pytest.approx(0.02)
    assert m["pcie_s"] == pytest.approx(0.06)
    assert m["cpu_fraction"] == pytest.approx(0.375) and m["hybrid_ideal_s"] == pytest.approx(0.0375)


def test_model_chunks_pipeline_the_fetch_with_the_compute():
    args = (10, 25, 200, 1000, 50, 0.0, 0.0, 1e8)  # chunks of 0.1 GB: 4 ms of copies, 2 ms of compute each
    m = model(1e9, 0, *args)
    assert m["chunk_fetch_s"] == pytest.approx(0.004) and m["chunk_gpu_fetched_s"] == pytest.approx(0.002)
    assert m["pcie_s"] == pytest.approx(0.042)  # all the copies, then the last chunk's compute
    assert model(1e9, 5e10, *args)["pcie_s"] == pytest.approx(0.07)  # the resident compute first
    assert model(1e9, 0, 10, 25, 200, 1000, 10, 0.0, 0.0, 1e8)["pcie_s"] == pytest.approx(0.104)  # GPU slower
    assert model(5e7, 0, *args)["pcie_s"] == pytest.approx(0.003)  # less than a chunk
    assert m["cpu_fraction"] == pytest.approx(0.042 / 0.14) and m["hybrid_ideal_s"] == pytest.approx(0.03)


def test_model_split_is_the_minimum_over_f():
    fs = np.linspace(0, 1, 20001)[1:-1]
    cases = inside = 0
    for resident in (0.0, 2e8, 1e9, 5e9):
        for overhead in (0.0, 2e-4, 3e-3):
            for cpu in (20.0, 100.0, 400.0):
                for gpu_fetch in (100.0, 400.0, INF):
                    for call in (0.0, 5e-4):
                        for chunk in (0.0, 4e7):
                            for dram in (1e6, 90.0):
                                m = model(5e8, resident, cpu, 50, dram, 1500, gpu_fetch, overhead, call, chunk)
                                best = split_time(m, overhead, call, fs).min()
                                assert m["cpu_s"] == pytest.approx(overhead + max(m["gpu_resident_s"],
                                                                                  m["cpu_compute_s"]))
                                assert m["pcie_s"] == pytest.approx(gpu_side(m, call, 1.0, m["fetch_s"],
                                                                             m["chunk_fetch_s"]))
                                assert m["hybrid_ideal_s"] <= best * (1 + 1e-12)
                                f = m["cpu_fraction"]
                                if 0 < f < 1:
                                    inside += 1
                                    assert m["hybrid_ideal_s"] == pytest.approx(split_time(m, overhead, call, f),
                                                                                abs=1e-15)
                                    assert m["hybrid_ideal_s"] == pytest.approx(
                                        hm.split_time(m, overhead, call, f), abs=1e-15)
                                    step = 1e-4 * (m["cpu_compute_s"] + m["fetch_s"] + m["gpu_fetched_s"])
                                    assert m["hybrid_ideal_s"] >= best - step / m["shared_rate"]
                                else:
                                    assert m["hybrid_ideal_s"] == (m["cpu_s"] if f >= 1 else m["pcie_s"])
                                cases += 1
    assert cases == 864 and inside > cases // 2


def test_model_no_cpu_means_fetch_everything():
    m = model(1e9, 0, 0, 25, 30)
    assert m["cpu_s"] == INF and m["best"] == "pcie" and m["cpu_fraction"] == 0
    assert m["hybrid_ideal_s"] == pytest.approx(m["pcie_s"])


def test_model_defaults_are_moejit_bench_defaults():
    src = open(os.path.join(os.path.dirname(hm.__file__), "..", "tools", "bench_model.h")).read()
    for name, value in (("kDefaultGpuGbps", hm.DEFAULT_GPU_GBPS),
                        ("kDefaultGpuCallS", hm.DEFAULT_GPU_CALL_S),
                        ("kDefaultGpuFetchGbps", hm.DEFAULT_GPU_FETCH_GBPS),
                        ("kDefaultCpuOverheadS", hm.DEFAULT_CPU_OVERHEAD_S),
                        ("kDefaultFetchChunkExperts", hm.DEFAULT_FETCH_CHUNK_EXPERTS)):
        m = re.search(rf"constexpr (?:double|int) {name} = ([0-9.e+-]+);", src)
        assert m and float(m.group(1)) == value, name


def test_gpu_line():
    eb = 44_000_000
    # 0.7 ms for one expert, 3.7 ms for 101: 30 us per expert past 0.67 ms.
    g = hm.gpu_line(eb, 1, 0.7e-3, 101, 3.7e-3, 33e-3)
    assert g["gpu_call_s"] == pytest.approx(0.67e-3) and g["gpu_gbps"] == pytest.approx(eb / 30e-6 / 1e9)
    assert g["gpu_fetch_gbps"] == pytest.approx(101 * eb / (33e-3 - 0.67e-3) / 1e9)
    # The model gives both measured times back.
    for n, t in ((1, 0.7e-3), (101, 3.7e-3)):
        assert hm.model_backends(0, n * eb, 1, 1, 1, g["gpu_gbps"], 1, 0, g["gpu_call_s"], 0)["gpu_resident_s"] \
            == pytest.approx(t)
    # A time that does not grow with the experts (one token): all of it is the fixed part.
    flat = hm.gpu_line(eb, 1, 0.7e-3, 8, 0.68e-3, 3e-3)
    assert flat["gpu_call_s"] == pytest.approx(0.68e-3) and flat["gpu_gbps"] == INF
    # A line below the origin: no fixed part, the rate of the whole call.
    low = hm.gpu_line(eb, 2, 0.1e-3, 10, 2e-3, 3e-3)
    assert low["gpu_call_s"] == 0 and low["gpu_gbps"] == pytest.approx(10 * eb / 2e-3 / 1e9)
    # One expert per call: no line, no fixed part.
    assert hm.gpu_line(eb, 1, 1e-3, 1, 1e-3, 2e-3)["gpu_call_s"] == 0


@pytest.mark.skipif(not BENCH, reason="MOEJIT_BENCH_EXE (set by CTest) names no moejit-bench")
def test_model_matches_moejit_bench_profile(tmp_path):
    # The example's model is the tool's: recompute every entry of a real profile.
    prof = tmp_path / "prof.json"
    subprocess.run([BENCH, "--hidden", "256", "--intermediate", "128", "--experts", "32", "--top-k", "4",
                    "--format", "fp8_block,bf16", "--tokens", "1,4", "--threads", "1", "--min-time", "0.02",
                    "--repeat", "2", "--warmup", "1", "--profile", str(prof), "--pcie-gbs", "25", "--miss-rate",
                    "0.3", "--gpu-gbs", "2", "--gpu-fetch-gbs", "0.5", "--cpu-overhead-us", "30", "--gpu-call-us",
                    "40", "--fetch-chunk-experts", "2"],
                   check=True, capture_output=True)
    doc = json.loads(prof.read_text())
    assert doc["schema_version"] == 2
    assert doc["model_inputs"] == {"pcie_gbs": 25.0, "miss_rate": 0.3, "gpu_gbps": 2.0,
                                   "gpu_call_s": pytest.approx(40e-6), "gpu_fetch_gbps": 0.5,
                                   "cpu_overhead_s": pytest.approx(30e-6), "fetch_chunk_experts": 2,
                                   "dram_gbps": None}  # each entry's probe
    assert len(doc["entries"]) == 4
    for e in doc["entries"]:
        b = e["backends"]
        per_token = 1.0 / e["tokens"]
        m = hm.model_backends(b["missing_bytes_per_call"], b["resident_bytes_per_call"], e["cpu_gbps"], 25.0,
                              e["dram_gbps"], 2.0, 0.5, 30e-6, 40e-6, 2 * e["expert_bytes"])
        assert b["missing_experts_per_call"] == pytest.approx(0.3 * e["distinct_experts_per_call"])
        assert b["resident_experts_per_call"] == pytest.approx(0.7 * e["distinct_experts_per_call"])
        assert m["missing_bytes"] == pytest.approx(b["missing_experts_per_call"] * e["expert_bytes"])
        assert m["resident_bytes"] == pytest.approx(b["resident_experts_per_call"] * e["expert_bytes"])
        assert m["gpu_resident_s"] > 0
        for key, got in ((m["gpu_resident_s"], b["gpu_resident"]["time_per_token_s"]),
                         (m["cpu_s"], b["cpu"]["time_per_token_s"]),
                         (m["cpu_compute_s"], b["cpu"]["compute_per_token_s"]),
                         (m["pcie_s"], b["pcie"]["time_per_token_s"]),
                         (m["fetch_s"], b["pcie"]["fetch_per_token_s"]),
                         (m["gpu_fetched_s"], b["pcie"]["gpu_fetched_per_token_s"]),
                         (m["hybrid_s"], b["hybrid"]["time_per_token_s"]),
                         (m["hybrid_ideal_s"], b["hybrid"]["ideal_time_per_token_s"]),
                         (m["dram_floor_s"], b["hybrid"]["dram_floor_per_token_s"]),
                         (m["best_s"], e["recommendation"]["time_per_token_s"])):
            assert key * per_token == pytest.approx(got, rel=1e-9)
        assert m["cpu_fraction"] == pytest.approx(b["hybrid"]["cpu_fraction"], rel=1e-9, abs=1e-12)
        assert m["shared_rate"] == pytest.approx(b["hybrid"]["shared_rate"], rel=1e-12)
        assert m["dram_capacity_gbps"] == pytest.approx(b["hybrid"]["dram_capacity_gbps"], rel=1e-12)
        assert m["best"] == e["recommendation"]["backend"]
    best = hm.load_profile(str(prof))
    assert sorted(best) == [1, 4] and all(v["format"] == "fp8_block" for v in best.values())
    # --plan-only reads the same profile and prints the model's table.
    out = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, hm.__file__, "--plan-only", "--profile", str(prof), "--pcie-gbs", "25",
                        "--tokens", "1,4", "--experts", "32", "--hidden", "256", "--intermediate", "128",
                        "--top-k", "4", "--gpu-gbs", "2", "--gpu-fetch-gbs", "0.5", "--cpu-overhead-us", "30",
                        "--gpu-call-us", "40", "--chunk", "2", "--out", str(out)],
                       check=True, capture_output=True, text=True, env=os.environ.copy())
    assert r.stdout.startswith("| tokens | miss % |") and len(r.stdout.strip().splitlines()) == 2 + 2 * 4
    plan = json.loads(out.read_text())
    assert len(plan["rows"]) == 8 and plan["inputs"]["pcie_gbs"] == 25
    # The plan at miss 0.3 is the profile's model of the same entry (expected, not measured, distinct experts).
    for row in plan["rows"]:
        if row["miss_rate"] != 0.3:
            continue
        e = best[row["tokens"]]
        m = hm.predict(row["missed_experts"], row["resident_experts"], e["expert_bytes"],
                       {"cpu_gbps": e["cpu_gbps"], "dram_gbps": e["dram_gbps"], "gpu_gbps": 2.0, "gpu_call_s": 40e-6,
                        "gpu_fetch_gbps": 0.5, "cpu_overhead_s": 30e-6, "fetch_chunk_bytes": 2 * e["expert_bytes"]},
                       25.0)
        assert row["model"] == pytest.approx(m)
        assert row["model"]["gpu_resident_s"] > 0


def test_load_profile_checks_schema(tmp_path):
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"schema_version": 3, "entries": []}))
    with pytest.raises(ValueError, match="schema_version 3"):
        hm.load_profile(str(p))
    p.write_text(json.dumps({"schema_version": 1, "entries": [
        {"format": "bf16", "tokens": 1, "cpu_gbps": 5.0, "dram_gbps": 9.0}]}))
    with pytest.raises(ValueError, match="no fp8_block entries"):
        hm.load_profile(str(p))
    p.write_text(json.dumps({"schema_version": 1, "entries": [
        {"format": "fp8_block", "tokens": 4, "cpu_gbps": 5.0, "dram_gbps": 9.0},
        {"format": "fp8_block", "tokens": 4, "cpu_gbps": 7.0, "dram_gbps": 8.0}]}))
    assert hm.load_profile(str(p))[4]["cpu_gbps"] == 7.0


def test_plan_only_table_and_json(tmp_path, capsys):
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"schema_version": 2, "entries": [
        {"format": "fp8_block", "tokens": t, "cpu_gbps": 20.0 * t ** 0.3, "dram_gbps": 60.0} for t in (1, 4, 16)]}))
    out = tmp_path / "o.json"
    assert hm.main(["--plan-only", "--profile", str(p), "--pcie-gbs", "25", "--out", str(out)]) == 0
    table = capsys.readouterr().out.strip().splitlines()
    assert len(table) == 2 + 3 * 4
    doc = json.loads(out.read_text())
    assert doc["geometry"]["expert_bytes"] == hm.expert_bytes(7168, 2048) == 44_045_568
    row = doc["rows"][0]
    assert row["tokens"] == 1 and row["miss_rate"] == 0.1
    assert row["missed_experts"] == pytest.approx(0.8)  # 8 distinct experts x 10%
    assert row["resident_experts"] == pytest.approx(7.2)
    # Without GPU inputs on the command line, moejit-bench's defaults.
    inputs = doc["inputs"]["per_tokens"]["1"]
    assert inputs["gpu_gbps"] == hm.DEFAULT_GPU_GBPS and inputs["cpu_overhead_s"] == hm.DEFAULT_CPU_OVERHEAD_S
    assert inputs["gpu_call_s"] == hm.DEFAULT_GPU_CALL_S and inputs["gpu_fetch_gbps"] == hm.DEFAULT_GPU_FETCH_GBPS
    assert inputs["fetch_chunk_bytes"] == 8 * 44_045_568 and inputs["dram_gbps"] == 60.0  # --chunk; the profile's
    m = row["model"]
    assert m["gpu_resident_s"] == pytest.approx(hm.DEFAULT_GPU_CALL_S + 7.2 * 44_045_568 / (hm.DEFAULT_GPU_GBPS * 1e9))
    assert m["cpu_s"] == pytest.approx(hm.DEFAULT_CPU_OVERHEAD_S + 0.8 * 44_045_568 / 20e9)
    assert m["best"] == "pcie"  # a CPU of 20 GB/s: 1.8 ms for the missed expert, 0.7 ms to copy it
    # A slow GPU makes the resident compute the layer: the CPU way hides behind it, its overhead does not.
    assert hm.main(["--plan-only", "--profile", str(p), "--pcie-gbs", "25", "--gpu-gbs", "50", "--tokens", "16",
                    "--miss-rates", "0.1", "--dram-gbs", "90", "--out", str(out)]) == 0
    capsys.readouterr()
    doc = json.loads(out.read_text())
    slow = doc["rows"][0]["model"]
    assert doc["inputs"]["per_tokens"]["16"]["dram_gbps"] == 90.0
    assert slow["best"] == "cpu"
    assert slow["best_s"] == pytest.approx(slow["gpu_resident_s"] + hm.DEFAULT_CPU_OVERHEAD_S)
    with pytest.raises(SystemExit):
        hm.main(["--plan-only", "--pcie-gbs", "25"])  # no profile
    with pytest.raises(SystemExit):
        hm.main(["--plan-only", "--profile", str(p), "--pcie-gbs", "25", "--tokens", "2"])  # no entry for 2
    with pytest.raises(SystemExit):
        hm.main(["--experts", "2000", "--plan-only", "--profile", str(p), "--pcie-gbs", "25"])  # host memory
    for bad in (["--gpu-gbs", "0"], ["--gpu-fetch-gbs", "-1"], ["--cpu-overhead-us", "-3"], ["--pcie-gbs", "0"],
                ["--gpu-call-us", "-1"], ["--dram-gbs", "0"], ["--dram-gbs", "inf"]):
        with pytest.raises(SystemExit):
            hm.main(["--plan-only", "--profile", str(p), "--pcie-gbs", "25"] + bad)


def test_measured_table_and_model_error():
    m = model(1e8, 1e9, 100, 25, 100, 1000, 500, 1e-4)
    ms = {"gpu_resident": 1.0, "fetch": 5.0, "cpu": 1.2, "hybrid": 1.3}
    ms["split"] = ms[hm.PICK_WAY[m["best"]]]
    err = hm.model_error(m, ms)
    assert set(err) == {"gpu_resident", "fetch", "cpu", "hybrid", "split"}
    assert err["gpu_resident"] == pytest.approx(0.0) and err["cpu"] == pytest.approx(1.1 / 1.2 - 1)
    assert err["split"] == pytest.approx(1e3 * m["best_s"] / ms["split"] - 1)
    assert hm.fastest(ms) == "cpu" and hm.fastest({**ms, "hybrid": 1.0}) == "hybrid"
    assert hm.model_right(ms, "cpu") and hm.model_right(ms, "hybrid") and not hm.model_right(ms, "pcie")
    assert not hm.model_right({**ms, "hybrid": 1.4}, "hybrid") and hm.model_right(ms, "none")
    row = {"tokens": 4, "miss_rate": 0.25, "missed_experts": 7.9, "model": m, "measured_ms": ms, "model_error": err,
           "pick_run": "cpu", "cpu_fraction_run": 1.0, "fastest": "cpu", "model_right": True}
    table = hm.markdown_table([row], measured=True).splitlines()
    assert len(table) == 3 and table[0].count("|") == table[2].count("|") == 17
    assert "| 1.30 (1.00) | 1.20 (cpu) | +0 / " in table[2] and table[2].endswith("| cpu | yes |")


def test_measure_gpu_inputs_with_a_fake_gpu(rng, monkeypatch):
    """measure_gpu_gbps without torch: a GPU whose compute part costs 1 ms plus 0.2 ms per resident
    expert (0.5 ms per fetched one), on a clock it advances."""
    clock = [0.0]
    monkeypatch.setattr(hm.time, "perf_counter", lambda: clock[0])
    seen = []

    class FakeGpu:
        layer = hm.HostLayer(np.zeros((64, 256, 128), np.uint8), np.zeros((64, 2, 1), np.uint16),
                             np.zeros((64, 128, 128), np.uint8), np.zeros((64, 1, 1), np.uint16))

        def sync(self):
            pass

        def randn_x(self, tokens):
            return np.zeros((tokens, 128))

        def zeros_y(self, tokens):
            return np.zeros((tokens, 128))

        def fetch(self, experts):
            self.staged = np.array(experts)

        def compute_resident(self, y, x, ids, w):
            used = np.unique(ids[ids >= 0])
            seen.append(len(used))
            clock[0] += 1e-3 + 2e-4 * len(used)

        def compute_fetched(self, y, x, ids, w, experts, events=None):
            assert np.array_equal(np.unique(ids[ids >= 0]), np.sort(experts))  # the staged experts' routes only
            assert np.array_equal(self.staged, experts)
            clock[0] += 1e-3 + 5e-4 * len(experts)

    g = hm.measure_gpu_gbps(FakeGpu(), tokens=4, top_k=4, rng=rng, calls=5)
    eb = hm.expert_bytes(128, 128)
    assert set(seen[::2]) == {1}  # the one-expert call, then the whole call
    assert g["gpu_resident_one_s"] == pytest.approx(1.2e-3) and g["gpu_fetched_one_s"] == pytest.approx(1.5e-3)
    assert g["gpu_call_s"] == pytest.approx(1e-3) and g["gpu_gbps"] == pytest.approx(eb / 2e-4 / 1e9)
    assert g["gpu_fetch_gbps"] == pytest.approx(eb / 5e-4 / 1e9)
    assert g["gpu_resident_call_s"] == pytest.approx(1e-3 + 2e-4 * g["distinct_experts"])


RUN2 = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "runs", "hybrid_run2.json")


def test_replay_of_the_h200_run(tmp_path, capsys):
    """docs/PERFORMANCE.md's "Hybrid GPU + CPU (Xeon + H200)": the model recomputed from that run's
    inputs, its errors and picks against the run's own model's."""
    run = json.load(open(RUN2))
    inputs = hm.replay_inputs(run)
    # The run timed no call with one resident expert: the line through its 75% case and every expert.
    i16 = inputs[16]
    assert "miss 0.75" in i16["source"]
    assert i16["gpu_call_s"] == pytest.approx(0.808e-3, abs=1e-6) and i16["gpu_gbps"] == pytest.approx(1549, abs=1)
    assert i16["gpu_fetch_gbps"] == pytest.approx(138.4, abs=0.1) and i16["fetch_chunk_bytes"] == 8 * 44_045_568
    assert inputs[1]["gpu_gbps"] == INF  # one token: the GPU time does not grow with the experts
    # moejit-bench's defaults are this run's 16-token figures.
    for name, value in (("gpu_call_s", hm.DEFAULT_GPU_CALL_S), ("cpu_overhead_s", hm.DEFAULT_CPU_OVERHEAD_S)):
        assert i16[name] == pytest.approx(value, abs=5e-6), name
    for name, value in (("gpu_gbps", hm.DEFAULT_GPU_GBPS), ("gpu_fetch_gbps", hm.DEFAULT_GPU_FETCH_GBPS)):
        assert i16[name] == pytest.approx(value, rel=0.01), name
    rows = hm.replay(run)
    assert len(rows) == 12
    for r, orig in zip(rows, run["rows"]):
        assert r["old"]["error"]["hybrid"] == orig["model_error"]["hybrid"] and r["old"]["pick"] == orig["pick_run"]
        # The recomputed times are the model's at the case's measured counts, the hybrid at the run's f.
        m = hm.predict(orig["missed_experts"], orig["resident_experts"], 44_045_568, inputs[r["tokens"]],
                       run["inputs"]["pcie_gbs"])
        assert r["new"]["ms"]["cpu"] == pytest.approx(1e3 * m["cpu_s"])
        c = inputs[r["tokens"]]
        assert r["new"]["ms"]["hybrid"] == pytest.approx(
            1e3 * hm.split_time(m, c["cpu_overhead_s"], c["gpu_call_s"], orig["cpu_fraction_run"]))

    def mean_abs(name, way):
        return sum(abs(r[name]["error"][way]) for r in rows) / len(rows)

    for way in ("gpu_resident", "fetch", "cpu", "hybrid"):
        assert mean_abs("new", way) < mean_abs("old", way), way
    assert mean_abs("new", "gpu_resident") < 0.05 and mean_abs("new", "fetch") < 0.1
    assert sum(r["new"]["right"] for r in rows) > sum(r["old"]["right"] for r in rows) == 10
    one = {r["miss_rate"]: r["new"]["pick"] for r in rows if r["tokens"] == 1}
    assert one[0.1] == one[0.25] == "cpu" and one[0.75] == "hybrid"
    # --replay prints the three tables and writes the rows.
    out = tmp_path / "replay.json"
    assert hm.main(["--replay", RUN2, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count("| tokens | miss % |") == 3 and "picks right 10 of 12" in text
    assert len(json.loads(out.read_text())["rows"]) == 12


def test_expected_missed():
    assert hm.expected_missed(1, 256, 8, 0.5) == pytest.approx(4.0)
    rng = np.random.default_rng(0)
    d = np.mean([len(np.unique(hm.route(rng, 16, 256, 8)[0])) for _ in range(400)])
    assert hm.expected_missed(16, 256, 8, 1.0) == pytest.approx(d, rel=0.02)


def test_routing_and_split(rng):
    ids, w = hm.route(rng, 16, 64, 8)
    assert ids.dtype == np.int32 and w.dtype == np.float32 and ids.shape == w.shape == (16, 8)
    assert all(len(set(r)) == 8 for r in ids) and np.allclose(w.sum(axis=1), 1)
    mask = hm.resident_mask(64, 0.25, rng)
    assert mask.sum() == 48
    ids[3, 2] = -1  # a route computed elsewhere stays out of every part
    for f in (0.0, 0.5, 1.0):
        s = hm.split_routes(ids, mask, f)
        parts = np.stack([s.resident, s.cpu, s.fetch])
        assert ((parts >= 0).sum(axis=0) == (ids >= 0)).all()  # each route exactly once
        assert np.array_equal(parts.max(axis=0), ids)
        assert mask[s.resident[s.resident >= 0]].all() and not mask[s.missed].any()
        assert np.array_equal(np.sort(np.concatenate([s.cpu_experts, s.fetch_experts])), s.missed)
        assert len(s.cpu_experts) == round(f * len(s.missed))
        assert set(s.cpu[s.cpu >= 0]) == set(s.cpu_experts) and set(s.fetch[s.fetch >= 0]) == set(s.fetch_experts)
    with pytest.raises(ValueError):
        hm.split_routes(ids, mask, 1.5)
    g = hm.groups(ids, w)
    assert sum(len(t) for t, _ in g.values()) == (ids >= 0).sum() and list(g) == sorted(g)


def test_sort_routes(rng):
    ids, w = hm.route(rng, 4, 16, 3)
    ids[1, 0] = -1
    slot_of = np.full(16, -1, np.int64)
    used = np.unique(ids[ids >= 0])
    slot_of[used] = np.arange(len(used))[::-1]  # slots in another order than the ids
    r = hm.sort_routes(ids, w, slot_of, len(used) + 2)
    assert r.routes == 11 and r.counts.sum() == 11 and len(r.counts) == len(used) + 2 and r.counts[-2:].sum() == 0
    # Grouped by slot, each route once, with its token and weight.
    slots = np.repeat(np.arange(len(r.counts)), r.counts)
    got = sorted(zip(slots.tolist(), r.tokens.tolist(), r.weights.tolist()))
    want = sorted((int(slot_of[ids[t, j]]), t, float(w[t, j])) for t, j in zip(*np.nonzero(ids >= 0)))
    assert got == want
    slot_of[used[0]] = -1
    with pytest.raises(ValueError, match="no slot"):
        hm.sort_routes(ids, w, slot_of, len(used))


def test_evictor_reads_other_experts(rng):
    calls = []

    class Fake:
        def forward(self, x, ids, w):
            calls.append((x.shape, ids.copy(), w.copy()))

    layer = hm.HostLayer(np.zeros((40, 256, 128), np.uint8), np.zeros((40, 2, 1), np.uint16),
                         np.zeros((40, 128, 128), np.uint8), np.zeros((40, 1, 1), np.uint16))
    ev = hm.Evictor(Fake(), layer, top_k=4, experts=10, seed=1)
    avoid = np.arange(0, 40, 2)
    ev(avoid)
    (shape, ids, w), = calls
    assert shape == (3, 128) and ids.shape == w.shape == (3, 4)
    picked = ids[ids >= 0]
    assert len(picked) == 10 and len(set(picked.tolist())) == 10 and not np.isin(picked, avoid).any()
    ev(np.arange(36))  # fewer experts left than asked: those
    assert sorted(calls[-1][1][calls[-1][1] >= 0].tolist()) == [36, 37, 38, 39]
    hm.Evictor(Fake(), layer, top_k=4, experts=0, seed=1)()  # off
    assert len(calls) == 2


def test_cpu_path_on_a_small_layer(rng):
    layer = hm.make_host_layer(12, 256, 256, seed=3)
    assert layer.w13.dtype == np.uint8 and not np.isin(layer.w13, (0x7F, 0xFF)).any()
    ctx = moejit.Context(num_threads=2)
    moe = hm.cpu_layer(ctx, layer, top_k=4, max_tokens=4)
    # The layer reads the host banks in place.
    assert moe.bank_pointers()["gate_up"][5]["data"] == layer.w13[5].__array_interface__["data"][0]
    x = (rng.standard_normal((4, 256)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    ids, w = hm.route(rng, 4, 12, 4)
    s = hm.split_routes(ids, hm.resident_mask(12, 0.5, rng), 0.5)
    y_cpu = moe.submit(x, s.cpu, w).wait()  # what the CPU computes in (c)
    full = moe.forward(x, ids, w)  # moejit with every route: the example's check of (a), (b), (c)
    ref_cpu = hm.reference(layer, x, s.cpu, w)
    ref_all = hm.reference(layer, x, ids, w)
    # The example's reference agrees with the tests' own (tests/python/moejit_ref.py).
    gu = np.stack([hm.dequant(layer.w13[e], layer.s13[e]) for e in range(12)])
    dn = np.stack([hm.dequant(layer.w2[e], layer.s2[e]) for e in range(12)])
    xb = x.view(BF16)
    for part, ref in ((s.cpu, ref_cpu), (ids, ref_all)):
        r2, bound = moe_reference(xb, part, w, gu, dn)
        np.testing.assert_allclose(ref, r2, rtol=1e-9, atol=1e-9 * np.abs(r2).max())
    # The CPU part and the GPU parts (here the reference) add up to the whole layer.
    ref_rest = hm.reference(layer, x, np.where(s.cpu >= 0, -1, ids), w)
    np.testing.assert_allclose(ref_cpu + ref_rest, ref_all, rtol=1e-9, atol=1e-9 * np.abs(ref_all).max())
    for got, part in ((y_cpu, s.cpu), (full, ids)):
        assert got.dtype == BF16
        ref, bound = moe_reference(xb, part, w, gu, dn)
        assert_close(got, ref, bound, True)


def test_gpu_run_without_torch_says_so():
    if torch is not None:
        pytest.skip("torch is installed")
    with pytest.raises(SystemExit, match="the GPU run needs torch"):
        hm.main(["--experts", "8"])


def torch_views(layer):
    return {"w13": torch.from_numpy(layer.w13), "w2": torch.from_numpy(layer.w2),
            "s13": torch.from_numpy(layer.s13.view(np.int16)).view(torch.bfloat16),
            "s2": torch.from_numpy(layer.s2.view(np.int16)).view(torch.bfloat16)}


def close_to(got, ref, tol=2e-2):
    got = got.double().numpy() if hasattr(got, "numpy") else got
    scale = np.abs(ref).max() or 1.0
    return np.abs(got - ref).max() / scale <= tol


@needs_torch
@pytest.mark.parametrize("matmul", ["loop", "grouped"])
def test_gpu_side_on_the_cpu(rng, matmul):
    torch.set_num_threads(1)
    layer = hm.make_host_layer(10, 256, 256, seed=5)
    gpu = hm.Gpu(torch, layer, torch_views(layer), max_fetch=8, chunk=3, matmul="loop", device="cpu")
    if matmul == "grouped":
        if gpu._grouped_mm is None:
            pytest.skip("this torch has no grouped_mm")
        gpu.matmul = "grouped"
    mask = hm.resident_mask(10, 0.4, rng)
    gpu.load_resident(mask)
    # The resident experts, dequantized once: the float64 dequantization rounded to bf16.
    for e in np.flatnonzero(mask):
        s = gpu.slot_of[e]
        ref = hm.dequant(layer.w13[e], layer.s13[e])
        got = gpu.bank["w13"][s].double().numpy()
        np.testing.assert_allclose(got, ref, rtol=2 ** -8, atol=0)
        np.testing.assert_allclose(gpu.bank["w2"][s].double().numpy(), hm.dequant(layer.w2[e], layer.s2[e]),
                                   rtol=2 ** -8, atol=0)
    assert (gpu.slot_of[~mask] == -1).all()
    ids, w = hm.route(rng, 4, 10, 3)
    x_bits = (rng.standard_normal((4, 256)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    x = torch.from_numpy(x_bits.view(np.int16)).view(torch.bfloat16)
    sp = hm.split_routes(ids, mask, 0.5)
    y = gpu.zeros_y(4)
    gpu.compute_resident(y, x, sp.resident, w)
    assert close_to(y, hm.reference(layer, x_bits, sp.resident, w))
    # Fetched experts, chunk by chunk (3 per chunk), dequantized from the fp8 staging.
    missed = np.where(sp.cpu >= 0, sp.cpu, sp.fetch)
    fetched = np.unique(missed[missed >= 0])
    events = gpu.fetch(fetched)
    assert len(events) == -(-len(fetched) // 3)
    y = gpu.zeros_y(4)
    gpu.compute_fetched(y, x, missed, w, fetched, events)
    assert close_to(y, hm.reference(layer, x_bits, missed, w))
    with pytest.raises(ValueError):
        gpu.fetch(np.arange(9))  # more than the staging slots
    # The three ways against the whole layer.
    ctx = moejit.Context(num_threads=1)
    moe = hm.cpu_layer(ctx, layer, top_k=3, max_tokens=4)
    xh, yh = torch.empty((4, 256), dtype=torch.bfloat16), torch.empty((4, 256), dtype=torch.bfloat16)
    ref = hm.reference(layer, x_bits, ids, w)
    for way in hm.WAYS:
        dt, y = hm.serve(gpu, moe, x, xh, yh, ids, w, sp, way)
        assert dt > 0 and close_to(y, ref), way
    assert gpu.matmul == matmul and gpu.grouped_failure is None  # grouped_mm was not given up
    # The inputs' measurements run (every expert resident).
    gpu.load_resident(np.ones(10, bool))
    g = hm.measure_gpu_gbps(gpu, 2, 3, rng, calls=1)
    assert g["gpu_gbps"] > 0 and g["gpu_fetch_gbps"] > 0
    assert hm.measure_cpu_overhead(gpu, moe, xh, yh, 2, 3, calls=1) > 0
    chosen = hm.choose_matmul(gpu, 2, 3, rng, calls=1)
    assert chosen["used"] in ("loop", "grouped") and gpu.matmul == chosen["used"]


@needs_torch
def test_gpu_run_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "run.json"
    affinity = os.sched_getaffinity(0)  # the run pins this thread off moejit's workers
    try:
        rc = hm.main(["--device", "cpu", "--experts", "8", "--hidden", "128", "--intermediate", "128",
                      "--top-k", "2", "--tokens", "1,2", "--miss-rates", "0.25,0.75", "--iters", "2",
                      "--warmup", "0", "--threads", "1", "--evict-experts", "4", "--out", str(out)])
    finally:
        os.sched_setaffinity(0, affinity)
    assert rc == 0
    table = capsys.readouterr().out.strip().splitlines()
    assert len(table) == 2 + 4 and table[0].startswith("| tokens | miss % |")
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == 4 and len(doc["checks"]) == 12
    assert all(c["max_rel_err"] <= 2e-2 for c in doc["checks"])
    for t in ("1", "2"):
        inp = doc["inputs"]["per_tokens"][t]
        for k in ("cpu_gbps", "gpu_gbps", "gpu_fetch_gbps", "cpu_overhead_s"):
            assert inp[k] > 0, k
        assert inp["gpu_call_s"] >= 0 and inp["fetch_chunk_bytes"] == 8 * hm.expert_bytes(128, 128)
        assert inp["gpu_resident_one_s"] > 0 and inp["gpu_fetched_one_s"] > 0
    host = doc["inputs"]["host_reads_at_once"]
    assert host["cpu_gbps"] > 0 and host["dma_gbps"] > 0 and host["dram_gbps"] > 0
    for r in doc["rows"]:
        assert set(r["measured_ms"]) == {"fetch", "cpu", "hybrid", "split", "gpu_resident"}
        assert r["measured_ms"]["split"] == r["measured_ms"][hm.PICK_WAY[r["pick_run"]]]
        assert set(r["model_error"]) == set(r["measured_ms"])
        assert set(r["samples_ms"]) == {"fetch", "cpu", "hybrid", "gpu_resident"}
        assert all(len(v) == 2 for v in r["samples_ms"].values())
        assert r["model_right"] == hm.model_right(r["measured_ms"], r["pick_run"])
        m = r["model"]
        inputs = doc["inputs"]["per_tokens"][str(r["tokens"])]
        assert m == pytest.approx(hm.predict(r["missed_experts"], r["resident_experts"],
                                             doc["geometry"]["expert_bytes"], inputs, doc["inputs"]["pcie_gbs"]))
    # A run with the one-expert times replays from its own inputs.
    replayed = hm.replay(doc)
    assert len(replayed) == 4 and all(r["inputs"]["source"] == "the run's inputs" for r in replayed)
