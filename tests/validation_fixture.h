// Shared set-up of the validation suites: storage for matrices of every
// format, valid base descriptors, and the fixtures that run tables of cases.
#pragma once

#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "moejit.h"
#include "test_util.h"

namespace moejit_test {

inline constexpr int kMaxStride = 8;  // scale buffers leave room for strides up to this

// Storage for one [rows, K] matrix of any format (contents irrelevant here:
// zeros, with bf16 1.0 scales).
struct Store {
  std::vector<uint8_t> data, scales;
  std::vector<float> row_scales;
  std::vector<uint16_t> bias;
  moejit_matrix m{};

  Store(moejit_format f, moejit_dtype sdt, int group, int64_t rows, int64_t k) {
    int64_t bytes = 0, srows = 0, scols = 0, sbytes = 1;
    switch (f) {
      case MOEJIT_FORMAT_BF16: bytes = rows * k * 2; break;
      case MOEJIT_FORMAT_NVFP4: bytes = rows * k / 2, srows = rows, scols = (k + 15) / 16; break;
      case MOEJIT_FORMAT_MXFP4:
      case MOEJIT_FORMAT_DS_FP4: bytes = rows * k / 2, srows = rows, scols = (k + 31) / 32; break;
      case MOEJIT_FORMAT_Q4_0: bytes = rows * (k / 32) * 18; break;
      case MOEJIT_FORMAT_Q8_0: bytes = rows * (k / 32) * 34; break;
      case MOEJIT_FORMAT_FP8_BLOCK:
        bytes = rows * k, srows = (rows + 127) / 128, scols = (k + 127) / 128;
        sbytes = sdt == MOEJIT_DTYPE_F32 ? 4 : 2;
        break;
      case MOEJIT_FORMAT_MXFP8_E4M3:
      case MOEJIT_FORMAT_MXFP8_E5M2: bytes = rows * k, srows = rows, scols = (k + group - 1) / group; break;
      case MOEJIT_FORMAT_Q4_K: bytes = rows * (k / 256) * 144; break;
      case MOEJIT_FORMAT_Q5_K: bytes = rows * (k / 256) * 176; break;
      case MOEJIT_FORMAT_Q6_K: bytes = rows * (k / 256) * 210; break;
      case MOEJIT_FORMAT_Q2_K: bytes = rows * (k / 256) * 84; break;
      case MOEJIT_FORMAT_Q3_K: bytes = rows * (k / 256) * 110; break;
    }
    data.assign(size_t(bytes > 0 ? bytes : 1) + 64, 0);
    if (srows) scales.assign(size_t(srows * std::max<int64_t>(scols, kMaxStride) * sbytes) + 64, 0);
    if (f == MOEJIT_FORMAT_FP8_BLOCK && sdt == MOEJIT_DTYPE_BF16)
      for (size_t i = 0; i + 1 < scales.size(); i += 2) scales[i + 1] = 0x3F;  // 0x3F80 = 1.0
    row_scales.assign(size_t(rows), 1.0f);
    bias.assign(size_t(rows), 0);
    m.data = data.data();
    m.scales = srows ? scales.data() : nullptr;
    m.scale_row_stride = 0;
    m.row_scales = f == MOEJIT_FORMAT_NVFP4 ? row_scales.data() : nullptr;
    m.bias = nullptr;
  }
};

struct MoeSetup {
  moejit_moe_desc base{};
  std::vector<Store> gu_store, dn_store;

  MoeSetup(moejit_format f, int H, int I, int E, int top_k = 2, int max_tokens = 4,
           moejit_dtype sdt = MOEJIT_DTYPE_BF16, int group_size = 0) {
    const int g = group_size ? group_size : 32;
    for (int e = 0; e < E; ++e) {
      gu_store.emplace_back(f, sdt, g, 2 * int64_t(I), H);
      dn_store.emplace_back(f, sdt, g, H, I);
    }
    std::memset(&base, 0, sizeof(base));
    base.struct_size = sizeof(base);
    base.format = f;
    base.scale_dtype = f == MOEJIT_FORMAT_FP8_BLOCK ? sdt : MOEJIT_DTYPE_BF16;
    base.group_size = group_size;
    base.hidden = H;
    base.intermediate = I;
    base.num_experts = E;
    base.top_k = top_k;
    base.max_tokens = max_tokens;
    base.activation = MOEJIT_ACT_SILU;
    base.output_dtype = MOEJIT_DTYPE_BF16;
  }
  std::vector<moejit_matrix> gu() const {
    std::vector<moejit_matrix> v;
    for (auto& s : gu_store) v.push_back(s.m);
    return v;
  }
  std::vector<moejit_matrix> dn() const {
    std::vector<moejit_matrix> v;
    for (auto& s : dn_store) v.push_back(s.m);
    return v;
  }
};

// Separate gate and up banks [I, H] and down [H, I] (0.2), each projection in its
// own format: up_format and down_format point at up_fmt and down_fmt.
struct SplitSetup {
  moejit_moe_desc base{};
  moejit_proj_format up_fmt{}, down_fmt{};
  std::vector<Store> g_store, u_store, d_store;

