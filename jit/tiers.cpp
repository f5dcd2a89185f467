#include "jit/tiers.h"

#include <strings.h>

namespace moejit::jit {

namespace {

constexpr uint32_t kAvx2Tier = kAvx2 | kFma | kF16c;
constexpr uint32_t kAvx512Tier = kAvx2Tier | kAvx512f | kAvx512bw | kAvx512vl | kAvx512dq;

constexpr TierInfo kTiers[kTierCount] = {
    {Isa::scalar, "scalar", "scalar", 0, "nothing (portable C++)"},
    {Isa::avx2, "avx2", "avx2", kAvx2Tier, "AVX2 + FMA + F16C"},
    {Isa::avx512, "avx512", "avx512", kAvx512Tier, "AVX-512 F + BW + VL + DQ (and the avx2 features)"},
    {Isa::avx512_bf16, "avx512_bf16", "avx512bf16", kAvx512Tier | kAvx512Bf16,
     "AVX512_BF16 (and the avx512 features)"},
};

constexpr const char* kFeatureNames[kFeatureCount] = {"avx2",        "fma",      "f16c",     "avx512f",
                                                      "avx512bw",    "avx512vl", "avx512dq", "avx512_vbmi",
                                                      "avx512_bf16", "amx_bf16"};

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

std::string tier_names() {
  std::string s;
  for (const TierInfo& t : kTiers) s += (s.empty() ? "" : ", ") + std::string(t.name);
  return s;
}

}  // namespace moejit::jit
