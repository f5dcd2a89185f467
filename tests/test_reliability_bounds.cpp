// No read outside the caller's buffers with minimal scale tensors
// (docs/RELIABILITY.md; FORMATS.md: scale row padding "is never read", so the
// last scale row of a tensor needs no padding and a dense tensor ends right
// after its last element). Every weight and scale buffer here is exactly as
// long as the descriptor says, and starts or ends at an inaccessible page.
// Generated code is not instrumented by ASan, so a read past the buffer shows
// up as SIGSEGV; each case runs in a child process (a gtest death test with
// the expected outcome "exit code 0"), so one faulting kernel names its case
// and the others still run.
//
// Regression cases found by fuzz_capi (tests/fuzz/corpus/capi/crash-*).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "moejit.h"
#include "test_util.h"

using namespace moejit_test;

namespace {

struct Shape {
  moejit_format fmt;
  moejit_dtype sdt;
  int rows, cols;
  int64_t stride;  // 0 = dense
};

int64_t scale_cols(const Shape& s) { return s.fmt == MOEJIT_FORMAT_FP8_BLOCK ? (s.cols + 127) / 128 : 0; }
int64_t scale_rows(const Shape& s) { return s.fmt == MOEJIT_FORMAT_FP8_BLOCK ? (s.rows + 127) / 128 : 0; }
size_t scale_elem(const Shape& s) { return s.sdt == MOEJIT_DTYPE_F32 ? 4 : 2; }

std::string name(const Shape& s, moejit_isa tier, bool data_at_end) {
  return std::string(moejit_isa_name(tier)) + " " + moejit_format_name(s.fmt) +
         (s.fmt == MOEJIT_FORMAT_FP8_BLOCK ? (s.sdt ? " f32 scales" : " bf16 scales") : "") + " [" +
         std::to_string(s.rows) + ", " + std::to_string(s.cols) + "] stride " + std::to_string(s.stride) +
         (data_at_end ? ", weights end at a guard page, scales start after one"
                      : ", weights start after a guard page, scales end at one");
}

// One linear layer [rows, cols] and one call of 2 tokens; exit 0 when it works,
// 3 when a call fails (the message on stderr).
[[noreturn]] void run_linear(const Shape& s, moejit_isa tier, bool data_at_end) {
  const int64_t cols = scale_cols(s), srows = scale_rows(s), stride = s.stride ? s.stride : cols;
  const size_t wbytes = size_t(s.rows) * size_t(s.cols) * (s.fmt == MOEJIT_FORMAT_BF16 ? 2 : 1);
  fuzz::Guarded w(wbytes, data_at_end);
  for (size_t i = 0; i < wbytes; ++i) w.data()[i] = uint8_t(i * 37 % 251 & 0x77);  // finite bf16 and e4m3
  fuzz::Guarded sc(srows ? size_t((srows - 1) * stride + cols) * scale_elem(s) : 0, !data_at_end);
  for (size_t i = 0; i + scale_elem(s) <= sc.size(); i += scale_elem(s)) {
    const float one = 1.0f;
    if (s.sdt == MOEJIT_DTYPE_F32)
      std::memcpy(sc.data() + i, &one, 4);
    else
      sc.data()[i] = 0x80, sc.data()[i + 1] = 0x3F;
  }
  moejit_context_desc cd = context_desc(tier, 2);
  moejit_context* ctx = nullptr;
  if (moejit_context_create(&cd, &ctx) != MOEJIT_OK) std::exit(4);
  moejit_linear_desc d;
  std::memset(&d, 0, sizeof(d));
  d.struct_size = sizeof(d);
  d.format = s.fmt;
  d.scale_dtype = s.sdt;
  d.rows = s.rows;
  d.cols = s.cols;
  d.max_tokens = 2;
  d.output_dtype = MOEJIT_DTYPE_F32;
  d.weight.data = w.data();
  d.weight.scales = srows ? sc.data() : nullptr;
  d.weight.scale_row_stride = s.stride;
  moejit_linear* l = nullptr;
  if (moejit_linear_create(ctx, &d, &l) != MOEJIT_OK) {
    std::fprintf(stderr, "create: %s\n", moejit_last_error());
    std::exit(3);
  }
  std::vector<uint16_t> x(size_t(2) * size_t(s.cols), 0x3F80);
  std::vector<float> y(size_t(2) * size_t(s.rows));
  if (moejit_linear_forward(l, 2, x.data(), y.data()) != MOEJIT_OK) {
    std::fprintf(stderr, "forward: %s\n", moejit_last_error());
    std::exit(3);
  }
  moejit_linear_destroy(l);
  moejit_context_destroy(ctx);
  std::exit(0);
}

// MoE layer whose experts use different scale strides: expert 0 padded
// (scale_row_stride = columns + 1), expert 1 dense (scale_row_stride = 0, its
// scale tensor ending at a guard page). api.md: "each expert may use its own
// stride", and 0 means dense. The same layer with expert 1's stride given
// explicitly as its column count must give the same bits. Exit 0 when it does,
// 5 when the bits differ, 3 when a call fails.
[[noreturn]] void run_moe_mixed_strides(moejit_isa tier, moejit_dtype sdt, int H, int I) {
  const int E = 2;
  const size_t es = sdt == MOEJIT_DTYPE_F32 ? 4 : 2;
  struct Mat {
    fuzz::Guarded w, s;
    int64_t stride = 0;
  };
  auto make = [&](int rows, int k, int64_t pad, bool dense) {
    Mat m;
    const int64_t cols = (k + 127) / 128, srows = (rows + 127) / 128;
    m.stride = dense ? 0 : cols + pad;
    const int64_t rs = dense ? cols : cols + pad;
    m.w.init(size_t(rows) * size_t(k), true);
    for (size_t i = 0; i < m.w.size(); ++i) m.w.data()[i] = uint8_t((i * 37 + size_t(k)) % 251 & 0x77);
    m.s.init(size_t((srows - 1) * rs + cols) * es, true);
    for (size_t i = 0; i + es <= m.s.size(); i += es) {
      const float v = float(1 + i / es % 3) * 0.5f;  // 0.5, 1, 1.5: the strides matter
      if (es == 4) {
        std::memcpy(m.s.data() + i, &v, 4);
      } else {
        uint32_t u;
        std::memcpy(&u, &v, 4);
        m.s.data()[i] = uint8_t(u >> 16), m.s.data()[i + 1] = uint8_t(u >> 24);
      }
    }
    return m;
  };
  std::vector<Mat> gu, dn;
  for (int e = 0; e < E; ++e) {
    gu.push_back(make(2 * I, H, 1, e == 1));
    dn.push_back(make(H, I, 1, e == 1));
  }
  moejit_context_desc cd = context_desc(tier, 1);
  moejit_context* ctx = nullptr;
  if (moejit_context_create(&cd, &ctx) != MOEJIT_OK) std::exit(4);
  auto run = [&](bool explicit_dense, std::vector<float>* y) {
    std::vector<moejit_matrix> g(E), d(E);
    for (int e = 0; e < E; ++e) {
      for (auto [dst, src, k] :
           {std::tuple{&g[size_t(e)], &gu[size_t(e)], H}, std::tuple{&d[size_t(e)], &dn[size_t(e)], I}}) {
        std::memset(dst, 0, sizeof(*dst));
        dst->data = src->w.data();
        dst->scales = src->s.data();
        dst->scale_row_stride = src->stride == 0 && explicit_dense ? (k + 127) / 128 : src->stride;
      }
    }
    moejit_moe_desc md;
    std::memset(&md, 0, sizeof(md));
    md.struct_size = sizeof(md);
    md.format = MOEJIT_FORMAT_FP8_BLOCK;
    md.scale_dtype = sdt;
    md.hidden = H;
    md.intermediate = I;
    md.num_experts = E;
    md.top_k = 2;
    md.max_tokens = 1;
    md.output_dtype = MOEJIT_DTYPE_F32;
    md.gate_up = g.data();
    md.down = d.data();
    moejit_moe* m = nullptr;
    if (moejit_moe_create(ctx, &md, &m) != MOEJIT_OK) {
      std::fprintf(stderr, "create: %s\n", moejit_last_error());
      std::exit(3);
    }
    std::vector<uint16_t> x(size_t(H), 0x3F80);
    const int32_t ids[2] = {0, 1};
    const float w[2] = {1.0f, 1.0f};
    y->assign(size_t(H), 0.0f);
    if (moejit_moe_forward(m, 1, x.data(), ids, w, y->data()) != MOEJIT_OK) {
      std::fprintf(stderr, "forward: %s\n", moejit_last_error());
      std::exit(3);
    }
    moejit_moe_destroy(m);
  };
  std::vector<float> want, got;
  run(true, &want);
  run(false, &got);
  moejit_context_destroy(ctx);
  if (std::memcmp(want.data(), got.data(), want.size() * 4) != 0) {
    for (size_t i = 0; i < want.size(); ++i)
      if (std::memcmp(&want[i], &got[i], 4) != 0) {
        std::fprintf(stderr, "y[%zu] = %g with scale_row_stride 0, %g with the explicit dense stride\n", i,
                     double(got[i]), double(want[i]));
        break;
      }
    std::exit(5);
  }
  std::exit(0);
}

class Bounds : public ::testing::TestWithParam<moejit_isa> {
 protected:
  void SetUp() override {
    clear_isa_env();
    if (GetParam() > moejit_host_isa()) GTEST_SKIP() << "this CPU lacks " << moejit_isa_name(GetParam());
  }
};

INSTANTIATE_TEST_SUITE_P(Tiers, Bounds, ::testing::ValuesIn(kTiers),
                         [](const auto& info) { return std::string(moejit_isa_name(info.param)); });

}  // namespace

