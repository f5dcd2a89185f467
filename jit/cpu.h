// Host CPU facts moejit cares about (CPUID + OS support, via Xbyak::util::Cpu).
#pragma once

#include <cstdint>

#include "jit/kernel_key.h"
#include "jit/tiers.h"

namespace moejit::jit {

struct CpuFeatures {
  uint32_t bits = 0;  // Feature bits (jit/tiers.h)
  bool has(uint32_t features) const { return (bits & features) == features; }
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512_bf16 = false;
  bool avx512_vbmi = false;
  bool gfni = false;
  bool intel = false;  // CPUID vendor GenuineIntel (runtime_flags: the vendor's choices)
  // AMX tile data: "granted", or why the avx512_amx tier is unavailable (no AMX-TILE, or the OS refused).
  const char* tile_data_note = "";
};

const CpuFeatures& host_features();
// Best tier this build can generate on this CPU (scalar when the JIT is unavailable).
Isa host_isa();
bool isa_available(Isa isa);

}  // namespace moejit::jit
