#include "bench_model.h"

#include <algorithm>
#include <cmath>

namespace moejit_bench {

namespace {

double seconds(double bytes, double gbps) {
  if (bytes <= 0) return 0;
  return gbps > 0 ? bytes / (gbps * 1e9) : INFINITY;
}

// The GPU side with a share g of the missing bytes fetched (bench_model.h): P, p1 the copy times
// of all of M and of one chunk at the rate in use.
double gpu_side(const BackendModel& m, double call, double g, double P, double p1) {
  if (g <= 0) return m.gpu_resident_s;
  const double a = m.gpu_resident_s, B = m.gpu_fetched_s, b1 = m.chunk_gpu_fetched_s;
  return call + std::max({a + g * B, std::min(g * P, p1) + g * B, g * P + std::min(g * B, b1)});
}

}  // namespace

BackendModel model_backends(double missing_bytes, double resident_bytes, const ModelInputs& in,
                            double hybrid_margin) {
  BackendModel m;
  m.missing_bytes = std::max(0.0, missing_bytes);
  m.resident_bytes = std::max(0.0, resident_bytes);
  const double call = std::max(0.0, in.gpu_call_s), o = in.cpu_overhead_s;
  m.gpu_resident_s = m.resident_bytes > 0 ? call + seconds(m.resident_bytes, in.gpu_gbps) : 0;
  if (m.missing_bytes <= 0) {  // the layer is the GPU's resident compute
    m.cpu_s = m.pcie_s = m.hybrid_ideal_s = m.hybrid_s = m.best_s = m.gpu_resident_s;
    m.best = "none";
    return m;
  }
  const double a = m.gpu_resident_s;
  const double c = m.cpu_compute_s = seconds(m.missing_bytes, in.cpu_gbps);
  const double P = m.fetch_s = seconds(m.missing_bytes, in.pcie_gbs);
  const double B = m.gpu_fetched_s = seconds(m.missing_bytes, in.gpu_fetch_gbps);
  const bool chunked = in.fetch_chunk_bytes > 0;
  const double p1 = m.chunk_fetch_s = chunked ? seconds(in.fetch_chunk_bytes, in.pcie_gbs) : INFINITY;
  const double b1 = m.chunk_gpu_fetched_s =
      chunked ? seconds(in.fetch_chunk_bytes, in.gpu_fetch_gbps) : INFINITY;
  m.cpu_s = o + std::max(a, c);
  m.pcie_s = gpu_side(m, call, 1.0, P, p1);
  // CPU and DMA read the same DRAM. Its capacity is at least what the CPU threads pulled and what
  // PCIe alone moves; when both together would pull more, each gets its share of it.
  m.dram_capacity_gbps = std::max({in.dram_gbps, in.cpu_gbps, in.pcie_gbs});
  const double sum = in.cpu_gbps + in.pcie_gbs;
  m.shared_rate = sum > m.dram_capacity_gbps ? m.dram_capacity_gbps / sum : 1.0;
  const double k = m.shared_rate;
  if (std::isfinite(c) && std::isfinite(P + B)) {
    // The CPU side f c' rises with f; the GPU side G(1-f) is the largest of three terms, each the
    // smaller of two lines that fall with f (or one line). The balance is where the CPU side meets
    // that largest term: the largest of the terms' meeting points, each the smaller of its lines'.
    const double cs = c / k, Ps = P / k, p1s = p1 / k;
    const auto meet = [&](double at0, double slope) {  // f cs = at0 - f slope
      const double den = cs + slope;
      return den > 0 ? at0 / den : 1.0;
    };
    const double resident = meet(call + a + B, B);
    const double first = std::min(meet(call + Ps + B, Ps + B), meet(call + p1s + B, B));
    const double last = std::min(meet(call + Ps + B, Ps + B), meet(call + Ps + b1, Ps));
    const double f = std::clamp(std::max({resident, first, last}), 0.0, 1.0);
    m.cpu_fraction = f;
    if (f >= 1)
      m.hybrid_ideal_s = m.cpu_s;
    else if (f <= 0)
      m.hybrid_ideal_s = m.pcie_s;
    else
      m.hybrid_ideal_s = o + std::max(f * cs, gpu_side(m, call, 1 - f, Ps, p1s));
  } else if (std::isfinite(c)) {  // nothing can be fetched
    m.cpu_fraction = 1;
    m.hybrid_ideal_s = m.cpu_s;
  } else {
    m.cpu_fraction = 0;
    m.hybrid_ideal_s = m.pcie_s;
  }
  // The shares keep the two sides' bytes within the capacity: the floor holds by construction,
  // kept as a guard.
  m.dram_floor_s = seconds(m.missing_bytes, m.dram_capacity_gbps);
  m.hybrid_s = std::max(m.hybrid_ideal_s, m.dram_floor_s);
  const double single = std::min(m.cpu_s, m.pcie_s);
  m.best = m.cpu_s <= m.pcie_s ? "cpu" : "pcie";
  m.best_s = single;
  if (m.hybrid_s < single * (1.0 - hybrid_margin)) m.best = "hybrid", m.best_s = m.hybrid_s;
  return m;
}

}  // namespace moejit_bench
