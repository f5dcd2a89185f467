// Argument validation of the calls on existing objects (moe_forward,
// moe_submit, linear_forward, stats_get, context_wait) and a fuzzer over the
// create descriptors (api.md "Errors", "Calls").
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "moejit.h"
#include "test_util.h"
#include "validation_fixture.h"

using namespace moejit_test;

// ------------------------------------------------------------------ calls

namespace {

constexpr int H = 64, I = 32, E = 4, K = 2, T = 4;

struct CallCase {
  std::string name;
  bool null_obj = false;
  int32_t tokens = T;
  bool null_x = false, null_ids = false, null_w = false, null_y = false;
  int bad_t = -1, bad_k = -1;  // route to overwrite
  int32_t bad_id = 0;
  moejit_status want = MOEJIT_INVALID_ARGUMENT;
  std::string arg;
};

std::vector<CallCase> moe_call_cases() {
  std::vector<CallCase> v;
  auto add = [&v](CallCase c) { v.push_back(c); };
  CallCase c;
  c = {};
  c.name = "moe NULL", c.null_obj = true, c.arg = "moe";
  add(c);
  for (int32_t n : {-1, INT32_MIN, T + 1, INT32_MAX}) {
    c = {};
    c.name = "num_tokens " + std::to_string(n), c.tokens = n, c.arg = "num_tokens";
    add(c);
  }
  c = {};
  c.name = "x NULL", c.null_x = true, c.arg = "x";
  add(c);
  c = {};
  c.name = "topk_ids NULL", c.null_ids = true, c.arg = "topk_ids";
  add(c);
  c = {};
  c.name = "topk_weights NULL", c.null_w = true, c.arg = "topk_weights";
  add(c);
  c = {};
  c.name = "y NULL", c.null_y = true, c.arg = "y";
  add(c);
  c = {};
  c.name = "x NULL with 1 token", c.tokens = 1, c.null_x = true, c.arg = "x";
  add(c);
  // Bad ids in the last token, so writing earlier tokens first would show.
  const int32_t bad_ids[][3] = {{3, 1, E}, {3, 0, E + 1}, {2, 1, 1000}, {0, 0, INT32_MAX}, {3, 1, 128}};
  for (auto& b : bad_ids) {
    c = {};
    c.bad_t = b[0], c.bad_k = b[1], c.bad_id = b[2];
    c.name =
        "id " + std::to_string(b[2]) + " at [" + std::to_string(b[0]) + "][" + std::to_string(b[1]) + "]";
    c.arg = "topk_ids[" + std::to_string(b[0]) + "][" + std::to_string(b[1]) + "]";
    add(c);
  }
  // Valid calls.
  c = {};
  c.name = "INT32_MIN is a skipped route", c.bad_t = 3, c.bad_k = 1, c.bad_id = INT32_MIN, c.want = MOEJIT_OK;
  add(c);
  c = {};
  c.name = "-1 is a skipped route", c.bad_t = 0, c.bad_k = 0, c.bad_id = -1, c.want = MOEJIT_OK;
  add(c);
  c = {};
  c.name = "id E-1", c.bad_t = 1, c.bad_k = 1, c.bad_id = E - 1, c.want = MOEJIT_OK;
  add(c);
  c = {};
  c.name = "0 tokens, NULL everything", c.tokens = 0, c.null_x = c.null_ids = c.null_w = c.null_y = true,
  c.want = MOEJIT_OK;
  add(c);
  c = {};
  c.name = "0 tokens, buffers given", c.tokens = 0, c.want = MOEJIT_OK;
  add(c);
  c = {};
  c.name = "0 tokens with a bad id in the buffer", c.tokens = 0, c.bad_t = 0, c.bad_k = 0, c.bad_id = E,
  c.want = MOEJIT_OK;
  add(c);
  return v;
}

}  // namespace

class CallValidation : public Validation {
 protected:
  void SetUp() override {
    Validation::SetUp();
    setup_ = std::make_unique<MoeSetup>(MOEJIT_FORMAT_BF16, H, I, E, K, T);
    gu_ = setup_->gu();
    dn_ = setup_->dn();
    moejit_moe_desc d = setup_->base;
    d.gate_up = gu_.data();
    d.down = dn_.data();
    ASSERT_EQ(moejit_moe_create(ctx_, &d, &moe_), MOEJIT_OK) << last_error();
  }
  void TearDown() override {
    moejit_moe_destroy(moe_);
    Validation::TearDown();
  }

