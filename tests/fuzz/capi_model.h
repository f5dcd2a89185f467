// The fuzz_capi harness's model of the C API: the rules of docs/API.md and
// FORMATS.md it checks statuses against (formats, K rules, scale geometry), and
// the generators of descriptors, matrices and calls it draws from the input
// (valid and invalid fields mixed, memory of exactly the size the library may read).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <vector>

#include "fuzz_util.h"
#include "moejit.h"

namespace fuzz_capi {

using fuzz::Guarded;
using fuzz::Reader;

// ---------------------------------------------------------------- rules of docs/API.md and FORMATS.md

constexpr int kFormats = 14;  // 9..13: the GGUF K-quants (0.2)
// moejit_moe_desc of 0.1 ends at `down`; its size stays valid (docs/API.md).
constexpr size_t kMoeDescV1Size = offsetof(moejit_moe_desc, gate);
// Every format has kernels on every tier. The one valid descriptor a build may
// refuse (UNSUPPORTED) is a MoE layer whose experts' scale strides differ, for
// the formats whose kernels bake the stride (docs/API.md).
inline bool stride_in_kernel(int f) { return f == 1 || f == 2 || f == 3 || f == 7 || f == 8; }
inline bool block_scaled(int f) { return f == 1 || f == 2 || f == 3 || f == 5 || f == 7 || f == 8; }
inline bool mx8(int f) { return f == 7 || f == 8; }
inline bool kquant(int f) { return f >= 9 && f <= 13; }
// K-quants: super-blocks of 256 (K % 256), their bytes: q4_K 144, q5_K 176, q6_K 210, q2_K 84, q3_K 110.
inline int group_of(int f, int32_t group_size) {
  switch (f) {
    case 1: return 16;
    case 5: return 128;
    case 7:
    case 8: return group_size ? group_size : 32;
    default: return kquant(f) ? 256 : 32;
  }
}
inline int64_t row_bytes(int f, int64_t k) {
  static const int64_t kSuperBlock[] = {144, 176, 210, 84, 110};
  switch (f) {
    case 0: return 2 * k;
    case 1:
    case 2:
    case 3: return k / 2;
    case 4: return k / 32 * 18;
    case 6: return k / 32 * 34;
    default: return kquant(f) ? k / 256 * kSuperBlock[f - 9] : k;
  }
}
inline int64_t scale_cols(int f, int group, int64_t k) {
  return block_scaled(f) ? (k + group - 1) / group : 0;
}
// Whether every matrix of a projection resolves to the same scale row stride.
inline bool strides_agree(int f, int group, int64_t k, const std::vector<moejit_matrix>& ms) {
  if (!stride_in_kernel(f) || ms.empty()) return true;
  auto resolved = [&](const moejit_matrix& m) {
    return m.scale_row_stride ? m.scale_row_stride : scale_cols(f, group, k);
  };
  for (const moejit_matrix& m : ms)
    if (resolved(m) != resolved(ms[0])) return false;
  return true;
}
inline int64_t scale_rows(int f, int64_t rows) {
  return !block_scaled(f) ? 0 : f == 5 ? (rows + 127) / 128 : rows;
}
inline int64_t scale_elem(int f, int sdt) { return !block_scaled(f) ? 0 : f == 5 ? (sdt == 1 ? 4 : 2) : 1; }

// Garbage the library must never dereference.
inline const void* garbage(Reader& in) {
  static const uintptr_t kBad[] = {0x10, 0xdead0000, uintptr_t(-4096), 0x7fffffff0000};
  return reinterpret_cast<const void*>(kBad[in.u8() % 4]);
}

template <class E>
inline int32_t raw(const E& field) {
  int32_t v;
  std::memcpy(&v, &field, sizeof(v));
  return v;
}

template <class E>
inline void set_enum(E& field, int32_t v) {
  static_assert(sizeof(E) == sizeof(int32_t), "C enums are int-sized");
  std::memcpy(&field, &v, sizeof(v));  // any int, as a C caller may store
}

// An integer field: mostly in [lo, hi]; sometimes one of `bad` (all invalid by themselves).
inline int32_t pick(Reader& in, int32_t lo, int32_t hi, std::initializer_list<int32_t> bad, bool* invalid) {
  if (bad.size() && in.chance(10)) {
    *invalid = true;
    return bad.begin()[in.u8() % bad.size()];
  }
  return int32_t(in.range(lo, hi));
}

// A descriptor of `size` bytes: the known structure, then (past it) zeros or,
// when `dirty`, one non-zero byte. Exactly `size` bytes are allocated.
template <class Desc>
struct SizedDesc {
  std::vector<uint8_t> bytes;
  const Desc* get() const { return reinterpret_cast<const Desc*>(bytes.data()); }
};

// `older`: the size of an older version of Desc (0 = none), which is valid;
// with `use_older` the descriptor is exactly that: an older caller's.
template <class Desc>
inline SizedDesc<Desc> sized(Reader& in, Desc d, bool* invalid, size_t older = 0, bool use_older = false) {
  uint32_t size = sizeof(Desc);
  bool dirty = false;
  switch (use_older ? 255 : in.u8() % 16) {
    case 255: size = uint32_t(older); break;
    case 0:
      size = uint32_t(in.range(0, sizeof(Desc) - 1)), *invalid = true;  // not a version's size
      if (older && size == older) --size;
      break;
    case 1: size = sizeof(Desc) + uint32_t(in.range(1, 64)); break;  // newer caller, zero tail
    case 2:
      size = sizeof(Desc) + uint32_t(in.range(1, 64)), dirty = true,
      *invalid = true;  // newer caller, fields set
      break;
    default: break;
  }
  d.struct_size = size;
  SizedDesc<Desc> s;
  // Never fewer than the 4 bytes of struct_size itself; nothing past `size` may be read.
  s.bytes.assign(size < 4 ? 4 : size, 0);
  std::memcpy(s.bytes.data(), &d, size < sizeof(Desc) ? (size < 4 ? 4 : size) : sizeof(Desc));
  if (dirty) s.bytes[sizeof(Desc) + size_t(in.range(0, size - sizeof(Desc) - 1))] = uint8_t(in.range(1, 255));
  return s;
}

// ---------------------------------------------------------------- matrices

// One bank: the memory of one [rows, K] matrix (several experts may share it).
struct Bank {
  Guarded data, scales;
  std::vector<uint16_t> bias;
  std::vector<float> row_scales;
  moejit_matrix m{};
  bool invalid = false;  // the model says the library rejects this matrix
};

// Builds a matrix of format f for [rows, k]; with `corrupt`, maybe one invalid field.
inline void make_bank(Reader& in, Bank& b, int f, int sdt, int group, int64_t rows, int64_t k, bool corrupt,
                      bool shapes_valid) {
  std::memset(&b.m, 0, sizeof(b.m));
  const int64_t cols = scale_cols(f, group, k), srows = scale_rows(f, rows);
  int64_t stride = 0;
  if (block_scaled(f)) {
    const int s = in.u8() % 4;
    stride = s == 0 ? 0 : cols + (s == 3 ? in.range(1, 9) : 0);
  } else {
    stride = in.chance(20) ? in.range(0, 1 << 20) : 0;  // ignored, any value >= 0
  }
  const bool at_end = in.flag();
  if (shapes_valid) {
    const int64_t rs = stride ? stride : cols;
    b.data.init(size_t(rows * row_bytes(f, k)), at_end);
    in.fill(b.data.data(), b.data.size());
    if (block_scaled(f)) {
      // The last scale row without its padding.
      b.scales.init(size_t(((srows - 1) * rs + cols) * scale_elem(f, sdt)), !at_end);
      in.fill(b.scales.data(), b.scales.size());
      if (f == 5 && sdt == 0 && in.flag())  // sane bf16 scales: 2^-8 .. 2^7
        for (size_t i = 1; i < b.scales.size(); i += 2) b.scales.data()[i] = uint8_t(0x3B + in.range(0, 7));
      if (f == 5 && sdt == 1 && in.flag())
        for (size_t i = 3; i < b.scales.size(); i += 4) b.scales.data()[i] = uint8_t(0x3B + in.range(0, 7));
    }
    if (f == 1) {
      b.row_scales.resize(size_t(rows));
      for (auto& v : b.row_scales) v = in.f32();
    }
    if (in.chance(64)) {
      b.bias.resize(size_t(rows));
      for (auto& v : b.bias) v = in.u16();
    }
  }
  b.m.data = shapes_valid ? b.data.data() : garbage(in);
  b.m.scales = block_scaled(f) && shapes_valid ? b.scales.data() : garbage(in);
  b.m.scale_row_stride = stride;
  b.m.row_scales = f == 1 && shapes_valid ? b.row_scales.data()
                   : in.flag()            ? static_cast<const float*>(garbage(in))
                                          : nullptr;
  b.m.bias = b.bias.empty() ? nullptr : b.bias.data();
  if (!corrupt) return;
  b.invalid = true;
  switch (in.u8() % 5) {
    case 0: b.m.data = nullptr; break;
    case 1:
      if (block_scaled(f))
        b.m.scales = nullptr;
      else
        b.m.scale_row_stride = -in.range(1, 1 << 30);
      break;
    case 2: b.m.scale_row_stride = -in.range(1, 1000); break;
    case 3:
      if (block_scaled(f) && cols > 1)
        b.m.scale_row_stride = in.range(1, cols - 1);
      else if (block_scaled(f))
        b.m.scale_row_stride = (int64_t(1) << 40) + in.range(1, 1000);  // too large
      else
        b.m.data = nullptr;
      break;
    case 4:
      if (f == 1)
        b.m.row_scales = nullptr;
      else if (block_scaled(f))
        b.m.scale_row_stride = in.flag() ? std::numeric_limits<int64_t>::max() : (int64_t(1) << 41);
      else
        b.m.data = nullptr;
      break;
  }
}

inline size_t out_bytes(int dt) { return dt == MOEJIT_DTYPE_F32 ? 4 : 2; }

inline bool same_bits(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, int dt, size_t* where) {
  const size_t es = out_bytes(dt);
  for (size_t i = 0; i + es <= a.size(); i += es) {
    if (std::memcmp(&a[i], &b[i], es) == 0) continue;
    bool nan_a, nan_b;
    if (es == 4) {
      float x, y;
      std::memcpy(&x, &a[i], 4);
      std::memcpy(&y, &b[i], 4);
      nan_a = std::isnan(x), nan_b = std::isnan(y);
    } else {
      const int va = a[i] | a[i + 1] << 8, vb = b[i] | b[i + 1] << 8;
      nan_a = (va & 0x7F80) == 0x7F80 && (va & 0x7F);
      nan_b = (vb & 0x7F80) == 0x7F80 && (vb & 0x7F);
    }
    if (nan_a && nan_b) continue;  // NaN payloads are not part of the contract
    *where = i / es;
    return false;
  }
  return true;
}

// ---------------------------------------------------------------- calls

struct CallArgs {
  int32_t T = 0;
  std::vector<uint16_t> x;
  std::vector<int32_t> ids;
  std::vector<float> w;
  const uint16_t* xp = nullptr;
  const int32_t* idp = nullptr;
  const float* wp = nullptr;
  bool y_null = false;
  bool invalid = false;
  uint64_t routes = 0;    // non-negative ids
  uint64_t distinct = 0;  // distinct non-negative ids
};

inline CallArgs make_call(Reader& in, int32_t max_tokens, int32_t top_k, int32_t E, int32_t K) {
  CallArgs c;
  switch (in.u8() % 16) {
    case 0: c.T = 0; break;
    case 1: c.T = -int32_t(in.range(1, 3)), c.invalid = true; break;
    case 2: c.T = max_tokens + int32_t(in.range(1, 3)), c.invalid = true; break;
    case 3: c.T = std::numeric_limits<int32_t>::min(), c.invalid = true; break;
    default: c.T = int32_t(in.range(1, max_tokens)); break;
  }
  // Buffers for what a valid call of this size reads (never more than max_tokens rows).
  const int32_t rows = c.T < 0 ? 0 : c.T > max_tokens ? max_tokens : c.T;
  c.x.resize(size_t(rows) * size_t(K));
  for (auto& v : c.x) v = in.chance(16) ? in.u16() : uint16_t((in.u16() & 0x80FF) | 0x3C00);
  c.ids.resize(size_t(rows) * size_t(top_k));
  for (auto& v : c.ids) {
    const uint8_t r = in.u8();
    v = r < 200   ? int32_t(in.range(0, E - 1))
        : r < 230 ? -int32_t(in.range(1, 3))
                  : std::numeric_limits<int32_t>::min();
  }
  if (!c.ids.empty() && in.chance(12)) {
    c.ids[size_t(in.range(0, int64_t(c.ids.size()) - 1))] =
        in.flag() ? E + int32_t(in.range(0, 3)) : std::numeric_limits<int32_t>::max();
    c.invalid = true;
  }
  for (int32_t id : c.ids) c.routes += id >= 0 && id < E;
  std::vector<bool> seen(size_t(E > 0 ? E : 0), false);
  for (int32_t id : c.ids)
    if (id >= 0 && id < E && !seen[size_t(id)]) seen[size_t(id)] = true, ++c.distinct;
  c.w.resize(size_t(rows) * size_t(top_k));
  for (auto& v : c.w) v = in.chance(8) ? in.f32() : float(in.range(-64, 64)) / 32.0f;
  // Empty vectors still give a real (non-NULL) pointer.
  static uint16_t one_x;
  static int32_t one_id;
  static float one_w;
  c.xp = c.x.empty() ? &one_x : c.x.data();
  c.idp = c.ids.empty() ? &one_id : c.ids.data();
  c.wp = c.w.empty() ? &one_w : c.w.data();
  if (c.T > 0 && c.T <= max_tokens) {
    switch (in.u8() % 32) {
      case 0: c.xp = nullptr, c.invalid = true; break;
      case 1: c.idp = nullptr, c.invalid = true; break;
      case 2: c.wp = nullptr, c.invalid = true; break;
      case 3: c.y_null = true, c.invalid = true; break;
      default: break;
    }
  }
  return c;
}

// ---------------------------------------------------------------- projection formats

// One projection's format fields as drawn: valid, or (sometimes) invalid.
struct FormatPick {
  int f = 0;  // the format id; -1 when the id itself is invalid
  int sdt = 0;
  int32_t raw_format = 0, raw_sdt = 0, group_size = 0;
  int fv() const { return f < 0 ? 0 : f; }
  int group() const { return group_of(fv(), group_size); }
  // K must be a multiple of this (formats.md's K rules).
  int32_t k_unit() const { return fv() == 0 || fv() == 5 ? 1 : fv() == 1 ? 16 : group(); }
};

inline FormatPick pick_format(Reader& in, bool* inv) {
  FormatPick p;
  p.f = in.chance(200) ? (in.flag() ? MOEJIT_FORMAT_BF16 : MOEJIT_FORMAT_FP8_BLOCK)
                       : int(in.range(0, kFormats - 1));
  if (in.chance(6)) {
    const int32_t bad[] = {-1, kFormats, 100, std::numeric_limits<int32_t>::min()};
    p.raw_format = bad[in.u8() % 4];
    *inv = true;
    p.f = -1;
  } else {
    p.raw_format = p.f;
  }
  if (p.f == MOEJIT_FORMAT_FP8_BLOCK) {
    p.sdt = in.flag();
    if (in.chance(8))
      p.raw_sdt = int32_t(in.range(2, 5)), *inv = true;
    else
      p.raw_sdt = p.sdt;
  } else if (in.chance(8)) {
    p.raw_sdt = int32_t(in.range(1, 3)), *inv = true;
  }
  if (mx8(p.f)) {
    static const int32_t kOk[] = {0, 32, 64, 128};
    p.group_size = kOk[in.u8() % 4];
    if (in.chance(8)) p.group_size = in.flag() ? int32_t(in.range(1, 31)) : 96, *inv = true;
  } else {
    p.group_size = in.chance(30) ? in.i32() : 0;  // ignored by other formats
  }
  return p;
}

inline moejit_proj_format api_format(const FormatPick& p) {
  moejit_proj_format r;
  set_enum(r.format, p.raw_format);
  set_enum(r.scale_dtype, p.raw_sdt);
  r.group_size = p.group_size;
  return r;
}

// Weight + scale bytes of one [rows, k] matrix as the stats count them (dense scales).
inline uint64_t matrix_bytes(const FormatPick& p, int64_t rows, int64_t k) {
  const int f = p.fv();
  return uint64_t(rows * row_bytes(f, k) +
                  scale_rows(f, rows) * scale_cols(f, p.group(), k) * scale_elem(f, p.sdt) +
                  (f == 1 ? rows * 4 : 0));
}

}  // namespace fuzz_capi
