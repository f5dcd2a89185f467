#include "bench_model.h"

#include <algorithm>
#include <cmath>

namespace moejit_bench {

namespace {

double seconds(double bytes, double gbps) {
  if (bytes <= 0) return 0;
  return gbps > 0 ? bytes / (gbps * 1e9) : INFINITY;
}

}  // namespace

BackendModel model_backends(double missing_bytes, double resident_bytes, const ModelInputs& in,
                            double hybrid_margin) {
  BackendModel m;
  m.missing_bytes = std::max(0.0, missing_bytes);
  m.resident_bytes = std::max(0.0, resident_bytes);
  m.gpu_resident_s = seconds(m.resident_bytes, in.gpu_gbps);
  if (m.missing_bytes <= 0) {  // the layer is the GPU's resident compute
    m.cpu_s = m.pcie_s = m.hybrid_ideal_s = m.hybrid_s = m.best_s = m.gpu_resident_s;
    m.best = "none";
    return m;
  }
  const double a = m.gpu_resident_s, o = in.cpu_overhead_s;
  const double c = m.cpu_compute_s = seconds(m.missing_bytes, in.cpu_gbps);
  const double p = m.fetch_s = seconds(m.missing_bytes, in.pcie_gbs);
  const double b = m.gpu_fetched_s = seconds(m.missing_bytes, in.gpu_fetch_gbps);
  m.cpu_s = std::max(a, o + c);
  m.pcie_s = std::max(a, p) + b;
  if (std::isfinite(c)) {
    // The CPU side o + f c rises with f; the GPU side max(a + (1-f) b, (1-f)(p + b)) falls. The
    // balance is where the CPU side meets the later of the two GPU pieces.
    const auto meet = [&](double at0, double slope) {  // o + f c = at0 - f slope, slope = at0 - at1
      const double den = c + slope;
      return den > 0 ? (at0 - o) / den : 1.0;
    };
    const double f =
        std::isfinite(p + b) ? std::clamp(std::max(meet(a + b, b), meet(p + b, p + b)), 0.0, 1.0) : 1.0;
    m.cpu_fraction = f;
    m.hybrid_ideal_s = std::max(o + f * c, std::max(a, (1 - f) * p) + (1 - f) * b);
  } else {
    m.cpu_fraction = 0;
    m.hybrid_ideal_s = m.pcie_s;
  }
  // CPU and DMA read the same DRAM. Its capacity is at least what the CPU threads pulled and what
  // PCIe alone moves; taking the larger as the capacity means: a CPU that already saturates DRAM
  // gains nothing from adding DMA, one that does not (few threads, compute-bound) does.
  m.dram_capacity_gbps = std::max(in.dram_gbps, in.pcie_gbs);
  m.dram_floor_s = seconds(m.missing_bytes, m.dram_capacity_gbps);
  m.hybrid_s = std::max(m.hybrid_ideal_s, m.dram_floor_s);
  const double single = std::min(m.cpu_s, m.pcie_s);
  m.best = m.cpu_s <= m.pcie_s ? "cpu" : "pcie";
  m.best_s = single;
  if (m.hybrid_s < single * (1.0 - hybrid_margin)) m.best = "hybrid", m.best_s = m.hybrid_s;
  return m;
}

}  // namespace moejit_bench