  void run(bool submit) {
    const char* fn = submit ? "moejit_moe_submit" : "moejit_moe_forward";
    for (const CallCase& c : moe_call_cases()) {
      SCOPED_TRACE(std::string(fn) + " case: " + c.name);
      std::vector<uint16_t> x(size_t(T * H), 0x3F80);
      std::vector<int32_t> ids(size_t(T * K));
      for (int i = 0; i < T * K; ++i) ids[size_t(i)] = i % E;
      std::vector<float> w(size_t(T * K), 0.5f);
      if (c.bad_t >= 0) ids[size_t(c.bad_t * K + c.bad_k)] = c.bad_id;
      Sentinel y(size_t(T * H * 2 + 256));
      const uint64_t calls_before = stats_calls();
      const moejit_status st = (submit ? moejit_moe_submit : moejit_moe_forward)(
          c.null_obj ? nullptr : moe_, c.tokens, c.null_x ? nullptr : x.data(),
          c.null_ids ? nullptr : ids.data(), c.null_w ? nullptr : w.data(), c.null_y ? nullptr : y.data());
      EXPECT_EQ(st, c.want) << "got " << sname(st) << ", message \"" << last_error() << "\"";
      if (st != MOEJIT_OK) {
        EXPECT_TRUE(message_names(fn, c.arg));
      }
      EXPECT_EQ(moejit_context_wait(ctx_), MOEJIT_OK) << "after a failed submit nothing is in flight";
      if (c.want != MOEJIT_OK || c.tokens == 0) {
        EXPECT_EQ(y.first_changed(), -1) << "y written at byte " << y.first_changed();
        EXPECT_EQ(stats_calls(), calls_before) << "failed and empty calls are not counted";
      } else {
        // All weights are zero: every token's row is +0.0, nothing past row T is written.
        const size_t row_bytes = size_t(c.tokens) * H * 2;
        for (size_t i = 0; i < row_bytes; ++i) ASSERT_EQ(y.bytes[i], 0) << "y byte " << i;
        EXPECT_EQ(y.first_changed(row_bytes), -1) << "y written past num_tokens rows";
        EXPECT_EQ(stats_calls(), calls_before + 1);
      }
    }
  }

  uint64_t stats_calls() {
    moejit_moe_stats s;
    std::memset(&s, 0, sizeof(s));
    s.struct_size = sizeof(s);
    EXPECT_EQ(moejit_moe_stats_get(moe_, &s), MOEJIT_OK) << last_error();
    return s.calls;
  }

  std::unique_ptr<MoeSetup> setup_;
  std::vector<moejit_matrix> gu_, dn_;
  moejit_moe* moe_ = nullptr;
};

TEST_F(CallValidation, MoeForward) { run(false); }
TEST_F(CallValidation, MoeSubmit) { run(true); }

