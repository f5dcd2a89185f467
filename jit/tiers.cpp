#include "jit/tiers.h"

#include <strings.h>

namespace moejit::jit {

namespace {

constexpr uint32_t kAvx2Tier = kAvx2 | kFma | kF16c;
constexpr uint32_t kAvx512Tier = kAvx2Tier | kAvx512f | kAvx512bw | kAvx512vl | kAvx512dq;

constexpr TierInfo kTiers[kTierCount] = {
    {Isa::scalar, "scalar", "scalar", 0, "nothing (portable C++)", Isa::scalar},
    {Isa::avx2, "avx2", "avx2", kAvx2Tier, "AVX2 + FMA + F16C", Isa::avx2},
    {Isa::avx512, "avx512", "avx512", kAvx512Tier, "AVX-512 F + BW + VL + DQ (and the avx2 features)",
     Isa::avx512},
    {Isa::avx512_bf16, "avx512_bf16", "avx512bf16", kAvx512Tier | kAvx512Bf16,
     "AVX512_BF16 (and the avx512 features)", Isa::avx512_bf16},
    {Isa::avx512_amx, "avx512_amx", "avx512amx",
     kAvx512Tier | kAvx512Bf16 | kAmxTile | kAmxBf16 | kOsTileData,
     "AMX-TILE + AMX-BF16 with the OS's permission for tile data (and the avx512_bf16 features)",
     Isa::avx512_bf16},
};

constexpr const char* kFeatureNames[kFeatureCount] = {
    "avx2",        "fma",         "f16c",     "avx512f",  "avx512bw",     "avx512vl", "avx512dq",
    "avx512_vbmi", "avx512_bf16", "amx_bf16", "amx_tile", "os_tile_data", "gfni"};

}  // namespace

const char* feature_name(int bit) { return bit >= 0 && bit < kFeatureCount ? kFeatureNames[bit] : "unknown"; }

const TierInfo& tier(int i) { return kTiers[i]; }

const TierInfo* tier_info(Isa isa) {
  for (const TierInfo& t : kTiers)
    if (t.isa == isa) return &t;
  return nullptr;
}

const TierInfo* tier_from_name(const char* name) {
  for (const TierInfo& t : kTiers)
    if (strcasecmp(name, t.name) == 0) return &t;
  return nullptr;
}

Isa kernel_isa(Isa tier) {
  const TierInfo* t = tier_info(tier);
  return t ? t->vector_isa : tier;
}

std::string tier_names() {
  std::string s;
  for (const TierInfo& t : kTiers) s += (s.empty() ? "" : ", ") + std::string(t.name);
  return s;
}

}  // namespace moejit::jit
