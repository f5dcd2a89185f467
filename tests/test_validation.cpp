// Every invalid argument of the object calls (api.md "Errors", "Ranges",
// "Calls"): the status, a message "<function>: ..." naming the argument, *out
// set to NULL, and output buffers untouched. Valid formats that this build does
// not implement yet are UNSUPPORTED, but only once the request is otherwise
// valid.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "moejit.h"
#include "test_util.h"
#include "validation_fixture.h"

using namespace moejit_test;

// ------------------------------------------------------------------ moe_create

TEST_F(Validation, MoeCreateNullArguments) {
  MoeSetup s(MOEJIT_FORMAT_BF16, 64, 32, 4);
  std::vector<moejit_matrix> gu = s.gu(), dn = s.dn();
  moejit_moe_desc d = s.base;
  d.gate_up = gu.data();
  d.down = dn.data();
  moejit_moe* out = reinterpret_cast<moejit_moe*>(uintptr_t(0x10));
  EXPECT_EQ(moejit_moe_create(nullptr, &d, &out), MOEJIT_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_TRUE(message_names("moejit_moe_create", "ctx"));
  out = reinterpret_cast<moejit_moe*>(uintptr_t(0x10));
  EXPECT_EQ(moejit_moe_create(ctx_, nullptr, &out), MOEJIT_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_TRUE(message_names("moejit_moe_create", "desc"));
  EXPECT_EQ(moejit_moe_create(ctx_, &d, nullptr), MOEJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(message_names("moejit_moe_create", "out"));
  // The valid descriptor itself works.
  ASSERT_EQ(moejit_moe_create(ctx_, &d, &out), MOEJIT_OK) << last_error();
  moejit_moe_destroy(out);
}

TEST_F(Validation, MoeCreateStructSize) {
  MoeSetup s(MOEJIT_FORMAT_FP8_BLOCK, 200, 136, 4);
  std::vector<MoeCase> cases;
  for (uint32_t v : {0u, 4u, uint32_t(sizeof(moejit_moe_desc) - 1), uint32_t(sizeof(moejit_moe_desc) - 8)})
    cases.push_back(field(
        "struct_size " + std::to_string(v), [v](moejit_moe_desc& d) { d.struct_size = v; },
        MOEJIT_INVALID_ARGUMENT, "struct_size"));
  run_moe_cases(s, cases);

  // Larger descriptors from newer callers.
  std::vector<moejit_matrix> gu = s.gu(), dn = s.dn();
  struct Bigger {
    moejit_moe_desc d;
    uint8_t tail[32];
  } big;
  std::memset(&big, 0, sizeof(big));
  big.d = s.base;
  big.d.gate_up = gu.data();
  big.d.down = dn.data();
  big.d.struct_size = sizeof(big);
  moejit_moe* out = nullptr;
  EXPECT_EQ(moejit_moe_create(ctx_, &big.d, &out), MOEJIT_OK) << "zero tail: " << last_error();
  moejit_moe_destroy(out);
  for (size_t at : {size_t(0), size_t(17), sizeof(big.tail) - 1}) {
    big.tail[at] = 0x40;
    out = reinterpret_cast<moejit_moe*>(uintptr_t(0x10));
    EXPECT_EQ(moejit_moe_create(ctx_, &big.d, &out), MOEJIT_INVALID_ARGUMENT) << "non-zero tail byte " << at;
    EXPECT_EQ(out, nullptr);
    EXPECT_TRUE(message_names("moejit_moe_create", "struct_size"));
    big.tail[at] = 0;
  }
}

TEST_F(Validation, MoeCreateFields) {
  // fp8_block: gate_up [272, 200] has 3x2 scale blocks, down [200, 136] 2x2.
  MoeSetup s(MOEJIT_FORMAT_FP8_BLOCK, 200, 136, 4);
  const auto INV = MOEJIT_INVALID_ARGUMENT;
  std::vector<MoeCase> cases = {
      field(
          "hidden 0", [](moejit_moe_desc& d) { d.hidden = 0; }, INV, "hidden"),
      field(
          "hidden -1", [](moejit_moe_desc& d) { d.hidden = -1; }, INV, "hidden"),
      field(
          "hidden min", [](moejit_moe_desc& d) { d.hidden = INT32_MIN; }, INV, "hidden"),
      field(
          "intermediate 0", [](moejit_moe_desc& d) { d.intermediate = 0; }, INV, "intermediate"),
      field(
          "intermediate -3", [](moejit_moe_desc& d) { d.intermediate = -3; }, INV, "intermediate"),
      field(
          "num_experts 0", [](moejit_moe_desc& d) { d.num_experts = 0; }, INV, "num_experts"),
      field(
          "num_experts -1", [](moejit_moe_desc& d) { d.num_experts = -1; }, INV, "num_experts"),
      field(
          "top_k 0", [](moejit_moe_desc& d) { d.top_k = 0; }, INV, "top_k"),
      field(
          "top_k -1", [](moejit_moe_desc& d) { d.top_k = -1; }, INV, "top_k"),
      field(
          "top_k > E", [](moejit_moe_desc& d) { d.top_k = 5; }, INV, "top_k"),
      field(
          "max_tokens 0", [](moejit_moe_desc& d) { d.max_tokens = 0; }, INV, "max_tokens"),
      field(
          "max_tokens -1", [](moejit_moe_desc& d) { d.max_tokens = -1; }, INV, "max_tokens"),
      field(
          "format 14", [](moejit_moe_desc& d) { d.format = static_cast<moejit_format>(14); }, INV, "format"),
      field(
          "format -1", [](moejit_moe_desc& d) { d.format = static_cast<moejit_format>(-1); }, INV, "format"),
      field(
          "format 100", [](moejit_moe_desc& d) { d.format = static_cast<moejit_format>(100); }, INV,
          "format"),
      field(
          "scale_dtype 2", [](moejit_moe_desc& d) { d.scale_dtype = static_cast<moejit_dtype>(2); }, INV,
          "scale_dtype"),
      field(
          "scale_dtype -1", [](moejit_moe_desc& d) { d.scale_dtype = static_cast<moejit_dtype>(-1); }, INV,
          "scale_dtype"),
      field(
          "activation 5", [](moejit_moe_desc& d) { d.activation = static_cast<moejit_activation>(5); }, INV,
          "activation"),
      field(
          "activation -1", [](moejit_moe_desc& d) { d.activation = static_cast<moejit_activation>(-1); }, INV,
          "activation"),
      field(
          "output_dtype 2", [](moejit_moe_desc& d) { d.output_dtype = static_cast<moejit_dtype>(2); }, INV,
          "output_dtype"),
      field(
          "output_dtype -1", [](moejit_moe_desc& d) { d.output_dtype = static_cast<moejit_dtype>(-1); }, INV,
          "output_dtype"),
      field(
          "gate_up_interleaved 2", [](moejit_moe_desc& d) { d.gate_up_interleaved = 2; }, INV,
          "gate_up_interleaved"),
      field(
          "gate_up_interleaved -1", [](moejit_moe_desc& d) { d.gate_up_interleaved = -1; }, INV,
          "gate_up_interleaved"),
      field(
          "router_weight_on_input 2", [](moejit_moe_desc& d) { d.router_weight_on_input = 2; }, INV,
          "router_weight_on_input"),
      field(
          "router_weight_on_input -1", [](moejit_moe_desc& d) { d.router_weight_on_input = -1; }, INV,
          "router_weight_on_input"),
      field(
          "gate_up NULL", [](moejit_moe_desc& d) { d.gate_up = nullptr; }, INV, "gate_up"),
      field(
          "down NULL", [](moejit_moe_desc& d) { d.down = nullptr; }, INV, "down"),
      {"gate_up[3].data NULL", [](auto&, auto& gu, auto&) { gu[3].data = nullptr; }, INV, "gate_up[3].data"},
      {"down[0].data NULL", [](auto&, auto&, auto& dn) { dn[0].data = nullptr; }, INV, "down[0].data"},
      {"gate_up[1].scales NULL", [](auto&, auto& gu, auto&) { gu[1].scales = nullptr; }, INV,
       "gate_up[1].scales"},
      {"down[3].scales NULL", [](auto&, auto&, auto& dn) { dn[3].scales = nullptr; }, INV, "down[3].scales"},
      {"gate_up[2] stride -1", [](auto&, auto& gu, auto&) { gu[2].scale_row_stride = -1; }, INV,
       "gate_up[2].scale_row_stride"},
      {"down[1] stride -5", [](auto&, auto&, auto& dn) { dn[1].scale_row_stride = -5; }, INV,
       "down[1].scale_row_stride"},
      {"gate_up[0] stride 1 < 2 scale columns", [](auto&, auto& gu, auto&) { gu[0].scale_row_stride = 1; },
       INV, "gate_up[0].scale_row_stride"},
      {"down[2] stride 1 < 2 scale columns", [](auto&, auto&, auto& dn) { dn[2].scale_row_stride = 1; }, INV,
       "down[2].scale_row_stride"},
      {"down[3] stride min", [](auto&, auto&, auto& dn) { dn[3].scale_row_stride = INT64_MIN; }, INV,
       "down[3].scale_row_stride"},
      field(
          "swiglu_limit -1",
          [](moejit_moe_desc& d) {
            d.activation = MOEJIT_ACT_SWIGLU_OAI;
            d.swiglu_limit = -1.0f;
          },
          INV, "swiglu_limit"),
      field(
          "swiglu_limit NaN",
          [](moejit_moe_desc& d) {
            d.activation = MOEJIT_ACT_SWIGLU_OAI;
            d.swiglu_limit = std::numeric_limits<float>::quiet_NaN();
          },
          INV, "swiglu_limit"),
      field(
          "swiglu_limit -inf",
          [](moejit_moe_desc& d) {
            d.activation = MOEJIT_ACT_SWIGLU_CLAMP;
            d.swiglu_limit = -INFINITY;
          },
          INV, "swiglu_limit"),
      field(
          "swiglu_alpha inf",
          [](moejit_moe_desc& d) {
            d.activation = MOEJIT_ACT_SWIGLU_OAI;
            d.swiglu_alpha = INFINITY;
          },
          INV, "swiglu_alpha"),
      field(
          "swiglu_alpha -inf",
          [](moejit_moe_desc& d) {
            d.activation = MOEJIT_ACT_SWIGLU_CLAMP;
            d.swiglu_alpha = -INFINITY;
          },
          INV, "swiglu_alpha"),
      field(
          "swiglu_alpha NaN",
          [](moejit_moe_desc& d) {
            d.activation = MOEJIT_ACT_SWIGLU_OAI;
            d.swiglu_alpha = std::numeric_limits<float>::quiet_NaN();
          },
          INV, "swiglu_alpha"),
  };
  run_moe_cases(s, cases);
}

TEST_F(Validation, MoeCreateValidVariants) {
  // Boundary values that are valid: these must be accepted.
  MoeSetup s(MOEJIT_FORMAT_FP8_BLOCK, 200, 136, 4);
  const auto OK = MOEJIT_OK;
  std::vector<MoeCase> cases = {
      field(
          "top_k == E", [](moejit_moe_desc& d) { d.top_k = 4; }, OK, ""),
      field(
          "max_tokens 1", [](moejit_moe_desc& d) { d.max_tokens = 1; }, OK, ""),
      field(
          "f32 scales", [](moejit_moe_desc& d) { d.scale_dtype = MOEJIT_DTYPE_F32; }, OK, ""),
      field(
          "f32 output", [](moejit_moe_desc& d) { d.output_dtype = MOEJIT_DTYPE_F32; }, OK, ""),
      field(
          "group_size ignored by fp8_block", [](moejit_moe_desc& d) { d.group_size = 7; }, OK, ""),
      field(
          "swiglu_oai limit +inf",
          [](moejit_moe_desc& d) {
            d.activation = MOEJIT_ACT_SWIGLU_OAI;
            d.swiglu_limit = INFINITY;
          },
          OK, ""),
      field(
          "swiglu_clamp limit 0 alpha 0",
          [](moejit_moe_desc& d) {
            d.activation = MOEJIT_ACT_SWIGLU_CLAMP;
            d.swiglu_limit = 0.0f;
            d.swiglu_alpha = 0.0f;
          },
          OK, ""),
      field(
          "swiglu_oai alpha -2 limit 7",
          [](moejit_moe_desc& d) {
            d.activation = MOEJIT_ACT_SWIGLU_OAI;
            d.swiglu_limit = 7.0f;
            d.swiglu_alpha = -2.0f;
          },
          OK, ""),
      field(
          "interleaved, weight on input",
          [](moejit_moe_desc& d) {
            d.gate_up_interleaved = 1;
            d.router_weight_on_input = 1;
          },
          OK, ""),
      {"exact and padded strides",
       [](auto&, auto& gu, auto& dn) {
         gu[0].scale_row_stride = 2;
         gu[1].scale_row_stride = kMaxStride;
         dn[2].scale_row_stride = 2;
         dn[3].scale_row_stride = 5;
       },
       OK, ""},
      {"biases",
       [&s](auto&, auto& gu, auto& dn) {
         gu[1].bias = s.gu_store[1].bias.data();
         dn[0].bias = s.dn_store[0].bias.data();
       },
       OK, ""},
  };
  run_moe_cases(s, cases);
  MoeSetup one(MOEJIT_FORMAT_BF16, 1, 1, 1, 1, 1);
  run_moe_cases(one, {field(
                         "H = I = E = top_k = 1", [](moejit_moe_desc&) {}, OK, "")});
}

TEST_F(Validation, MoeCreateBf16ScaleDtype) {
  MoeSetup s(MOEJIT_FORMAT_BF16, 64, 32, 3);
  run_moe_cases(
      s, {field(
              "bf16 with scale_dtype f32", [](moejit_moe_desc& d) { d.scale_dtype = MOEJIT_DTYPE_F32; },
              MOEJIT_INVALID_ARGUMENT, "scale_dtype"),
          field(
              "bf16 needs no scales", [](moejit_moe_desc&) {}, MOEJIT_OK, "")});
}

TEST_F(Validation, MoeCreateUnimplementedFormatsAreUnsupported) {
  for_each_tier([&] {
    for (moejit_format f : kUnimplemented) {
      SCOPED_TRACE(moejit_format_name(f));
      MoeSetup s(f, 256, 128, 3);
      run_moe_cases(s, {field(
                           "valid request", [](moejit_moe_desc&) {}, MOEJIT_UNSUPPORTED, "format")});
    }
    // mxfp4 and ds_fp4 (mxfp4 bytes, DeepSeek activation numerics): served on every
    // tier, group_size ignored (always 32), one scale stride per projection.
    for (moejit_format f : {MOEJIT_FORMAT_MXFP4, MOEJIT_FORMAT_DS_FP4}) {
      SCOPED_TRACE(moejit_format_name(f));
      MoeSetup s(f, 256, 128, 3);
      run_moe_cases(s,
                    {field(
                         "valid request", [](moejit_moe_desc&) {}, MOEJIT_OK, ""),
                     field(
                         "group_size ignored", [](moejit_moe_desc& d) { d.group_size = 64; }, MOEJIT_OK, ""),
                     {"every expert with the same explicit strides",
                      [](auto&, auto& gu, auto& dn) {
                        for (auto& m : gu) m.scale_row_stride = kMaxStride;  // explicit, = the 8 columns
                        for (auto& m : dn) m.scale_row_stride = 6;
                      },
                      MOEJIT_OK, ""},
                     {"down[2] stride differs from expert 0's",
                      [](auto&, auto&, auto& dn) { dn[2].scale_row_stride = 6; }, MOEJIT_UNSUPPORTED,
                      "scale_row_stride"}});
    }
    for (moejit_format f : {MOEJIT_FORMAT_MXFP8_E4M3, MOEJIT_FORMAT_MXFP8_E5M2}) {
      SCOPED_TRACE(moejit_format_name(f));
      for (int g : {32, 64, 128}) {
        MoeSetup sg(f, 256, 128, 3, 2, 4, MOEJIT_DTYPE_BF16, g);
        run_moe_cases(sg, {field(
                              "group " + std::to_string(g), [](moejit_moe_desc&) {}, MOEJIT_OK, "")});
      }
    }
  });
}

TEST_F(Validation, MoeCreateValidityIsCheckedBeforeSupport) {
  const auto INV = MOEJIT_INVALID_ARGUMENT;
  for (moejit_format f : kBlockFormats) {
    SCOPED_TRACE(moejit_format_name(f));
    MoeSetup s(f, 256, 128, 3);
    std::vector<MoeCase> cases = {
        field(
            "hidden 0", [](moejit_moe_desc& d) { d.hidden = 0; }, INV, "hidden"),
        field(
            "top_k > E", [](moejit_moe_desc& d) { d.top_k = 4; }, INV, "top_k"),
        field(
            "scale_dtype f32 on a non-fp8_block format",
            [](moejit_moe_desc& d) { d.scale_dtype = MOEJIT_DTYPE_F32; }, INV, "scale_dtype"),
        field(
            "activation 7", [](moejit_moe_desc& d) { d.activation = static_cast<moejit_activation>(7); }, INV,
            "activation"),
        {"gate_up[2].data NULL", [](auto&, auto& gu, auto&) { gu[2].data = nullptr; }, INV,
         "gate_up[2].data"},
        // K rules (formats.md): hidden = 48 breaks every K % 32 / K % 16 format
        field(
            "hidden 40", [](moejit_moe_desc& d) { d.hidden = 40; }, INV, "hidden"),
        field(
            "intermediate 40", [](moejit_moe_desc& d) { d.intermediate = 40; }, INV, "intermediate"),
    };
    if (f != MOEJIT_FORMAT_Q4_0 && f != MOEJIT_FORMAT_Q8_0) {  // block-scaled formats
      cases.push_back({"down[1].scales NULL", [](auto&, auto&, auto& dn) { dn[1].scales = nullptr; }, INV,
                       "down[1].scales"});
      cases.push_back({"gate_up[0] stride -1", [](auto&, auto& gu, auto&) { gu[0].scale_row_stride = -1; },
                       INV, "gate_up[0].scale_row_stride"});
      cases.push_back({"gate_up[1] stride below the scale columns",
                       [](auto&, auto& gu, auto&) { gu[1].scale_row_stride = 1; }, INV,
                       "gate_up[1].scale_row_stride"});
    }
    if (f == MOEJIT_FORMAT_NVFP4)
      cases.push_back({"gate_up[1].row_scales NULL",
                       [](auto&, auto& gu, auto&) { gu[1].row_scales = nullptr; }, INV,
                       "gate_up[1].row_scales"});
    if (f == MOEJIT_FORMAT_MXFP8_E4M3 || f == MOEJIT_FORMAT_MXFP8_E5M2) {
      for (int g : {16, 48, 256, -32})
        cases.push_back(field(
            "group_size " + std::to_string(g), [g](moejit_moe_desc& d) { d.group_size = g; }, INV,
            "group_size"));
      cases.push_back(field(
          "hidden 96 with group 64",
          [](moejit_moe_desc& d) {
            d.group_size = 64;
            d.hidden = 96;
          },
          INV, "hidden"));
    }
    run_moe_cases(s, cases);
  }
}

// ------------------------------------------------------------------ linear_create

TEST_F(LinearValidation, NullArgumentsAndStructSize) {
  LinearSetup s(MOEJIT_FORMAT_FP8_BLOCK, 200, 300);
  moejit_linear_desc d = s.base;
  moejit_linear* out = reinterpret_cast<moejit_linear*>(uintptr_t(0x10));
  EXPECT_EQ(moejit_linear_create(nullptr, &d, &out), MOEJIT_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_TRUE(message_names("moejit_linear_create", "ctx"));
  out = reinterpret_cast<moejit_linear*>(uintptr_t(0x10));
  EXPECT_EQ(moejit_linear_create(ctx_, nullptr, &out), MOEJIT_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_TRUE(message_names("moejit_linear_create", "desc"));
  EXPECT_EQ(moejit_linear_create(ctx_, &d, nullptr), MOEJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(message_names("moejit_linear_create", "out"));
  run_linear_cases(
      s, {
             {"struct_size 0", [](auto& d) { d.struct_size = 0; }, MOEJIT_INVALID_ARGUMENT, "struct_size"},
             {"struct_size - 1", [](auto& d) { d.struct_size = sizeof(d) - 1; }, MOEJIT_INVALID_ARGUMENT,
              "struct_size"},
             {"struct_size 8", [](auto& d) { d.struct_size = 8; }, MOEJIT_INVALID_ARGUMENT, "struct_size"},
         });
  struct Bigger {
    moejit_linear_desc d;
    uint8_t tail[16];
  } big;
  std::memset(&big, 0, sizeof(big));
  big.d = s.base;
  big.d.struct_size = sizeof(big);
  out = nullptr;
  EXPECT_EQ(moejit_linear_create(ctx_, &big.d, &out), MOEJIT_OK) << last_error();
  moejit_linear_destroy(out);
  big.tail[9] = 1;
  out = reinterpret_cast<moejit_linear*>(uintptr_t(0x10));
  EXPECT_EQ(moejit_linear_create(ctx_, &big.d, &out), MOEJIT_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_TRUE(message_names("moejit_linear_create", "struct_size"));
}

TEST_F(LinearValidation, Fields) {
  // fp8_block [200, 300]: 2 x 3 scale blocks.
  LinearSetup s(MOEJIT_FORMAT_FP8_BLOCK, 200, 300);
  const auto INV = MOEJIT_INVALID_ARGUMENT;
  run_linear_cases(
      s, {
             {"rows 0", [](auto& d) { d.rows = 0; }, INV, "rows"},
             {"rows -1", [](auto& d) { d.rows = -1; }, INV, "rows"},
             {"cols 0", [](auto& d) { d.cols = 0; }, INV, "cols"},
             {"cols min", [](auto& d) { d.cols = INT32_MIN; }, INV, "cols"},
             {"max_tokens 0", [](auto& d) { d.max_tokens = 0; }, INV, "max_tokens"},
             {"max_tokens -2", [](auto& d) { d.max_tokens = -2; }, INV, "max_tokens"},
             {"format 14", [](auto& d) { d.format = static_cast<moejit_format>(14); }, INV, "format"},
             {"format -1", [](auto& d) { d.format = static_cast<moejit_format>(-1); }, INV, "format"},
             {"scale_dtype 2", [](auto& d) { d.scale_dtype = static_cast<moejit_dtype>(2); }, INV,
              "scale_dtype"},
             {"output_dtype 2", [](auto& d) { d.output_dtype = static_cast<moejit_dtype>(2); }, INV,
              "output_dtype"},
             {"output_dtype -1", [](auto& d) { d.output_dtype = static_cast<moejit_dtype>(-1); }, INV,
              "output_dtype"},
             {"weight.data NULL", [](auto& d) { d.weight.data = nullptr; }, INV, "weight.data"},
             {"weight.scales NULL", [](auto& d) { d.weight.scales = nullptr; }, INV, "weight.scales"},
             {"stride -1", [](auto& d) { d.weight.scale_row_stride = -1; }, INV, "weight.scale_row_stride"},
             {"stride 2 < 3 columns", [](auto& d) { d.weight.scale_row_stride = 2; }, INV,
              "weight.scale_row_stride"},
             {"stride 1", [](auto& d) { d.weight.scale_row_stride = 1; }, INV, "weight.scale_row_stride"},
             {"stride 3 (exact)", [](auto& d) { d.weight.scale_row_stride = 3; }, MOEJIT_OK, ""},
             {"stride 8 (padded)", [](auto& d) { d.weight.scale_row_stride = kMaxStride; }, MOEJIT_OK, ""},
             {"f32 scales", [](auto& d) { d.scale_dtype = MOEJIT_DTYPE_F32; }, MOEJIT_OK, ""},
             {"group_size ignored", [](auto& d) { d.group_size = 5; }, MOEJIT_OK, ""},
             {"bias", [&s](auto& d) { d.weight.bias = s.store.bias.data(); }, MOEJIT_OK, ""},
         });
  LinearSetup b(MOEJIT_FORMAT_BF16, 10, 20);
  run_linear_cases(
      b, {{"bf16 scale_dtype f32", [](auto& d) { d.scale_dtype = MOEJIT_DTYPE_F32; }, INV, "scale_dtype"},
          {"bf16 valid", [](auto&) {}, MOEJIT_OK, ""},
          {"1 x 1", [](auto& d) { d.rows = d.cols = 1; }, MOEJIT_OK, ""}});
}

TEST_F(LinearValidation, UnimplementedFormats) {
  for_each_tier([&] {
    const auto INV = MOEJIT_INVALID_ARGUMENT;
    for (moejit_format f : kBlockFormats) {
      SCOPED_TRACE(moejit_format_name(f));
      const bool implemented =
          std::find(std::begin(kUnimplemented), std::end(kUnimplemented), f) == std::end(kUnimplemented);
      LinearSetup s(f, 64, 128);
      std::vector<LinearCase> cases = {
          {"valid request", [](auto&) {}, implemented ? MOEJIT_OK : MOEJIT_UNSUPPORTED,
           implemented ? "" : "format"},
          {"rows 0", [](auto& d) { d.rows = 0; }, INV, "rows"},
          {"cols 40", [](auto& d) { d.cols = 40; }, INV, "cols"},
          {"scale_dtype f32", [](auto& d) { d.scale_dtype = MOEJIT_DTYPE_F32; }, INV, "scale_dtype"},
          {"weight.data NULL", [](auto& d) { d.weight.data = nullptr; }, INV, "weight.data"},
          {"max_tokens 0", [](auto& d) { d.max_tokens = 0; }, INV, "max_tokens"},
      };
      if (f != MOEJIT_FORMAT_Q4_0 && f != MOEJIT_FORMAT_Q8_0) {
        cases.push_back(
            {"weight.scales NULL", [](auto& d) { d.weight.scales = nullptr; }, INV, "weight.scales"});
        cases.push_back(
            {"stride 1", [](auto& d) { d.weight.scale_row_stride = 1; }, INV, "weight.scale_row_stride"});
      }
      if (f == MOEJIT_FORMAT_NVFP4)
        cases.push_back(
            {"row_scales NULL", [](auto& d) { d.weight.row_scales = nullptr; }, INV, "weight.row_scales"});
      if (f == MOEJIT_FORMAT_MXFP8_E4M3 || f == MOEJIT_FORMAT_MXFP8_E5M2) {
        cases.push_back({"group_size 48", [](auto& d) { d.group_size = 48; }, INV, "group_size"});
        cases.push_back({"group 128, cols 64",
                         [](auto& d) {
                           d.group_size = 128;
                           d.cols = 64;
                         },
                         INV, "cols"});
        cases.push_back({"group 64", [](auto& d) { d.group_size = 64; }, MOEJIT_OK, ""});
      }
      run_linear_cases(s, cases);
    }
  });
}
