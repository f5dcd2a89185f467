"""The CPU-only parts of examples/hybrid_moe.py: the backend model (against
moejit-bench --profile itself when CTest names the tool), the routing split, the
CPU path on a small layer against a float64 reference, and --plan-only."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import moejit
from moejit_ref import BF16, assert_close, moe_reference

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import hybrid_moe as hm  # noqa: E402

BENCH = os.environ.get("MOEJIT_BENCH_EXE")


def test_model_cases():
    none = hm.model_backends(0, 10, 25, 30)
    assert none["best"] == "none" and none["best_s"] == 0 and hm.cpu_share(none) == 0
    # CPU at 100 GB/s against PCIe at 25: the CPU wins; hybrid is held at the DRAM floor.
    m = hm.model_backends(1e9, 100, 25, 100)
    assert m["cpu_s"] == pytest.approx(0.01) and m["pcie_s"] == pytest.approx(0.04)
    assert m["cpu_fraction"] == pytest.approx(0.8) and m["hybrid_ideal_s"] == pytest.approx(0.008)
    assert m["dram_floor_s"] == pytest.approx(0.01) and m["hybrid_s"] == pytest.approx(0.01)
    assert m["best"] == "cpu" and hm.cpu_share(m) == 1.0
    # Equal backends with DRAM to spare: hybrid halves the time.
    h = hm.model_backends(1e9, 25, 25, 200)
    assert h["best"] == "hybrid" and h["best_s"] == pytest.approx(0.02) and hm.cpu_share(h) == pytest.approx(0.5)
    # Hybrid must beat the better single backend by more than 10%.
    close = hm.model_backends(1e9, 25, 25, 27.0)
    assert close["best"] in ("cpu", "pcie") and close["hybrid_s"] == pytest.approx(1 / 27.0)
    assert hm.model_backends(1e9, 10, 25, 25)["best"] == "pcie"  # DRAM no faster than PCIe: no gain
    assert hm.model_backends(1e9, 0, 25, 30)["cpu_s"] == float("inf")


@pytest.mark.skipif(not BENCH, reason="MOEJIT_BENCH_EXE (set by CTest) names no moejit-bench")
def test_model_matches_moejit_bench_profile(tmp_path):
    # The example's model is the tool's: recompute every entry of a real profile.
    prof = tmp_path / "prof.json"
    subprocess.run([BENCH, "--hidden", "256", "--intermediate", "128", "--experts", "32", "--top-k", "4",
                    "--format", "fp8_block,bf16", "--tokens", "1,4", "--threads", "1", "--min-time", "0.02",
                    "--repeat", "2", "--warmup", "1", "--profile", str(prof), "--pcie-gbs", "25", "--miss-rate",
                    "0.3"], check=True, capture_output=True)
    doc = json.loads(prof.read_text())
    assert doc["schema_version"] == 1 and doc["model_inputs"] == {"pcie_gbs": 25.0, "miss_rate": 0.3}
    assert len(doc["entries"]) == 4
    for e in doc["entries"]:
        b = e["backends"]
        per_token = 1.0 / e["tokens"]
        m = hm.model_backends(b["missing_bytes_per_call"], e["cpu_gbps"], 25.0, e["dram_gbps"])
        assert b["missing_experts_per_call"] == pytest.approx(0.3 * e["distinct_experts_per_call"])
        assert m["missing_bytes"] == pytest.approx(b["missing_experts_per_call"] * e["expert_bytes"])
        assert m["cpu_s"] * per_token == pytest.approx(b["cpu"]["time_per_token_s"], rel=1e-9)
        assert m["pcie_s"] * per_token == pytest.approx(b["pcie"]["time_per_token_s"], rel=1e-9)
        hyb = b["hybrid"]
        assert m["cpu_fraction"] == pytest.approx(hyb["cpu_fraction"], rel=1e-9)
        assert m["hybrid_s"] * per_token == pytest.approx(hyb["time_per_token_s"], rel=1e-9)
        assert m["hybrid_ideal_s"] * per_token == pytest.approx(hyb["ideal_time_per_token_s"], rel=1e-9)
        assert m["dram_floor_s"] * per_token == pytest.approx(hyb["dram_floor_per_token_s"], rel=1e-9)
        assert m["dram_capacity_gbps"] == pytest.approx(hyb["dram_capacity_gbps"], rel=1e-12)
        assert m["best"] == e["recommendation"]["backend"]
        assert m["best_s"] * per_token == pytest.approx(e["recommendation"]["time_per_token_s"], rel=1e-9)
    best = hm.load_profile(str(prof))
    assert sorted(best) == [1, 4] and all(v["format"] == "fp8_block" for v in best.values())
    # --plan-only reads the same profile and prints the model's table.
    out = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, hm.__file__, "--plan-only", "--profile", str(prof), "--pcie-gbs", "25",
                        "--tokens", "1,4", "--experts", "32", "--hidden", "256", "--intermediate", "128",
                        "--top-k", "4", "--out", str(out)], check=True, capture_output=True, text=True,
                       env=os.environ.copy())
    assert r.stdout.startswith("| tokens | miss % |") and len(r.stdout.strip().splitlines()) == 2 + 2 * 4
    plan = json.loads(out.read_text())
    assert len(plan["rows"]) == 8 and plan["inputs"]["pcie_gbs"] == 25


def test_load_profile_checks_schema(tmp_path):
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"schema_version": 2, "entries": []}))
    with pytest.raises(ValueError, match="schema_version 2"):
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
    p.write_text(json.dumps({"schema_version": 1, "entries": [
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
    assert row["model"]["best"] == "hybrid"
    with pytest.raises(SystemExit):
        hm.main(["--plan-only", "--pcie-gbs", "25"])  # no profile
    with pytest.raises(SystemExit):
        hm.main(["--plan-only", "--profile", str(p), "--pcie-gbs", "25", "--tokens", "2"])  # no entry for 2
    with pytest.raises(SystemExit):
        hm.main(["--experts", "2000", "--plan-only", "--profile", str(p), "--pcie-gbs", "25"])  # host memory


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
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(SystemExit, match="the GPU run needs torch"):
            hm.main(["--experts", "8"])
    else:
        pytest.skip("torch is installed")
