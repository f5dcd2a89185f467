#include "formats/format_table.h"

namespace moejit::formats {

namespace {

constexpr uint32_t kMxGroups = (1u << 5) | (1u << 6) | (1u << 7);  // 32, 64, 128
constexpr const char* kMultiple32 = "must be a multiple of 32 for this format";
constexpr const char* kMultiple256 = "must be a multiple of 256 for the K-quants";

// Indexed by id. Columns: id, name, kernel format, element, block elements,
// block bytes, scales, scale code, group, groups the descriptor may pick, any K,
// K rule, per-row globals, stride in kernel, DeepSeek activation numerics,
// sub-block, mins. The K-quants' group is their super-block (one inline d per
// 256 elements, K a multiple of it); their scales are per sub-block.
constexpr FormatInfo kTable[] = {
    {Format::bf16, "bf16", Format::bf16, Element::bf16, 1, 2, ScaleKind::none, ScaleCode::none, 0, 0, true,
     "", false, false, false, 0, false},
    {Format::nvfp4, "nvfp4", Format::nvfp4, Element::e2m1, 2, 1, ScaleKind::row_groups, ScaleCode::e4m3, 16,
     0, false, "must be a multiple of 16 for nvfp4", true, true, false, 0, false},
    {Format::mxfp4, "mxfp4", Format::mxfp4, Element::e2m1, 2, 1, ScaleKind::row_groups, ScaleCode::e8m0, 32,
     0, false, kMultiple32, false, true, false, 0, false},
    {Format::ds_fp4, "ds_fp4", Format::mxfp4, Element::e2m1, 2, 1, ScaleKind::row_groups, ScaleCode::e8m0, 32,
     0, false, kMultiple32, false, true, true, 0, false},
    {Format::q4_0, "q4_0", Format::q4_0, Element::q4_0, 32, 18, ScaleKind::inline_fp16, ScaleCode::none, 32,
     0, false, kMultiple32, false, false, false, 0, false},
    {Format::fp8_block, "fp8_block", Format::fp8_block, Element::e4m3, 1, 1, ScaleKind::tile_128,
     ScaleCode::bf16_f32, 128, 0, true, "", false, false, false, 0, false},
    {Format::q8_0, "q8_0", Format::q8_0, Element::int8, 32, 34, ScaleKind::inline_fp16, ScaleCode::none, 32,
     0, false, kMultiple32, false, false, false, 0, false},
    {Format::mxfp8_e4m3, "mxfp8_e4m3", Format::mxfp8_e4m3, Element::e4m3, 1, 1, ScaleKind::row_groups,
     ScaleCode::e8m0, 32, kMxGroups, false, kMultiple32, false, true, false, 0, false},
    {Format::mxfp8_e5m2, "mxfp8_e5m2", Format::mxfp8_e5m2, Element::e5m2, 1, 1, ScaleKind::row_groups,
     ScaleCode::e8m0, 32, kMxGroups, false, kMultiple32, false, true, false, 0, false},
    {Format::q4_K, "q4_K", Format::q4_K, Element::kquant, 256, 144, ScaleKind::inline_super, ScaleCode::none,
     256, 0, false, kMultiple256, false, false, false, 32, true},
    {Format::q5_K, "q5_K", Format::q5_K, Element::kquant, 256, 176, ScaleKind::inline_super, ScaleCode::none,
     256, 0, false, kMultiple256, false, false, false, 32, true},
    {Format::q6_K, "q6_K", Format::q6_K, Element::kquant, 256, 210, ScaleKind::inline_super, ScaleCode::none,
     256, 0, false, kMultiple256, false, false, false, 16, false},
    {Format::q2_K, "q2_K", Format::q2_K, Element::kquant, 256, 84, ScaleKind::inline_super, ScaleCode::none,
     256, 0, false, kMultiple256, false, false, false, 16, true},
    {Format::q3_K, "q3_K", Format::q3_K, Element::kquant, 256, 110, ScaleKind::inline_super, ScaleCode::none,
     256, 0, false, kMultiple256, false, false, false, 16, false},
};
static_assert(sizeof(kTable) / sizeof(kTable[0]) == kMaxFormatId + 1, "one row per format id");

constexpr bool rows_in_id_order() {
  for (int32_t i = 0; i <= kMaxFormatId; ++i)
    if (int32_t(kTable[i].id) != i) return false;
  return true;
}
static_assert(rows_in_id_order(), "row i describes format id i");

}  // namespace

const FormatInfo& info(Format f) { return kTable[int32_t(f)]; }

}  // namespace moejit::formats