TEST_F(CallValidation, StatsGet) {
  moejit_moe_stats s;
  std::memset(&s, 0x5A, sizeof(s));
  s.struct_size = sizeof(s);
  EXPECT_EQ(moejit_moe_stats_get(nullptr, &s), MOEJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(message_names("moejit_moe_stats_get", "moe"));
  EXPECT_EQ(moejit_moe_stats_get(moe_, nullptr), MOEJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(message_names("moejit_moe_stats_get", "out"));
  for (uint32_t sz : {0u, 4u, uint32_t(sizeof(s) - 1)}) {
    std::memset(&s, 0x5A, sizeof(s));
    s.struct_size = sz;
    EXPECT_EQ(moejit_moe_stats_get(moe_, &s), MOEJIT_INVALID_ARGUMENT) << sz;
    EXPECT_TRUE(message_names("moejit_moe_stats_get", "struct_size"));
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&s);
    for (size_t i = sizeof(uint32_t); i < sizeof(s); ++i)
      ASSERT_EQ(b[i], 0x5A) << "stats byte " << i << " written";
  }
  std::memset(&s, 0x5A, sizeof(s));
  s.struct_size = sizeof(s);
  ASSERT_EQ(moejit_moe_stats_get(moe_, &s), MOEJIT_OK) << last_error();
  EXPECT_EQ(s.calls, 0u);
  EXPECT_EQ(s.routes, 0u);
  EXPECT_EQ(s.unique_experts, 0u);
  EXPECT_EQ(s.weight_bytes_read, 0u);
}

TEST_F(CallValidation, ContextWaitNull) {
  EXPECT_EQ(moejit_context_wait(nullptr), MOEJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(message_names("moejit_context_wait", "ctx"));
  EXPECT_EQ(moejit_context_wait(ctx_), MOEJIT_OK);
}

TEST_F(Validation, LinearForward) {
  constexpr int R = 40, C = 24, MT = 3;
  LinearSetup s(MOEJIT_FORMAT_BF16, R, C);
  moejit_linear_desc d = s.base;
  d.max_tokens = MT;
  d.output_dtype = MOEJIT_DTYPE_BF16;
  moejit_linear* lin = nullptr;
  ASSERT_EQ(moejit_linear_create(ctx_, &d, &lin), MOEJIT_OK) << last_error();
  std::vector<uint16_t> x(size_t(MT * C), 0x3F80);
  struct Case {
    const char* name;
    bool null_obj;
    int32_t tokens;
    bool null_x, null_y;
    moejit_status want;
    const char* arg;
  };
  const Case cases[] = {
      {"linear NULL", true, 1, false, false, MOEJIT_INVALID_ARGUMENT, "linear"},
      {"num_tokens -1", false, -1, false, false, MOEJIT_INVALID_ARGUMENT, "num_tokens"},
      {"num_tokens min", false, INT32_MIN, false, false, MOEJIT_INVALID_ARGUMENT, "num_tokens"},
      {"num_tokens > max", false, MT + 1, false, false, MOEJIT_INVALID_ARGUMENT, "num_tokens"},
      {"x NULL", false, 2, true, false, MOEJIT_INVALID_ARGUMENT, "x"},
      {"y NULL", false, 2, false, true, MOEJIT_INVALID_ARGUMENT, "y"},
      {"0 tokens NULL buffers", false, 0, true, true, MOEJIT_OK, ""},
      {"0 tokens", false, 0, false, false, MOEJIT_OK, ""},
      {"2 tokens", false, 2, false, false, MOEJIT_OK, ""},
      {"max tokens", false, MT, false, false, MOEJIT_OK, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Sentinel y(size_t(MT * R * 2 + 128));
    const moejit_status st = moejit_linear_forward(
        c.null_obj ? nullptr : lin, c.tokens, c.null_x ? nullptr : x.data(), c.null_y ? nullptr : y.data());
    EXPECT_EQ(st, c.want) << "got " << sname(st) << ", message \"" << last_error() << "\"";
    if (st != MOEJIT_OK) {
      EXPECT_TRUE(message_names("moejit_linear_forward", c.arg));
    }
    const size_t written = c.want == MOEJIT_OK && c.tokens > 0 ? size_t(c.tokens) * R * 2 : 0;
    for (size_t i = 0; i < written; ++i) ASSERT_EQ(y.bytes[i], 0) << "zero weights give +0.0, byte " << i;
    EXPECT_EQ(y.first_changed(written), -1) << "y written outside the num_tokens rows";
  }
  moejit_linear_destroy(lin);
}

// ------------------------------------------------------------------ fuzzing

namespace {

uint64_t lcg(uint64_t& s) {
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return s >> 33;
}

int32_t pick_int(uint64_t& s) {
  static const int32_t v[] = {0,  1,  2,   3,   -1,  7,   16,        32,        48,
                              64, 96, 128, 129, 200, 256, INT32_MIN, INT32_MAX, -128};
  return v[lcg(s) % (sizeof(v) / sizeof(v[0]))];
}

bool known_status(moejit_status st) {
  return st == MOEJIT_OK || st == MOEJIT_INVALID_ARGUMENT || st == MOEJIT_UNSUPPORTED ||
         st == MOEJIT_OUT_OF_MEMORY;
}

}  // namespace

// Random mixes of valid and invalid field values: every call returns a
// documented status, a failure leaves *out NULL with a conventional message,
// and nothing crashes. Buffers are sized for the largest sizes drawn.
TEST_F(Validation, FuzzedDescriptorsFailCleanly) {
  std::vector<uint8_t> big(size_t(2 * 256 * 256 * 2) + 4096, 0);
  std::vector<uint8_t> scales(65536, 0);
  std::vector<float> row_scales(1024, 1.0f);
  uint64_t s = 12345;
  int ok = 0, failed = 0;
  for (int it = 0; it < 1500; ++it) {
    moejit_matrix mats[4];
    for (auto& m : mats) {
      std::memset(&m, 0, sizeof(m));
      m.data = lcg(s) % 16 ? big.data() : nullptr;
      m.scales = lcg(s) % 8 ? scales.data() : nullptr;
      m.scale_row_stride = lcg(s) % 3 ? 0 : pick_int(s);
      m.row_scales = lcg(s) % 4 ? row_scales.data() : nullptr;
    }
    moejit_moe_desc d;
    std::memset(&d, 0, sizeof(d));
    d.struct_size =
        lcg(s) % 16
            ? sizeof(d)
            : uint32_t(pick_int(s)) %
                  uint32_t(sizeof(d) + 1);  // larger sizes need a zeroed buffer (test_api covers them)
    d.format = static_cast<moejit_format>(lcg(s) % 4 ? (lcg(s) % 2 ? 0 : 5) : pick_int(s) % 12);
    d.scale_dtype = static_cast<moejit_dtype>(lcg(s) % 4 ? 0 : pick_int(s) % 3);
    d.group_size = lcg(s) % 2 ? 0 : pick_int(s);
    d.hidden = lcg(s) % 3 ? int32_t(1 + lcg(s) % 256) : pick_int(s);
    d.intermediate = lcg(s) % 3 ? int32_t(1 + lcg(s) % 256) : pick_int(s);
    d.num_experts = lcg(s) % 3 ? int32_t(1 + lcg(s) % 2) : pick_int(s) % 3;
    d.top_k = lcg(s) % 3 ? 1 : pick_int(s);
    d.max_tokens = lcg(s) % 3 ? int32_t(1 + lcg(s) % 4) : pick_int(s);
    d.activation = static_cast<moejit_activation>(lcg(s) % 3 ? lcg(s) % 5 : uint64_t(pick_int(s)));
    d.swiglu_alpha = lcg(s) % 4 ? 0.0f : (lcg(s) % 2 ? NAN : 1.5f);
    d.swiglu_limit = lcg(s) % 4 ? 0.0f : (lcg(s) % 2 ? -1.0f : INFINITY);
    d.gate_up_interleaved = lcg(s) % 4 ? int32_t(lcg(s) % 2) : pick_int(s);
    d.router_weight_on_input = lcg(s) % 4 ? int32_t(lcg(s) % 2) : pick_int(s);
    d.output_dtype = static_cast<moejit_dtype>(lcg(s) % 4 ? lcg(s) % 2 : uint64_t(pick_int(s)));
    d.gate_up = lcg(s) % 16 ? mats : nullptr;
    d.down = lcg(s) % 16 ? mats + 2 : nullptr;
    moejit_moe* out = reinterpret_cast<moejit_moe*>(uintptr_t(0x10));
    const moejit_status st = moejit_moe_create(ctx_, &d, &out);
    ASSERT_TRUE(known_status(st)) << "iteration " << it << ": status " << int(st);
    if (st == MOEJIT_OK) {
      ASSERT_NE(out, nullptr);
      moejit_moe_destroy(out);
      ++ok;
    } else {
      ++failed;
      ASSERT_EQ(out, nullptr) << "iteration " << it;
      ASSERT_TRUE(message_names("moejit_moe_create", "")) << "iteration " << it;
    }

    moejit_linear_desc l;
    std::memset(&l, 0, sizeof(l));
    l.struct_size = lcg(s) % 16 ? sizeof(l) : uint32_t(pick_int(s)) % uint32_t(sizeof(l) + 1);
    // Enum fields may hold out-of-range values: copy their bytes (loading one as
    // the enum type is UB that UBSan reports).
    std::memcpy(&l.format, &d.format, sizeof(l.format));
    std::memcpy(&l.scale_dtype, &d.scale_dtype, sizeof(l.scale_dtype));
    l.group_size = d.group_size;
    l.rows = lcg(s) % 3 ? int32_t(1 + lcg(s) % 512) : pick_int(s);
    l.cols = lcg(s) % 3 ? int32_t(1 + lcg(s) % 256) : pick_int(s);
    l.max_tokens = d.max_tokens;
    l.weight = mats[lcg(s) % 4];
    std::memcpy(&l.output_dtype, &d.output_dtype, sizeof(l.output_dtype));
    moejit_linear* lo = reinterpret_cast<moejit_linear*>(uintptr_t(0x10));
    const moejit_status ls = moejit_linear_create(ctx_, &l, &lo);
    ASSERT_TRUE(known_status(ls)) << "iteration " << it << ": status " << int(ls);
    if (ls == MOEJIT_OK) {
      ASSERT_NE(lo, nullptr);
      moejit_linear_destroy(lo);
      ++ok;
    } else {
      ++failed;
      ASSERT_EQ(lo, nullptr) << "iteration " << it;
      ASSERT_TRUE(message_names("moejit_linear_create", "")) << "iteration " << it;
    }
  }
  EXPECT_GT(ok, 50) << "the fuzzer should also produce valid descriptors";
  EXPECT_GT(failed, 500);
}
