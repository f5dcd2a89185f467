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
enum class Isa : int32_t { scalar = 1, avx2 = 2, avx512 = 3, avx512_bf16 = 4 };

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
};
constexpr int kFeatureCount = 10;
// The name of feature bit i (0..kFeatureCount - 1), as moejit-info prints it.
const char* feature_name(int bit);

struct TierInfo {
  Isa isa;
  const char* name;      // moejit_isa_name(); MOEJIT_MAX_ISA accepts it case-insensitively
  const char* key_name;  // in kernel names (KernelKey::name), e.g. avx512bf16
  uint32_t features;     // Feature bits the tier needs
  const char* needs;     // those features in words
};

// Tiers from the lowest (scalar) to the highest.
constexpr int kTierCount = 4;
const TierInfo& tier(int i);
// The row of a tier id; nullptr for ids outside the table (auto included).
const TierInfo* tier_info(Isa isa);
// The tier named `name` (case-insensitive); nullptr if none.
const TierInfo* tier_from_name(const char* name);
// "scalar, avx2, avx512, avx512_bf16": the names, for messages.
std::string tier_names();

}  // namespace moejit::jit
