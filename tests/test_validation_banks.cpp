// moejit_moe_create's 0.2 fields (api.md "Separate banks and per-projection
// formats"): exactly one of gate_up and (gate, up), gate_up_interleaved 0 with
// separate banks, up_format only with them; up_format and down_format checked
// like the layer's own format fields, with the K rule on their projection's K;
// ds_fp4 in every projection or none; each bank's matrices checked in its own
// format; and the 0.1 struct_size, which reads the new fields as zero.
#include <gtest/gtest.h>

#include <climits>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "moejit.h"
#include "test_util.h"
#include "validation_fixture.h"

using namespace moejit_test;

namespace {

const auto INV = MOEJIT_INVALID_ARGUMENT;
const auto OK = MOEJIT_OK;

SplitCase fused(const std::string& name, std::vector<moejit_matrix>* gate_up,
                std::function<void(SplitDesc&)> more, moejit_status want, const std::string& arg) {
  return {name,
          [gate_up, more](SplitDesc& s) {
            s.desc.gate = s.desc.up = nullptr;
            s.desc.up_format = nullptr;
            s.desc.gate_up = gate_up->data();
            more(s);
          },
          want, arg};
}

}  // namespace

TEST_F(Validation, MoeCreateBankForms) {
  // bf16 gate and up [32, 64], fp8_block down [64, 32].
  SplitSetup s(MOEJIT_FORMAT_BF16, MOEJIT_FORMAT_BF16, MOEJIT_FORMAT_FP8_BLOCK, 64, 32, 4);
  std::vector<Store> gu_store;
  for (int e = 0; e < 4; ++e) gu_store.emplace_back(MOEJIT_FORMAT_BF16, MOEJIT_DTYPE_BF16, 32, 64, 64);
  std::vector<moejit_matrix> gu = SplitSetup::matrices(gu_store);
  const auto none = [](SplitDesc&) {};
  run_split_cases(
      s,
      {
          {"separate banks, every format given", none, OK, ""},
          {"separate banks, up_format and down_format NULL: as gate",
           [&s](SplitDesc& d) {
             d.desc.up_format = d.desc.down_format = nullptr;
             d.down = SplitSetup::matrices(s.u_store);  // [32, 64] bf16 storage covers [64, 32]
             d.desc.down = d.down.data();
           },
           OK, ""},
          {"gate_up and gate", [&gu](SplitDesc& d) { d.desc.gate_up = gu.data(); }, INV, "gate_up"},
          {"gate_up and up only",
           [&gu](SplitDesc& d) {
             d.desc.gate_up = gu.data();
             d.desc.gate = nullptr;
           },
           INV, "up"},
          {"gate without up", [](SplitDesc& d) { d.desc.up = nullptr; }, INV, "up"},
          {"up without gate", [](SplitDesc& d) { d.desc.gate = nullptr; }, INV, "gate"},
          {"no gate_up, gate or up",
           [](SplitDesc& d) {
             d.desc.gate = d.desc.up = nullptr;
             d.desc.up_format = nullptr;
           },
           INV, "gate_up"},
          {"separate banks interleaved", [](SplitDesc& d) { d.desc.gate_up_interleaved = 1; }, INV,
           "gate_up_interleaved"},
          {"down NULL", [](SplitDesc& d) { d.desc.down = nullptr; }, INV, "down"},
          fused("fused gate_up with down_format", &gu, none, OK, ""),
          fused(
              "fused gate_up interleaved", &gu, [](SplitDesc& d) { d.desc.gate_up_interleaved = 1; }, OK, ""),
          fused(
              "fused gate_up with up_format", &gu, [](SplitDesc& d) { d.desc.up_format = &d.up_fmt; }, INV,
              "up_format"),
      });
}