  SplitSetup(moejit_format gate, moejit_format up, moejit_format down, int H, int I, int E) {
    for (int e = 0; e < E; ++e) {
      g_store.emplace_back(gate, MOEJIT_DTYPE_BF16, 32, int64_t(I), H);
      u_store.emplace_back(up, MOEJIT_DTYPE_BF16, 32, int64_t(I), H);
      d_store.emplace_back(down, MOEJIT_DTYPE_BF16, 32, H, I);
    }
    std::memset(&base, 0, sizeof(base));
    base.struct_size = sizeof(base);
    base.format = gate;
    base.hidden = H;
    base.intermediate = I;
    base.num_experts = E;
    base.top_k = 2;
    base.max_tokens = 4;
    base.activation = MOEJIT_ACT_SILU;
    base.output_dtype = MOEJIT_DTYPE_BF16;
    up_fmt.format = up;
    down_fmt.format = down;
  }
  static std::vector<moejit_matrix> matrices(const std::vector<Store>& st) {
    std::vector<moejit_matrix> v;
    for (auto& s : st) v.push_back(s.m);
    return v;
  }
};

// The banks and formats of one SplitSetup case, wired into `desc` before `mutate` runs.
struct SplitDesc {
  moejit_moe_desc desc;
  std::vector<moejit_matrix> gate, up, down;
  moejit_proj_format up_fmt, down_fmt;
};

struct SplitCase {
  std::string name;
  std::function<void(SplitDesc&)> mutate;
  moejit_status want;
  std::string arg;  // expected in the message ("" = only the function prefix)
};

using MoeMutator =
    std::function<void(moejit_moe_desc&, std::vector<moejit_matrix>&, std::vector<moejit_matrix>&)>;

struct MoeCase {
  std::string name;
  MoeMutator mutate;
  moejit_status want;
  std::string arg;  // expected in the message ("" = only the function prefix)
};

class Validation : public ::testing::Test {
 protected:
  void SetUp() override {
    clear_isa_env();
    const moejit_context_desc d = context_desc(MOEJIT_ISA_AUTO, 2);
    ASSERT_EQ(moejit_context_create(&d, &ctx_), MOEJIT_OK) << last_error();
  }
  void TearDown() override { moejit_context_destroy(ctx_); }

  void run_moe_cases(const MoeSetup& s, const std::vector<MoeCase>& cases) {
    for (const MoeCase& c : cases) {
      SCOPED_TRACE("case: " + c.name);
      std::vector<moejit_matrix> gu = s.gu(), dn = s.dn();
      moejit_moe_desc d = s.base;
      d.gate_up = gu.data();
      d.down = dn.data();
      c.mutate(d, gu, dn);
      moejit_moe* out = reinterpret_cast<moejit_moe*>(uintptr_t(0x10));
      const moejit_status st = moejit_moe_create(ctx_, &d, &out);
      EXPECT_EQ(st, c.want) << "got " << sname(st) << ", message \"" << last_error() << "\"";
      if (c.want != MOEJIT_OK) {
        EXPECT_EQ(out, nullptr) << "*out must be NULL after a failure";
        if (st != MOEJIT_OK) {
          EXPECT_TRUE(message_names("moejit_moe_create", c.arg));
        }
      } else {
        EXPECT_NE(out, nullptr);
      }
      if (st == MOEJIT_OK && out && out != reinterpret_cast<moejit_moe*>(uintptr_t(0x10)))
        moejit_moe_destroy(out);
    }
  }

  void run_split_cases(const SplitSetup& s, const std::vector<SplitCase>& cases) {
    for (const SplitCase& c : cases) {
      SCOPED_TRACE("case: " + c.name);
      SplitDesc sd{s.base,
                   SplitSetup::matrices(s.g_store),
                   SplitSetup::matrices(s.u_store),
                   SplitSetup::matrices(s.d_store),
                   s.up_fmt,
                   s.down_fmt};
      sd.desc.gate = sd.gate.data();
      sd.desc.up = sd.up.data();
      sd.desc.down = sd.down.data();
      sd.desc.up_format = &sd.up_fmt;
      sd.desc.down_format = &sd.down_fmt;
      c.mutate(sd);
      moejit_moe* out = reinterpret_cast<moejit_moe*>(uintptr_t(0x10));
      const moejit_status st = moejit_moe_create(ctx_, &sd.desc, &out);
      EXPECT_EQ(st, c.want) << "got " << sname(st) << ", message \"" << last_error() << "\"";
      if (c.want != MOEJIT_OK) {
        EXPECT_EQ(out, nullptr) << "*out must be NULL after a failure";
        if (st != MOEJIT_OK) {
          EXPECT_TRUE(message_names("moejit_moe_create", c.arg));
        }
      } else {
        EXPECT_NE(out, nullptr);
      }
      if (st == MOEJIT_OK && out && out != reinterpret_cast<moejit_moe*>(uintptr_t(0x10)))
        moejit_moe_destroy(out);
    }
  }

