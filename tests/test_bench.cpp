// moejit-bench's measurement rules (tools/bench_layer.h, tools/bench_util.h), independent of the
// host: the cold pool is at least 4x a given L3 for every preset and format, Layer::place gives
// every slot a reuse distance of the whole pool, and every read variant of the probe reads
// exactly the bytes its GB/s counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "bench_layer.h"
#include "bench_util.h"

namespace {

using namespace moejit_bench;

constexpr int64_t kMiB = int64_t(1) << 20;

TEST(ColdPool, AtLeastFourTimesTheL3ForEveryPresetAndFormat) {
  // This CI VM (32 MiB), the Intel Xeon of issue 15 (300 MiB), a 480 MiB VM, an odd size, none.
  for (const int64_t l3 : {32 * kMiB, 300 * kMiB, 480 * kMiB, 1000 * kMiB + 12345, int64_t(0)}) {
    for (const Preset& p : presets()) {
      for (FormatChoice f : all_formats()) {
        if (!check_geometry(f, p.geometry).empty()) continue;
        SCOPED_TRACE(std::string(p.name) + " " + format_label(f) + " L3 " + std::to_string(l3));
        const int64_t per_slot = expert_bytes(f, p.geometry);
        const int32_t slots = cold_pool_slots(f, p.geometry, l3);
        EXPECT_GE(slots, p.geometry.experts);
        EXPECT_GE(int64_t(slots) * per_slot, int64_t(kPoolL3Multiple) * l3);
        // The fewest such slots: one fewer would be under 4x (or under the model's experts).
        if (slots > p.geometry.experts) {
          EXPECT_LT(int64_t(slots - 1) * per_slot, int64_t(kPoolL3Multiple) * l3);
        }
      }
    }
  }
}

TEST(ColdPool, TheQwenLayerThatFitTheXeonL3GetsMoreSlots) {
  // Issue 15: the 300 MiB L3 held a whole Qwen3-30B-A3B layer (fp8_block: 0.6 GB).
  const Preset& qwen = presets().front();
  ASSERT_STREQ(qwen.name, "qwen3-30b-a3b");
  const int32_t slots = cold_pool_slots(MOEJIT_FORMAT_FP8_BLOCK, qwen.geometry, 300 * kMiB);
  EXPECT_GT(slots, 2 * qwen.geometry.experts);
  // DeepSeek-V3 (11 GB of fp8_block) is already far above 4x: its own experts.
  const auto ds = std::find_if(presets().begin(), presets().end(),
                               [](const Preset& p) { return std::string(p.name) == "deepseek-v3"; });
  ASSERT_NE(ds, presets().end());
  EXPECT_EQ(cold_pool_slots(MOEJIT_FORMAT_FP8_BLOCK, ds->geometry, 300 * kMiB), ds->geometry.experts);
}

Geometry tiny() {
  Geometry g;
  g.hidden = 64, g.intermediate = 32, g.experts = 16, g.top_k = 4;
  return g;
}

TEST(ColdPool, LayerHasOneDescriptorPerSlotOverDistinctMemory) {
  const Geometry g = tiny();
  const Layer layer(MOEJIT_FORMAT_BF16, g, 7, 0, 40);
  EXPECT_EQ(layer.slots(), 40);
  EXPECT_EQ(layer.desc(4).num_experts, 40);
  EXPECT_EQ(layer.total_bytes(), 40 * expert_bytes(MOEJIT_FORMAT_BF16, g));
  std::set<const void*> seen;
  for (int32_t s = 0; s < layer.slots(); ++s) seen.insert(layer.gate_up(s).data);
  EXPECT_EQ(seen.size(), 40u);
  // --hot: every slot over one expert's memory; fewer slots than experts are raised to the experts.
  const Layer hot(MOEJIT_FORMAT_BF16, g, 7, 1, 40);
  EXPECT_EQ(hot.total_bytes(), expert_bytes(MOEJIT_FORMAT_BF16, g));
  EXPECT_EQ(hot.gate_up(0).data, hot.gate_up(39).data);
  EXPECT_EQ(Layer(MOEJIT_FORMAT_BF16, g, 7, 0, 3).slots(), g.experts);
}

// The q4_K_M mix (gate and up q4_K, down q6_K) is taken wherever a format is:
// its name, its bytes per projection, separate banks unless --layout fused,
// and a descriptor with up's and down's formats.
TEST(Formats, TheQ4KMMix) {
  FormatChoice f;
  ASSERT_TRUE(parse_format("q4_K_M", &f));
  EXPECT_TRUE(is_mix(f));
  EXPECT_STREQ(format_label(f), "q4_K_M");
  EXPECT_NE(std::find(all_formats().begin(), all_formats().end(), f), all_formats().end());
  ASSERT_TRUE(parse_format("q6_K", &f));
  EXPECT_EQ(f, MOEJIT_FORMAT_Q6_K);
  EXPECT_FALSE(is_mix(f));
  const Geometry qwen = presets().front().geometry;  // H 2048, I 768
  const int64_t H = qwen.hidden, I = qwen.intermediate;
  EXPECT_EQ(expert_bytes(kMixQ4KM, qwen), 2 * I * (H / 256) * 144 + H * (I / 256) * 210);
  EXPECT_EQ(check_geometry(kMixQ4KM, qwen), "");
  Geometry odd = qwen;
  odd.intermediate = 640;
  EXPECT_NE(check_geometry(kMixQ4KM, odd).find("(q6_K)"), std::string::npos) << check_geometry(kMixQ4KM, odd);
  Geometry g = tiny();
  g.hidden = 512, g.intermediate = 256;
  EXPECT_FALSE(g.separate);
  const Layer layer(kMixQ4KM, g, 3, 0, 16);
  EXPECT_TRUE(layer.geometry().separate);
  const moejit_moe_desc d = layer.desc(4);
  EXPECT_EQ(d.format, MOEJIT_FORMAT_Q4_K);
  EXPECT_TRUE(d.gate_up == nullptr && d.gate && d.up);
  ASSERT_TRUE(d.up_format && d.down_format);
  EXPECT_EQ(d.up_format->format, MOEJIT_FORMAT_Q4_K);
  EXPECT_EQ(d.down_format->format, MOEJIT_FORMAT_Q6_K);
  g.fused_given = true;
  const Layer fused(kMixQ4KM, g, 3, 0, 16);
  EXPECT_FALSE(fused.geometry().separate);
  EXPECT_TRUE(fused.desc(4).gate_up && !fused.desc(4).up_format && fused.desc(4).down_format);
  EXPECT_EQ(expert_bytes(kMixQ4KM, g), 2 * 256 * 2 * 144 + 512 * 210);
}

TEST(ColdPool, PlaceReusesASlotOnlyAfterTheWholePool) {
  const Geometry g = tiny();
  for (const RoutingKind kind : {RoutingKind::uniform, RoutingKind::skewed, RoutingKind::same}) {
    for (const int32_t slots : {16, 23, 40}) {
      SCOPED_TRACE(std::string(routing_label(kind)) + " slots " + std::to_string(slots));
      const Layer layer(MOEJIT_FORMAT_BF16, g, 3, 1, slots);
      const Routing routing = make_routing(3, g.top_k, g.experts, 11, kind);
      const int64_t routes = int64_t(routing.tokens) * routing.top_k;
      std::vector<int32_t> out(static_cast<size_t>(routes));
      std::map<int32_t, int64_t> last;  // slot -> position of its last placement
      int64_t position = 0;
      for (int64_t call = 0; call < 3 * routing.pool; ++call) {
        const int32_t* ids = routing.ids_of(call);
        layer.place(ids, routes, out.data());
        std::map<int32_t, int32_t> slot_of;  // the call's expert -> slot: a bijection
        std::set<int32_t> slots_used;
        for (int64_t r = 0; r < routes; ++r) {
          ASSERT_GE(out[size_t(r)], 0);
          ASSERT_LT(out[size_t(r)], slots);
          const auto [it, fresh] = slot_of.emplace(ids[r], out[size_t(r)]);
          ASSERT_EQ(it->second, out[size_t(r)]) << "one expert, two slots in a call";
          if (!fresh) continue;
          ASSERT_TRUE(slots_used.insert(out[size_t(r)]).second) << "two experts, one slot in a call";
          if (last.count(out[size_t(r)])) {
            ASSERT_EQ(position - last[out[size_t(r)]], slots);
          }
          last[out[size_t(r)]] = position++;
        }
        ASSERT_EQ(int32_t(slot_of.size()), routing.distinct_of(call));
      }
      EXPECT_EQ(int32_t(last.size()), slots);  // every slot in use
    }
  }
}

TEST(ColdPool, PlacePassesMaskedRoutesThrough) {
  const Geometry g = tiny();
  const Layer layer(MOEJIT_FORMAT_BF16, g, 3, 1, 20);
  const int32_t ids[4] = {-1, 5, 5, -1};
  int32_t out[4];
  layer.place(ids, 4, out);
  EXPECT_EQ(out[0], -1);
  EXPECT_EQ(out[3], -1);
  EXPECT_EQ(out[1], out[2]);
}

TEST(ReadProbe, VariantNamesAreUniqueAndParseBack) {
  const std::vector<ReadVariant> all = all_read_variants();
  ASSERT_FALSE(all.empty());
  std::set<std::string> names;
  for (const ReadVariant& v : all) {
    EXPECT_TRUE(names.insert(v.name()).second) << v.name();
    ReadVariant parsed;
    ASSERT_TRUE(parse_read_variant(v.name(), &parsed)) << v.name();
    EXPECT_EQ(parsed, v);
  }
  const std::vector<ReadVariant> startup = startup_read_variants();
  ASSERT_FALSE(startup.empty());
  EXPECT_EQ(startup.front(), kPlainRead);
  EXPECT_EQ(kPlainRead.name(), "avx2 x1");
  for (const ReadVariant& v : startup)
    EXPECT_NE(std::find(all.begin(), all.end(), v), all.end()) << v.name() << " is not in --probe's list";
  ReadVariant unused;
  EXPECT_FALSE(parse_read_variant("avx2 x3", &unused));
}

TEST(ReadProbe, EveryVariantReadsExactlyTheBytesItCounts) {
  // 64-bit words of 1: a pass's sum is the number of words it read.
  Buffer buffer(size_t(34) << 20);
  const uint64_t one = 1;
  for (size_t i = 0; i < buffer.size(); i += 8) std::memcpy(buffer.data() + i, &one, 8);
  for (const ReadVariant& v : all_read_variants()) {
    for (const int threads : {1, 3}) {
      SCOPED_TRACE(v.name() + ", " + std::to_string(threads) + " threads");
      const ReadCheck c = check_read_variant(buffer, threads, v);
      EXPECT_EQ(c.sum * 8, c.bytes);
      EXPECT_GE(c.bytes, buffer.size() * 9 / 10);  // the slices' rounding drops little
      EXPECT_LE(c.bytes, buffer.size());
    }
  }
  const std::vector<double> gbps = measure_read_variants(buffer, 2, 2, startup_read_variants());
  for (double g : gbps) EXPECT_GT(g, 0.0);
}

TEST(ReadProbe, HugePagesAreReportedWithinTheBuffer) {
  Buffer huge(size_t(8) << 20), small(size_t(8) << 20, false);
  std::memset(huge.data(), 1, huge.size());
  std::memset(small.data(), 1, small.size());
  const int64_t h = huge.huge_page_bytes(), s = small.huge_page_bytes();
  EXPECT_GE(h, -1);
  EXPECT_LE(h, int64_t(huge.size()));
  EXPECT_TRUE(s == 0 || s == -1) << s;  // MADV_NOHUGEPAGE
  EXPECT_EQ(Buffer().huge_page_bytes(), 0);
}

}  // namespace
