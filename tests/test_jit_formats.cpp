// Every format of the format table on every generated code path (kVariants),
// one body for all: its K values, groups, scale dtypes and per-row globals come
// from the format's table row; each kernel is checked against the float64
// reference of kernel_reference.h, and each token's bits must not depend on
// the tokens beside it in a call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "jit/kernel_cache.h"
#include "jit_test_util.h"
#include "kernel_reference.h"

namespace {

using namespace jit_test;

struct FormatTier {
  Format f;
  Variant v;
  int seed;
};

std::string name_of(const FormatTier& p) { return std::string(fmt::info(p.f).name) + "_" + p.v.name; }
// What gtest prints for a parameter (CTest's listing too): the name, not the bytes.
void PrintTo(const FormatTier& p, std::ostream* os) { *os << name_of(p); }

std::vector<FormatTier> all_pairs() {
  std::vector<FormatTier> out;
  for (int32_t id = 0; id <= fmt::kMaxFormatId; ++id)
    for (const Variant& v : kVariants) out.push_back({Format(id), v, int(out.size())});
  return out;
}

// The groups a matrix of the format may have: those the descriptor may pick, else the fixed one.
std::vector<int> groups_of(const fmt::FormatInfo& fi) {
  std::vector<int> g;
  for (int n = 0; n < 32; ++n)
    if ((fi.api_groups >> n) & 1u) g.push_back(1 << n);
  if (g.empty()) g.push_back(fi.group);
  return g;
}

std::vector<ScaleDtype> scale_dtypes_of(const fmt::FormatInfo& fi) {
  if (fi.scale_code == fmt::ScaleCode::bf16_f32) return {ScaleDtype::bf16, ScaleDtype::f32};
  return {ScaleDtype::bf16};
}

// K values the format's rule allows: for any K, every tail of a vector and of
// a 128-block around them; else multiples of the group: one to three groups,
// 8 and 9, and around 2880 (gpt-oss's hidden size).
std::vector<int> k_values(Format f, int group) {
  const fmt::FormatInfo& fi = fmt::info(f);
  std::vector<int> ks;
  if (fi.any_k) {
    ks = {1, 5, 17, 31, 33, 63, 64, 65, 127, 128, 129, 200, 384, 1000};
  } else {
    const int g = group;
    ks = {g, 2 * g, 3 * g, 8 * g, 9 * g, 2880 / g * g, 2880 / g * g + g};
  }
  std::vector<int> out;
  for (int k : ks) {
    const char* why = nullptr;
    if (fmt::k_is_valid(f, group, k, &why) && std::find(out.begin(), out.end(), k) == out.end())
      out.push_back(k);
  }
  return out;
}

// Why the pair checked nothing: the CPU lacks the tier (or the VBMI its decode
// needs), or the tier runs another tier's kernels for the format.
std::string pair_skip(const Variant& v, Format f) {
  const Format kf = fmt::kernel_format(f);
  const jit::Isa runs = jit::kernel_isa(v.isa, kf, fmt::default_group(kf, 0), v.flags);
  if (jit::isa_available(v.isa) && v.isa == jit::Isa::avx512_amx &&
      !jit::has_tile_kernels(kf, fmt::default_group(kf, 0), v.flags))
    return std::string(v.name) + " has no kernels of its own for " + fmt::info(f).name + ": it runs the " +
           jit::isa_name(runs) + " kernels (docs/FORMATS.md)";
  if (jit::isa_available(v.isa))
    return std::string("this CPU lacks AVX512_VBMI for the ") + v.name + " decode";
  return skip_message(v);
}

// The key the runtime builds for such a matrix (runtime/plan.cpp).
jit::KernelKey key_of(const Variant& v, const Bank& b, int rows, int tokens) {
  const fmt::FormatInfo& fi = fmt::info(b.layout.format);
  jit::KernelKey key;
  key.format = fmt::kernel_format(b.layout.format);
  key.k = int32_t(b.layout.k);
  key.rows = rows;
  key.tokens = tokens;
  key.scale_stride = fi.stride_in_kernel ? b.layout.scale_stride : 0;
  key.scale_dtype = fi.scale_code == fmt::ScaleCode::bf16_f32 ? int32_t(b.layout.scale_dtype) : 0;
  key.group = fi.scales == fmt::ScaleKind::none ? 0 : b.layout.group;
  key.isa = v.isa;
  key.flags = v.flags;
  return key;
}

class Kernels : public ::testing::TestWithParam<FormatTier> {
 protected:
  // Every token count in `tokens` on one random bank: the kernel of the most
  // tokens against float64, every other kernel's tokens (the one-token
  // kernel's: each token alone) with its bits (a token's bits must not depend
  // on the tokens beside it), so every output of every kernel is checked
  // against float64.
  void check_bank(const Variant& v, const Bank& b, std::vector<int> tokens, moejit_test::Rng& rng) {
    const int64_t k = b.layout.k, rows = b.layout.rows;
    std::sort(tokens.rbegin(), tokens.rend());
    const int most = tokens[0];
    const Reference ref = reference_of(b);
    const std::vector<float> x = activations(ref, k * most, rng);
    std::vector<float> all;  // the outputs of the kernel of `most` tokens
    for (int m : tokens) {
      const jit::KernelKey key = key_of(v, b, int(rows), m);
      std::string err;
      auto kern = jit::global_cache().get(key, &err);
      ASSERT_TRUE(kern) << key.name() << ": " << err;
      ASSERT_EQ(kern->key().isa, v.isa) << key.name();
      ++checked_;
      if (m == 1 && most > 1) {  // every token alone
        for (int64_t t = 0; t < most; ++t) {
          const std::vector<float> xt(x.begin() + t * k, x.begin() + (t + 1) * k);
          const std::vector<float> y = run_kernel(*kern, b, xt);
          for (int64_t r = 0; r < rows; ++r)
            if (std::memcmp(&y[size_t(r)], &all[size_t(t * rows + r)], sizeof(float)) != 0) {
              ASSERT_TRUE(matches(ref, r, xt.data(), y[size_t(r)]))
                  << key.name() << " token " << t << " row " << r;
              FAIL() << key.name() << " token " << t << " row " << r << " alone: " << y[size_t(r)]
                     << ", with " << most << " tokens " << all[size_t(t * rows + r)]
                     << ": a token's bits depend on the tokens beside it";
            }
        }
        continue;
      }
      const std::vector<float> y = run_kernel(*kern, b, x);
      if (m == most) {
        for (int64_t t = 0; t < m; ++t)
          for (int64_t r = 0; r < rows; ++r)
            ASSERT_TRUE(matches(ref, r, &x[size_t(t * k)], y[size_t(t * rows + r)]))
                << key.name() << " token " << t << " row " << r;
        all = y;
        continue;
      }
      for (size_t i = 0; i < y.size(); ++i)
        if (std::memcmp(&y[i], &all[i], sizeof(float)) != 0) {
          const int64_t t = int64_t(i) / rows, r = int64_t(i) % rows;
          ASSERT_TRUE(matches(ref, r, &x[size_t(t * k)], y[i]))
              << key.name() << " token " << t << " row " << r;
          FAIL() << key.name() << " token " << t << " row " << r << ": " << y[i] << ", with " << most
                 << " tokens " << all[i] << ": a token's bits depend on the tokens beside it";
        }
    }
  }
  int checked_ = 0;
};

TEST_P(Kernels, MatchFloat64Reference) {
  const Format f = GetParam().f;
  const Variant v = GetParam().v;
  const fmt::FormatInfo& fi = fmt::info(f);
  const Format kf = fmt::kernel_format(f);  // ds_fp4: mxfp4's kernels on its bytes
  if (!variant_available(v, kf)) GTEST_SKIP() << pair_skip(v, f);
  moejit_test::Rng rng(uint64_t(1000 + GetParam().seed));
  // GGUF rows lie at any byte of a mapped file.
  const bool inline_scales =
      fi.scales == fmt::ScaleKind::inline_fp16 || fi.scales == fmt::ScaleKind::inline_super;
  const size_t offset = inline_scales ? 1 : 0;
  for (int group : groups_of(fi)) {
    if (v.isa == jit::Isa::avx512_amx && !jit::has_tile_kernels(kf, group, v.flags)) continue;
    for (ScaleDtype sdt : scale_dtypes_of(fi)) {
      for (int k : k_values(f, group))
        for (int rows : {1, 3, 5, 7, 8, 13, 16, 17}) {
          const Bank b = make_bank(f, sdt, rows, k, rng, group, offset);
          const int most = jit::max_tokens_per_call(key_of(v, b, rows, 1));
          ASSERT_GE(most, 1) << key_of(v, b, rows, 1).name();
          // Every token count at row counts below, at and past a row block;
          // the small and the largest elsewhere.
          const bool all = rows == 1 || rows == 3 || rows == 5 || rows == 16;
          std::vector<int> tokens;
          for (int m = 1; m <= most; ++m)
            if (all || m <= 5 || m == most) tokens.push_back(m);
          check_bank(v, b, tokens, rng);
          if (HasFatalFailure()) return;
        }
      // Long rows (nvfp4's widened scales of a row take 2 KiB) and row counts
      // that leave a partial batch of rows whose scales are widened together.
      const char* why = nullptr;
      if (fmt::k_is_valid(f, group, 8192, &why))
        for (int rows : {9, 20}) {
          const Bank b = make_bank(f, sdt, rows, 8192, rng, group, offset);
          check_bank(v, b, {1, 2}, rng);
          if (HasFatalFailure()) return;
        }
    }
  }
  if (checked_ == 0) GTEST_SKIP() << pair_skip(v, f);
}

INSTANTIATE_TEST_SUITE_P(FormatTier, Kernels, ::testing::ValuesIn(all_pairs()),
                         [](const auto& info) { return name_of(info.param); });

// kFlagNearL1 (Intel's AVX-512 row kernels, jit/gemv.h) changes which line the
// near prefetch takes and into which cache, never what a kernel computes: every
// format's kernels with the flags Intel's runtime gives them (bf16 pairs,
// fp32 lanes, the line prefetch), with and without it, give the same bits and
// are different code, for one token and several.
TEST(NearL1Prefetch, SameBitsDifferentCode) {
  jit::CpuFeatures intel = jit::host_features();
  intel.intel = true;
  moejit_test::Rng rng(31);
  int checked = 0;
  for (jit::Isa isa : {jit::Isa::avx512, jit::Isa::avx512_bf16}) {
    if (!jit::isa_available(isa)) continue;
    for (int32_t id = 0; id <= fmt::kMaxFormatId; ++id) {
      const Format f = Format(id);
      const fmt::FormatInfo& fi = fmt::info(f);
      const int group = groups_of(fi).back();
      const uint32_t flags = jit::runtime_flags(isa, fmt::kernel_format(f), group, intel);
      ASSERT_NE(flags & jit::kFlagNearL1, 0u) << fi.name << " on " << jit::isa_name(isa);
      const Variant with{isa, flags, ""}, without{isa, flags & ~jit::kFlagNearL1, ""};
      const int k = k_values(f, group).back();
      const Bank b = make_bank(f, scale_dtypes_of(fi).front(), 17, k, rng, group);
      for (int tokens : {1, 3}) {
        const jit::KernelKey kw = key_of(with, b, 17, tokens), ko = key_of(without, b, 17, tokens);
        std::string err;
        if (!jit::gemv_supported(ko, &err)) continue;  // a decode this CPU lacks (VBMI, GFNI)
        auto kern_w = jit::global_cache().get(kw, &err);
        ASSERT_TRUE(kern_w) << kw.name() << ": " << err;
        auto kern_o = jit::global_cache().get(ko, &err);
        ASSERT_TRUE(kern_o) << ko.name() << ": " << err;
        const bool same_code = kern_w->code_size() == kern_o->code_size() &&
                               std::memcmp(kern_w->code(), kern_o->code(), kern_w->code_size()) == 0;
        EXPECT_FALSE(same_code) << kw.name() << " is the same code as " << ko.name();
        std::vector<float> x(size_t(k) * size_t(tokens));
        for (float& v : x) v = float(int(rng() % 255) - 127) / 64.0f;  // exact in bf16
        const std::vector<float> yw = run_kernel(*kern_w, b, x), yo = run_kernel(*kern_o, b, x);
        ASSERT_EQ(yw.size(), yo.size());
        EXPECT_EQ(std::memcmp(yw.data(), yo.data(), yw.size() * 4), 0) << kw.name();
        ++checked;
      }
    }
  }
  if (checked == 0) GTEST_SKIP() << "this CPU has no AVX-512 tier";
}

}  // namespace