  // Runs `body` once per tier the host has, with ctx_ on that tier: an
  // unimplemented format must be UNSUPPORTED whatever the tier (a scalar tier
  // that quietly served it through the reference would be a bug).
  template <class F>
  void for_each_tier(F&& body) {
    moejit_context* saved = ctx_;
    for (int t = MOEJIT_ISA_SCALAR; t <= moejit_host_isa(); ++t) {
      SCOPED_TRACE(std::string("tier ") + moejit_isa_name(static_cast<moejit_isa>(t)));
      const moejit_context_desc d = context_desc(static_cast<moejit_isa>(t), 1);
      moejit_context* c = nullptr;
      ASSERT_EQ(moejit_context_create(&d, &c), MOEJIT_OK) << last_error();
      ctx_ = c;
      body();
      moejit_context_destroy(c);
    }
    ctx_ = saved;
  }

  moejit_context* ctx_ = nullptr;
};

inline MoeCase field(const std::string& name, std::function<void(moejit_moe_desc&)> f, moejit_status want,
                     const std::string& arg) {
  return {name, [f](moejit_moe_desc& d, std::vector<moejit_matrix>&, std::vector<moejit_matrix>&) { f(d); },
          want, arg};
}

// Formats without kernels in this build: valid requests are UNSUPPORTED.
// Every format id is implemented in this build (the list the validation
// tests check UNSUPPORTED for is empty).
inline const std::vector<moejit_format> kUnimplemented = {};
// Every format beyond the foundation's two: their argument rules are checked
// whether or not kernels exist (validity before support).
inline const moejit_format kBlockFormats[] = {
    MOEJIT_FORMAT_NVFP4, MOEJIT_FORMAT_MXFP4,      MOEJIT_FORMAT_DS_FP4,    MOEJIT_FORMAT_Q4_0,
    MOEJIT_FORMAT_Q8_0,  MOEJIT_FORMAT_MXFP8_E4M3, MOEJIT_FORMAT_MXFP8_E5M2};

struct LinearSetup {
  Store store;
  moejit_linear_desc base{};
  LinearSetup(moejit_format f, int rows, int cols, moejit_dtype sdt = MOEJIT_DTYPE_BF16, int group_size = 0)
      : store(f, sdt, group_size ? group_size : 32, rows, cols) {
    std::memset(&base, 0, sizeof(base));
    base.struct_size = sizeof(base);
    base.format = f;
    base.scale_dtype = f == MOEJIT_FORMAT_FP8_BLOCK ? sdt : MOEJIT_DTYPE_BF16;
    base.group_size = group_size;
    base.rows = rows;
    base.cols = cols;
    base.max_tokens = 4;
    base.weight = store.m;
    base.output_dtype = MOEJIT_DTYPE_F32;
  }
};

struct LinearCase {
  std::string name;
  std::function<void(moejit_linear_desc&)> mutate;
  moejit_status want;
  std::string arg;
};

class LinearValidation : public Validation {
 protected:
  void run_linear_cases(const LinearSetup& s, const std::vector<LinearCase>& cases) {
    for (const LinearCase& c : cases) {
      SCOPED_TRACE("case: " + c.name);
      moejit_linear_desc d = s.base;
      c.mutate(d);
      moejit_linear* out = reinterpret_cast<moejit_linear*>(uintptr_t(0x10));
      const moejit_status st = moejit_linear_create(ctx_, &d, &out);
      EXPECT_EQ(st, c.want) << "got " << sname(st) << ", message \"" << last_error() << "\"";
      if (c.want != MOEJIT_OK) {
        EXPECT_EQ(out, nullptr) << "*out must be NULL after a failure";
        if (st != MOEJIT_OK) {
          EXPECT_TRUE(message_names("moejit_linear_create", c.arg));
        }
      }
      if (st == MOEJIT_OK && out && out != reinterpret_cast<moejit_linear*>(uintptr_t(0x10)))
        moejit_linear_destroy(out);
    }
  }
};

}  // namespace moejit_test
