// The tier table (jit/tiers.h) against the API's names and numbers, the CPU
// and the C API's parsing of MOEJIT_MAX_ISA.
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "jit/cpu.h"
#include "jit/tiers.h"
#include "moejit.h"

using namespace moejit;

namespace {

TEST(Tiers, RowsFollowTheApiIdsAndNames) {
  const char* names[] = {"scalar", "avx2", "avx512", "avx512_bf16", "avx512_amx"};
  ASSERT_EQ(jit::kTierCount, 5);
  for (int i = 0; i < jit::kTierCount; ++i) {
    const jit::TierInfo& t = jit::tier(i);
    EXPECT_EQ(int(t.isa), MOEJIT_ISA_SCALAR + i) << "rows in id order";
    EXPECT_STREQ(t.name, names[i]);
    EXPECT_STREQ(t.name, moejit_isa_name(moejit_isa(t.isa))) << "the C API names the tier from the table";
    EXPECT_EQ(jit::tier_info(t.isa), &t);
    EXPECT_EQ(jit::tier_from_name(t.name), &t);
    std::string upper = t.name;
    for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_EQ(jit::tier_from_name(upper.c_str()), &t) << "names are case-insensitive";
  }
  EXPECT_EQ(jit::tier_info(jit::Isa(0)), nullptr);
  EXPECT_EQ(jit::tier_info(jit::Isa(6)), nullptr);
  EXPECT_EQ(jit::tier_from_name("avx"), nullptr);
  EXPECT_EQ(jit::tier_from_name("avx512_bf16 "), nullptr);
  EXPECT_EQ(jit::tier_names(), "scalar, avx2, avx512, avx512_bf16, avx512_amx");
}

TEST(Tiers, EachTierNeedsTheFeaturesOfTheOneBelow) {
  for (int i = 1; i < jit::kTierCount; ++i) {
    const uint32_t below = jit::tier(i - 1).features, here = jit::tier(i).features;
    EXPECT_EQ(here & below, below) << jit::tier(i).name;
    EXPECT_NE(here, below) << jit::tier(i).name << " needs something more";
  }
  EXPECT_EQ(jit::tier(4).features & (jit::kAmxTile | jit::kAmxBf16 | jit::kOsTileData),
            jit::kAmxTile | jit::kAmxBf16 | jit::kOsTileData)
      << "avx512_amx needs the tile features and the OS's permission";
}

TEST(Tiers, KernelTierOfEachTier) {
  // avx512_amx's vector tier: the kernels it runs for the formats without a
  // tile decode (jit::kernel_isa(tier, format, ...), tests/test_jit_tiles.cpp).
  for (int i = 0; i < 4; ++i) EXPECT_EQ(jit::kernel_isa(jit::tier(i).isa), jit::tier(i).isa);
  EXPECT_EQ(jit::kernel_isa(jit::Isa::avx512_amx), jit::Isa::avx512_bf16);
}

TEST(Tiers, AvailabilityFollowsTheCpuAndTheOs) {
  __builtin_cpu_init();
  const bool avx2 =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  const bool amx = bf16 && __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
                   syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  EXPECT_TRUE(jit::isa_available(jit::Isa::scalar));
  EXPECT_EQ(jit::isa_available(jit::Isa::avx2), avx2);
  EXPECT_EQ(jit::isa_available(jit::Isa::avx512), avx512);
  EXPECT_EQ(jit::isa_available(jit::Isa::avx512_bf16), bf16);
  EXPECT_EQ(jit::isa_available(jit::Isa::avx512_amx), amx);
  EXPECT_EQ(jit::host_features().has(jit::kOsTileData),
            std::strcmp(jit::host_features().tile_data_note, "granted") == 0);
  if (!amx) std::printf("avx512_amx unavailable here: %s\n", jit::host_features().tile_data_note);
}

TEST(Tiers, AmxAboveTheHostIsUnsupportedWithTheReason) {
  if (jit::isa_available(jit::Isa::avx512_amx)) GTEST_SKIP() << "this host has avx512_amx";
  moejit_context_desc d{};
  d.struct_size = sizeof(d);
  d.num_threads = 1;
  d.max_isa = MOEJIT_ISA_AVX512_AMX;
  moejit_context* ctx = reinterpret_cast<moejit_context*>(&d);
  EXPECT_EQ(moejit_context_create(&d, &ctx), MOEJIT_UNSUPPORTED);
  EXPECT_EQ(ctx, nullptr);
  EXPECT_NE(std::string(moejit_last_error()).find(jit::host_features().tile_data_note), std::string::npos)
      << moejit_last_error();
}

}  // namespace