TEST_F(Validation, MoeCreateProjectionFormatFields) {
  SplitSetup s(MOEJIT_FORMAT_BF16, MOEJIT_FORMAT_BF16, MOEJIT_FORMAT_BF16, 256, 128, 3);
  run_split_cases(
      s,
      {
          {"up_format->format 100", [](SplitDesc& d) { d.up_fmt.format = static_cast<moejit_format>(100); },
           INV, "up_format->format"},
          {"up_format->format -1", [](SplitDesc& d) { d.up_fmt.format = static_cast<moejit_format>(-1); },
           INV, "up_format->format"},
          {"down_format->format INT_MAX",
           [](SplitDesc& d) { d.down_fmt.format = static_cast<moejit_format>(INT_MAX); }, INV,
           "down_format->format"},
          {"up_format->scale_dtype f32 for bf16",
           [](SplitDesc& d) { d.up_fmt.scale_dtype = MOEJIT_DTYPE_F32; }, INV, "up_format->scale_dtype"},
          {"down_format->scale_dtype 2 for fp8_block",
           [](SplitDesc& d) {
             d.down_fmt.format = MOEJIT_FORMAT_FP8_BLOCK;
             d.down_fmt.scale_dtype = static_cast<moejit_dtype>(2);
           },
           INV, "down_format->scale_dtype"},
          {"down_format->group_size 48 for mxfp8_e4m3",
           [](SplitDesc& d) {
             d.down_fmt.format = MOEJIT_FORMAT_MXFP8_E4M3;
             d.down_fmt.group_size = 48;
           },
           INV, "down_format->group_size"},
          {"up_format->group_size ignored by bf16", [](SplitDesc& d) { d.up_fmt.group_size = 48; }, OK, ""},
          // The layer's own fields are gate's: checked as before.
          {"desc->scale_dtype f32 for bf16", [](SplitDesc& d) { d.desc.scale_dtype = MOEJIT_DTYPE_F32; }, INV,
           "scale_dtype"},
      });
}

TEST_F(Validation, MoeCreateProjectionKRules) {
  // K rules on each projection's own K: H for gate and up, I for down.
  {
    SplitSetup s(MOEJIT_FORMAT_BF16, MOEJIT_FORMAT_BF16, MOEJIT_FORMAT_Q8_0, 64, 40, 3);
    run_split_cases(s, {{"q8_0 down on I = 40", [](SplitDesc&) {}, INV, "intermediate"}});
    EXPECT_TRUE(message_names("moejit_moe_create", "down_format->format"))
        << "names where the format comes from";
  }
  {
    SplitSetup s(MOEJIT_FORMAT_Q8_0, MOEJIT_FORMAT_Q8_0, MOEJIT_FORMAT_BF16, 64, 40, 3);
    run_split_cases(s, {{"q8_0 gate and up on H = 64, bf16 down on I = 40", [](SplitDesc&) {}, OK, ""}});
  }
  {
    SplitSetup s(MOEJIT_FORMAT_BF16, MOEJIT_FORMAT_Q4_0, MOEJIT_FORMAT_BF16, 48, 32, 3);
    run_split_cases(s, {{"q4_0 up on H = 48", [](SplitDesc&) {}, INV, "hidden"}});
    EXPECT_TRUE(message_names("moejit_moe_create", "up_format->format"));
  }
  {
    SplitSetup s(MOEJIT_FORMAT_BF16, MOEJIT_FORMAT_BF16, MOEJIT_FORMAT_MXFP8_E5M2, 64, 192, 3);
    run_split_cases(
        s, {{"mxfp8 down group 128 on I = 192", [](SplitDesc& d) { d.down_fmt.group_size = 128; }, INV,
             "intermediate"},
            {"mxfp8 down group 64 on I = 192", [](SplitDesc& d) { d.down_fmt.group_size = 64; }, OK, ""}});
  }
}

TEST_F(Validation, MoeCreateEachBankInItsOwnFormat) {
  // fp8_block gate, nvfp4 up, mxfp4 down: each bank's matrices need their format's fields.
  SplitSetup s(MOEJIT_FORMAT_FP8_BLOCK, MOEJIT_FORMAT_NVFP4, MOEJIT_FORMAT_MXFP4, 256, 128, 4);
  run_split_cases(
      s, {
             {"valid", [](SplitDesc&) {}, OK, ""},
             {"gate[1].data NULL", [](SplitDesc& d) { d.gate[1].data = nullptr; }, INV, "gate[1].data"},
             {"gate[2].scales NULL", [](SplitDesc& d) { d.gate[2].scales = nullptr; }, INV, "gate[2].scales"},
             {"up[3].row_scales NULL", [](SplitDesc& d) { d.up[3].row_scales = nullptr; }, INV,
              "up[3].row_scales"},
             {"up[0] stride 8 < 16 scale columns", [](SplitDesc& d) { d.up[0].scale_row_stride = 8; }, INV,
              "up[0].scale_row_stride"},
             {"down[2] stride 3 < 4 scale columns", [](SplitDesc& d) { d.down[2].scale_row_stride = 3; }, INV,
              "down[2].scale_row_stride"},
             {"gate[0] stride 1 < 2 scale columns", [](SplitDesc& d) { d.gate[0].scale_row_stride = 1; }, INV,
              "gate[0].scale_row_stride"},
             // Kernels of nvfp4 and mxfp4 bake the stride: one per projection (validity first).
             {"every up with the same explicit stride",
              [](SplitDesc& d) {
                for (auto& m : d.up) m.scale_row_stride = 20;
              },
              OK, ""},
             {"up[2] stride differs from up[0]'s", [](SplitDesc& d) { d.up[2].scale_row_stride = 20; },
              MOEJIT_UNSUPPORTED, "up[2].scale_row_stride"},
             {"down[1] stride differs from down[0]'s", [](SplitDesc& d) { d.down[1].scale_row_stride = 6; },
              MOEJIT_UNSUPPORTED, "down[1].scale_row_stride"},
             {"gate strides may differ (fp8_block reads one scale row per call)",
              [](SplitDesc& d) { d.gate[3].scale_row_stride = 5; }, OK, ""},
             {"differing stride and an invalid field: invalid first",
              [](SplitDesc& d) {
                d.up[2].scale_row_stride = 20;
                d.down[0].data = nullptr;
              },
              INV, "down[0].data"},
         });
}