// fuzz_capi crash-f1f241e9...: fp8_block gate_up [656, 232] with dense f32
// scales [6, 2] (48 bytes) ending at a page: the avx512_bf16 kernel read past
// the last scale row. Linear layers of the same and nearby shapes.
TEST_P(Bounds, Fp8MinimalScaleTensors) {
  const moejit_isa tier = GetParam();
  for (moejit_dtype sdt : {MOEJIT_DTYPE_F32, MOEJIT_DTYPE_BF16})
    for (int cols : {232, 129, 255, 256, 300, 1000, 100})
      for (int rows : {656, 128, 130, 16, 1})
        for (int64_t pad : {0, 1})
          for (bool data_at_end : {true, false}) {
            const Shape s{MOEJIT_FORMAT_FP8_BLOCK, sdt, rows, cols, pad ? (cols + 127) / 128 + pad : 0};
            EXPECT_EXIT(run_linear(s, tier, data_at_end), ::testing::ExitedWithCode(0), "")
                << name(s, tier, data_at_end);
          }
}

TEST_P(Bounds, Bf16Weights) {
  const moejit_isa tier = GetParam();
  for (int cols : {1, 7, 31, 232, 333})
    for (int rows : {1, 17, 130})
      for (bool data_at_end : {true, false}) {
        const Shape s{MOEJIT_FORMAT_BF16, MOEJIT_DTYPE_BF16, rows, cols, 0};
        EXPECT_EXIT(run_linear(s, tier, data_at_end), ::testing::ExitedWithCode(0), "")
            << name(s, tier, data_at_end);
      }
}

// fuzz_capi crash-f1f241e9...: an expert with scale_row_stride 0 (dense) read
// its scales with expert 0's explicit stride (runtime/moe.cpp), past the end of
// its dense scale tensor and at wrong positions.
TEST_P(Bounds, MoeExpertsWithTheirOwnScaleStrides) {
  const moejit_isa tier = GetParam();
  for (moejit_dtype sdt : {MOEJIT_DTYPE_F32, MOEJIT_DTYPE_BF16})
    for (auto [H, I] : {std::pair{232, 328}, std::pair{300, 200}, std::pair{256, 136}}) {
      EXPECT_EXIT(run_moe_mixed_strides(tier, sdt, H, I), ::testing::ExitedWithCode(0), "")
          << moejit_isa_name(tier) << (sdt ? " f32" : " bf16") << " scales, H " << H << ", I " << I
          << ": expert 0 scale_row_stride = columns + 1, expert 1 scale_row_stride = 0 (dense, ending at a "
             "guard page)";
    }
}
