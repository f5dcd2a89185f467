// The tier table: every ISA tier's name (moejit_isa_name and the MOEJIT_MAX_ISA
// spelling), its kernel-name suffix and the CPU features it needs, in one place.
// Adding a tier is a row here plus its body or traits and its tests
// (docs/ARCHITECTURE.md, "Adding a tier"). Portable: no Xbyak, so the C API
// and the non-x86 build read it too.
#pragma once

#include <cstdint>
#include <string>

namespace moejit::jit {

// Same numbers as moejit_isa.
enum class Isa : int32_t { scalar = 1, avx2 = 2, avx512 = 3, avx512_bf16 = 4, avx512_amx = 5 };

// CPU features the tiers and decoders ask for (CPUID with OS support), one bit each.
enum Feature : uint32_t {
  kAvx2 = 1u << 0,
  kFma = 1u << 1,
  kF16c = 1u << 2,
  kAvx512f = 1u << 3,
  kAvx512bw = 1u << 4,
  kAvx512vl = 1u << 5,
  kAvx512dq = 1u << 6,
  kAvx512Vbmi = 1u << 7,
  kAvx512Bf16 = 1u << 8,
  kAmxBf16 = 1u << 9,
  kAmxTile = 1u << 10,
  kOsTileData = 1u << 11,  // the OS lets this process use AMX tile data (asked once, jit/cpu.cpp)
  kGfni = 1u << 12,        // GF2P8AFFINEQB (the q3_K, q4_K and q5_K bf16-pair decodes)
};
constexpr int kFeatureCount = 13;
// The name of feature bit i (0..kFeatureCount - 1), as moejit-info prints it.
const char* feature_name(int bit);

struct TierInfo {
  Isa isa;
  const char* name;      // moejit_isa_name(); MOEJIT_MAX_ISA accepts it case-insensitively
  const char* key_name;  // in kernel names (KernelKey::name), e.g. avx512bf16
  uint32_t features;     // Feature bits the tier needs
  const char* needs;     // those features in words
  Isa vector_isa;        // the row-streaming kernels it runs for formats without kernels of its own
};

// Tiers from the lowest (scalar) to the highest.
constexpr int kTierCount = 5;
const TierInfo& tier(int i);
// The row of a tier id; nullptr for ids outside the table (auto included).
const TierInfo* tier_info(Isa isa);
// The tier named `name` (case-insensitive); nullptr if none.
const TierInfo* tier_from_name(const char* name);
// "scalar, avx2, avx512, avx512_bf16, avx512_amx": the names, for messages.
std::string tier_names();
// The vector tier of `tier`: the tier itself, or the tier whose kernels it runs
// for the formats it has no kernels of its own for (avx512_amx: avx512_bf16).
// Which formats those are is the decoders' choice: jit::kernel_isa(tier,
// format, group, flags) in jit/gemv.h.
Isa kernel_isa(Isa tier);

}  // namespace moejit::jit
