// The K-quants' argument rules (api.md, formats.md rows 9..13): K % 256 on
// each projection's own K (H for gate and up, I for down; a linear layer's
// cols), with messages that state the rule and name the format and where it
// comes from; scale_dtype must be 0; group_size, scales and row_scales are
// ignored, as for q4_0 and q8_0.
#include <gtest/gtest.h>

#include <string>

#include "moejit.h"
#include "test_util.h"
#include "validation_fixture.h"

using namespace moejit_test;

namespace {

const auto INV = MOEJIT_INVALID_ARGUMENT;
const auto OK = MOEJIT_OK;
const moejit_format kKQuants[] = {MOEJIT_FORMAT_Q4_K, MOEJIT_FORMAT_Q5_K, MOEJIT_FORMAT_Q6_K,
                                  MOEJIT_FORMAT_Q2_K, MOEJIT_FORMAT_Q3_K};

bool last_error_has(const std::string& text) { return last_error().find(text) != std::string::npos; }

TEST_F(Validation, KQuantMoeRules) {
  for (moejit_format f : kKQuants) {
    SCOPED_TRACE(moejit_format_name(f));
    MoeSetup s(f, 512, 256, 3);
    run_moe_cases(
        s, {
               field(
                   "valid", [](moejit_moe_desc&) {}, OK, ""),
               field(
                   "group_size ignored", [](moejit_moe_desc& d) { d.group_size = 48; }, OK, ""),
               {"scales and row_scales ignored",
                [](auto&, auto& gu, auto& dn) {
                  gu[0].scales = dn[1].scales = &gu;
                  gu[1].row_scales = reinterpret_cast<const float*>(&dn);
                  gu[2].scale_row_stride = 7;
                },
                OK, ""},
               field(
                   "scale_dtype f32", [](moejit_moe_desc& d) { d.scale_dtype = MOEJIT_DTYPE_F32; }, INV,
                   "scale_dtype"),
               field(
                   "hidden 384", [](moejit_moe_desc& d) { d.hidden = 384; }, INV, "hidden"),
               field(
                   "hidden 128", [](moejit_moe_desc& d) { d.hidden = 128; }, INV, "hidden"),
               field(
                   "intermediate 320", [](moejit_moe_desc& d) { d.intermediate = 320; }, INV, "intermediate"),
           });
    moejit_moe_desc d = s.base;
    std::vector<moejit_matrix> gu = s.gu(), dn = s.dn();
    d.gate_up = gu.data();
    d.down = dn.data();
    d.hidden = 384;
    moejit_moe* out = nullptr;
    EXPECT_EQ(moejit_moe_create(ctx_, &d, &out), INV);
    const std::string want =
        std::string("desc->hidden = 384 must be a multiple of 256 for the K-quants (format ") +
        moejit_format_name(f) + ")";
    EXPECT_TRUE(last_error_has(want)) << last_error();
  }
}

TEST_F(Validation, KQuantProjectionRules) {
  {  // Q4_K_M: gate and up q4_K, down q6_K; each K rule on its projection's K
    SplitSetup s(MOEJIT_FORMAT_Q4_K, MOEJIT_FORMAT_Q4_K, MOEJIT_FORMAT_Q6_K, 512, 256, 3);
    run_split_cases(s, {{"valid", [](SplitDesc&) {}, OK, ""}});
  }
  {
    SplitSetup s(MOEJIT_FORMAT_BF16, MOEJIT_FORMAT_BF16, MOEJIT_FORMAT_Q6_K, 256, 384, 3);
    run_split_cases(s, {{"q6_K down on I = 384", [](SplitDesc&) {}, INV, "intermediate"}});
    EXPECT_TRUE(message_names("moejit_moe_create", "down_format->format"));
    EXPECT_TRUE(last_error_has(
        "must be a multiple of 256 for the K-quants (format q6_K of desc->down_format->format)"))
        << last_error();
  }
  {
    SplitSetup s(MOEJIT_FORMAT_Q8_0, MOEJIT_FORMAT_Q5_K, MOEJIT_FORMAT_Q8_0, 320, 256, 3);
    run_split_cases(s, {{"q5_K up on H = 320", [](SplitDesc&) {}, INV, "hidden"}});
    EXPECT_TRUE(message_names("moejit_moe_create", "up_format->format"));
  }
  {  // K-quants beside the other formats, I a multiple of 256 only for down
    SplitSetup s(MOEJIT_FORMAT_Q2_K, MOEJIT_FORMAT_Q3_K, MOEJIT_FORMAT_BF16, 768, 96, 3);
    run_split_cases(
        s, {{"K-quant gate and up on H = 768, bf16 down on I = 96", [](SplitDesc&) {}, OK, ""},
            {"up_format->scale_dtype 1 for q3_K",
             [](SplitDesc& d) { d.up_fmt.scale_dtype = MOEJIT_DTYPE_F32; }, INV, "up_format->scale_dtype"}});
  }
}

TEST_F(LinearValidation, KQuantRules) {
  for (moejit_format f : kKQuants) {
    SCOPED_TRACE(moejit_format_name(f));
    LinearSetup s(f, 40, 768);
    run_linear_cases(
        s, {
               {"valid", [](auto&) {}, OK, ""},
               {"cols 300", [](auto& d) { d.cols = 300; }, INV, "cols"},
               {"cols 255", [](auto& d) { d.cols = 255; }, INV, "cols"},
               {"scale_dtype f32", [](auto& d) { d.scale_dtype = MOEJIT_DTYPE_F32; }, INV, "scale_dtype"},
               {"weight.scales ignored", [](auto& d) { d.weight.scales = &d; }, OK, ""},
           });
  }
}

}  // namespace
