#include "runtime/capi_check.h"

#include <cstdio>
#include <string>

#include "runtime/error.h"

namespace moejit::capi {

namespace fmt = moejit::formats;

bool check_struct_size(const char* fn, const char* what, const void* desc, uint32_t size, size_t known,
                       moejit_status* st, size_t older) {
  if (older != 0 && size == older) return true;
  if (size < known) {
    if (older != 0)
      *st = fail(MOEJIT_INVALID_ARGUMENT, fn,
                 "%s->struct_size = %u is smaller than %zu and not the size of an older version (%zu)", what,
                 size, known, older);
    else
      *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%s->struct_size = %u is smaller than %zu", what, size, known);
    return false;
  }
  const auto* p = static_cast<const uint8_t*>(desc);
  for (size_t i = known; i < size; ++i) {
    if (p[i] != 0) {
      *st = fail(MOEJIT_INVALID_ARGUMENT, fn,
                 "%s->struct_size = %u is larger than %zu and byte %zu beyond the known fields is not zero",
                 what, size, known, i);
      return false;
    }
  }
  return true;
}

moejit_status internal_error(const char* fn) {
  return fail(MOEJIT_INTERNAL_ERROR, fn, "unexpected internal error");
}
moejit_status out_of_memory(const char* fn) { return fail(MOEJIT_OUT_OF_MEMORY, fn, "out of memory"); }

bool check_format_args(const char* fn, const FormatArgs& a, moejit_status* st, const char* prefix) {
  if (!fmt::known_format(a.format)) {
    *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%sformat = %d is not a known format (0..%d)", prefix, a.format,
               fmt::kMaxFormatId);
    return false;
  }
  const fmt::FormatInfo& fi = fmt::info(static_cast<fmt::Format>(a.format));
  if (fi.scale_code == fmt::ScaleCode::bf16_f32) {
    if (a.scale_dtype != MOEJIT_DTYPE_BF16 && a.scale_dtype != MOEJIT_DTYPE_F32) {
      *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%sscale_dtype = %d must be 0 (bf16) or 1 (f32) for %s", prefix,
                 a.scale_dtype, fi.name);
      return false;
    }
  } else if (a.scale_dtype != 0) {
    *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%sscale_dtype = %d must be 0 for format %s", prefix,
               a.scale_dtype, fi.name);
    return false;
  }
  if (fi.api_groups && a.group_size != 0 && !fmt::api_group_allowed(fi, a.group_size)) {
    std::string allowed = "0";  // the groups the row allows, as "0, 32, 64 or 128"
    for (int b = 0; b < 31; ++b)
      if (fi.api_groups >> b & 1u)
        allowed += (fi.api_groups >> (b + 1) ? ", " : " or ") + std::to_string(1 << b);
    *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%sgroup_size = %d must be %s for %s", prefix, a.group_size,
               allowed.c_str(), fi.name);
    return false;
  }
  return true;
}

bool check_k(const char* fn, const char* what, fmt::Format f, int32_t group, int64_t k, moejit_status* st,
             const char* format_field) {
  const char* why = "";
  if (!fmt::k_is_valid(f, group, k, &why)) {
    if (format_field)
      *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%s = %lld %s (format %s of %s)", what, (long long)k, why,
                 fmt::format_name(f), format_field);
    else
      *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%s = %lld %s (format %s)", what, (long long)k, why,
                 fmt::format_name(f));
    return false;
  }
  return true;
}

bool check_matrix(const char* fn, const char* name, const moejit_matrix& m, fmt::Format f, int32_t group,
                  int64_t rows, int64_t k, moejit_status* st) {
  if (!m.data) {
    *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%s.data is NULL", name);
    return false;
  }
  if (fmt::has_block_scales(f)) {
    if (!m.scales) {
      *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%s.scales is NULL (format %s needs block scales)", name,
                 fmt::format_name(f));
      return false;
    }
    const int64_t cols = fmt::scale_cols(f, group, k);
    if (m.scale_row_stride < 0) {
      *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%s.scale_row_stride = %lld is negative", name,
                 (long long)m.scale_row_stride);
      return false;
    }
    if (m.scale_row_stride != 0 && m.scale_row_stride < cols) {
      *st = fail(MOEJIT_INVALID_ARGUMENT, fn,
                 "%s.scale_row_stride = %lld is smaller than the %lld scale columns", name,
                 (long long)m.scale_row_stride, (long long)cols);
      return false;
    }
    const int64_t srows = fmt::scale_rows(f, rows);
    const int64_t stride = m.scale_row_stride ? m.scale_row_stride : cols;
    if (stride > (int64_t(1) << 40) || srows * stride > (int64_t(1) << 46)) {
      *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%s.scale_row_stride = %lld is too large", name,
                 (long long)m.scale_row_stride);
      return false;
    }
  } else if (m.scale_row_stride < 0) {
    *st = fail(MOEJIT_INVALID_ARGUMENT, fn, "%s.scale_row_stride = %lld is negative", name,
               (long long)m.scale_row_stride);
    return false;
  }
  if (fmt::has_row_scales(f) && !m.row_scales) {
    *st =
        fail(MOEJIT_INVALID_ARGUMENT, fn, "%s.row_scales is NULL (nvfp4 needs per-row global scales)", name);
    return false;
  }
  return true;
}

}  // namespace moejit::capi