TEST_F(Validation, MoeCreateDsFp4IsEveryProjectionOrNone) {
  {
    SplitSetup s(MOEJIT_FORMAT_DS_FP4, MOEJIT_FORMAT_DS_FP4, MOEJIT_FORMAT_DS_FP4, 256, 128, 3);
    run_split_cases(s, {
                           {"every projection ds_fp4", [](SplitDesc&) {}, OK, ""},
                           {"up_format and down_format NULL",
                            [](SplitDesc& d) { d.desc.up_format = d.desc.down_format = nullptr; }, OK, ""},
                           {"down mxfp4", [](SplitDesc& d) { d.down_fmt.format = MOEJIT_FORMAT_MXFP4; }, INV,
                            "down_format->format"},
                           {"up mxfp4", [](SplitDesc& d) { d.up_fmt.format = MOEJIT_FORMAT_MXFP4; }, INV,
                            "up_format->format"},
                       });
  }
  SplitSetup s(MOEJIT_FORMAT_MXFP4, MOEJIT_FORMAT_MXFP4, MOEJIT_FORMAT_MXFP4, 256, 128, 3);
  run_split_cases(s, {
                         {"mxfp4 everywhere", [](SplitDesc&) {}, OK, ""},
                         {"down ds_fp4", [](SplitDesc& d) { d.down_fmt.format = MOEJIT_FORMAT_DS_FP4; }, INV,
                          "down_format->format"},
                         {"up ds_fp4", [](SplitDesc& d) { d.up_fmt.format = MOEJIT_FORMAT_DS_FP4; }, INV,
                          "up_format->format"},
                     });
}

TEST_F(Validation, MoeCreateStructSizeOfVersion01) {
  // A 0.1 caller's descriptor ends at `down` (80 bytes on x86-64): accepted, and
  // whatever lies beyond it is never read (the 0.2 fields read as zero).
  MoeSetup s(MOEJIT_FORMAT_FP8_BLOCK, 200, 136, 4);
  const uint32_t v1 = uint32_t(offsetof(moejit_moe_desc, gate));
  EXPECT_EQ(v1, 80u);
  std::vector<moejit_matrix> bad(4);  // garbage a 0.2 library must not follow
  moejit_proj_format bad_fmt{static_cast<moejit_format>(77), static_cast<moejit_dtype>(9), 5};
  run_moe_cases(
      s, {
             field(
                 "0.1 size, zero tail", [v1](moejit_moe_desc& d) { d.struct_size = v1; }, OK, ""),
             field(
                 "0.1 size, garbage past it",
                 [v1, &bad, &bad_fmt](moejit_moe_desc& d) {
                   d.struct_size = v1;
                   d.gate = d.up = bad.data();
                   d.up_format = d.down_format = &bad_fmt;
                 },
                 OK, ""),
             field(
                 "0.1 size without gate_up",
                 [v1, &bad](moejit_moe_desc& d) {
                   d.struct_size = v1;
                   d.gate_up = nullptr;
                   d.gate = d.up = bad.data();
                 },
                 INV, "gate_up"),
             field(
                 "0.2 size with the bad fields", [&bad_fmt](moejit_moe_desc& d) { d.down_format = &bad_fmt; },
                 INV, "down_format->format"),
             field(
                 "between the versions (88)", [v1](moejit_moe_desc& d) { d.struct_size = v1 + 8; }, INV,
                 "struct_size"),
             field(
                 "below 0.1 (72)", [v1](moejit_moe_desc& d) { d.struct_size = v1 - 8; }, INV, "struct_size"),
         });
}
