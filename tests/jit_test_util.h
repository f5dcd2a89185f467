// Shared by the jit/ white-box suites (test_jit*.cpp): the code paths to
// test, random banks with padded and poisoned scale rows, prepared activations
// and kernel calls (the float64 reference is kernel_reference.h).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "jit/cpu.h"
#include "jit/gemv.h"
#include "kquants_test_util.h"
#include "rng.h"

namespace jit_test {

using moejit::formats::Format;
using moejit::formats::ScaleDtype;
namespace jit = moejit::jit;
namespace fmt = moejit::formats;

struct Variant {
  jit::Isa isa;
  uint32_t flags;
  const char* name;
};

// Every generated code path: tiers, plus the no-VBMI e4m3 decode of
// avx512_bf16, plus avx512_amx's tile kernels on the emulated tile unit
// (kFlagTileEmu), which runs wherever avx512_bf16 does.
inline const Variant kVariants[] = {{jit::Isa::avx2, 0, "avx2"},
                                    {jit::Isa::avx512, 0, "avx512"},
                                    {jit::Isa::avx512_bf16, 0, "avx512_bf16"},
                                    {jit::Isa::avx512_bf16, jit::kFlagNoVbmi, "avx512_bf16_novbmi"},
                                    {jit::Isa::avx512_amx, 0, "avx512_amx"},
                                    {jit::Isa::avx512_amx, jit::kFlagTileEmu, "avx512_amx_emulated"}};

// The tier the variant's kernels run on (the emulated tile unit: avx512_bf16).
inline jit::Isa runs_on(const Variant& v) {
  return (v.flags & jit::kFlagTileEmu) ? jit::Isa::avx512_bf16 : v.isa;
}

// The tier has kernels of its own for the format (avx512_amx: the formats with
// a tile decode) and this CPU runs them.
inline bool variant_available(const Variant& v, Format f) {
  if (!jit::isa_available(runs_on(v))) return false;
  if (v.isa == jit::Isa::avx512_amx && !jit::has_tile_kernels(f, fmt::default_group(f, 0), v.flags))
    return false;
  if (jit::needs_vbmi(v.isa, f, v.flags)) return jit::host_features().avx512_vbmi;
  return true;
}

// Why a test of variant v checked nothing: the CPU lacks the tier, or the
// tier runs another tier's kernels for the test's formats (avx512_amx).
inline std::string skip_message(const Variant& v) {
  if (!jit::isa_available(runs_on(v))) return std::string("this CPU lacks ") + v.name;
  return std::string(v.name) + " has no kernels of its own for these formats (docs/FORMATS.md)";
}

// Prepared activations for one kernel: `tokens` tokens, one call's run, from
// slot c0 of a buffer (XPrep::group_slot: per-token vectors of x_stride(k)
// elements, or one run of tiles). The c0 slots before the run and the slot
// after it are poisoned with NaN (bf16 0x7FC0 or fp32 0x7FC07FC0) that must
// not reach the results.
inline std::vector<uint8_t> prepare_x(const jit::KernelKey& key, const std::vector<float>& x, int c0 = 0) {
  const jit::XPrep prep = jit::x_prep(key.isa, key.format, key.flags);
  const int64_t slots = c0 + key.tokens + 1;
  std::vector<uint8_t> buf(size_t(prep.buffer_bytes(key.k, slots)), 0);
  std::vector<float> nan(size_t(key.k), std::numeric_limits<float>::quiet_NaN());
  for (int64_t s = 0; s < slots; ++s)
    if (s < c0 || s == slots - 1) prep.store_slot(buf.data(), {s, 1, 0}, key.k, 0, nan.data(), key.k);
  for (int m = 0; m < key.tokens; ++m)
    prep.store_slot(buf.data(), prep.group_slot(c0, key.tokens, m), key.k, 0,
                    x.data() + size_t(m) * size_t(key.k), key.k);
  return buf;
}

struct Bank {
  fmt::Layout layout;
  std::vector<uint8_t> w;  // the weights start at w_offset
  size_t w_offset = 0;
  std::vector<uint8_t> scales;
  std::vector<float> row_scales;  // nvfp4 per-row globals
  const uint8_t* wp() const { return w.data() + w_offset; }
  fmt::MatrixRef ref() const {
    return {wp(), scales.empty() ? nullptr : scales.data(), row_scales.empty() ? nullptr : row_scales.data(),
            0};
  }
};

inline bool is_mx8(Format f) {
  return f == Format::mxfp8_e4m3 || f == Format::mxfp8_e5m2 || f == Format::mxfp4;
}

// Random bank with padded, NaN-poisoned scale rows; what each part holds is
// chosen from the format table's row. w_offset: bytes before the first row
// (GGUF rows lie at any byte of a mapped file).
inline Bank make_bank(Format f, ScaleDtype sdt, int64_t rows, int64_t k, moejit_test::Rng& rng,
                      int group = 128, size_t w_offset = 0) {
  const fmt::FormatInfo& fi = fmt::info(f);
  Bank b;
  b.layout.format = f;
  b.layout.scale_dtype = sdt;
  b.layout.group = group;
  b.layout.rows = rows;
  b.layout.k = k;
  const int64_t cols = fmt::scale_cols(f, group, k);
  b.layout.scale_stride = cols + 3;
  b.w.resize(size_t(fmt::row_bytes(f, k) * rows));
  for (size_t i = 0; i < b.w.size(); ++i) b.w[i] = uint8_t(rng());
  if (fi.element == fmt::Element::bf16)  // finite bf16 values in a sane range
    for (size_t i = 1; i < b.w.size(); i += 2) b.w[i] = uint8_t((rng() & 0x80) | (0x3A + rng() % 6));
  if (fi.scales == fmt::ScaleKind::inline_fp16) {  // finite fp16 d at the start of every block
    const size_t bb = size_t(fi.block_bytes);
    for (size_t blk = 0; blk < b.w.size() / bb; ++blk) {
      const uint16_t d = uint16_t((rng() & 0x8000) | ((10 + rng() % 8) << 10) | (rng() & 0x3FF));
      b.w[blk * bb] = uint8_t(d & 0xFF);
      b.w[blk * bb + 1] = uint8_t(d >> 8);
    }
  }
  if (fi.scales == fmt::ScaleKind::inline_super)  // finite d and dmin between 2^-10 and 2^2
    b.w = kquants_test::random_blocks(fmt::KQuant(int32_t(f)), int(rows * k / fi.block_elems), rng);
  if (fi.element == fmt::Element::e5m2)  // finite codes only here (inf/NaN codes have their own test)
    for (auto& w : b.w)
      if ((w & 0x7C) == 0x7C) w &= 0xBB;
  if (fi.scale_code == fmt::ScaleCode::e4m3) {  // nvfp4 (padding: 480, the largest code)
    b.scales.assign(size_t(rows * b.layout.scale_stride), 0x7F);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) b.scales[size_t(r * b.layout.scale_stride + c)] = uint8_t(rng());
  }
  if (fi.row_globals)
    for (int64_t r = 0; r < rows; ++r)
      b.row_scales.push_back(std::ldexp(1.0f + float(rng() % 1000) / 1000.0f, -3));
  if (fi.scale_code == fmt::ScaleCode::e8m0) {
    b.scales.assign(size_t(rows * b.layout.scale_stride), 0xFF);  // e8m0 NaN padding
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        b.scales[size_t(r * b.layout.scale_stride + c)] = uint8_t(118 + rng() % 16);
  }
  if (fi.scale_code == fmt::ScaleCode::bf16_f32) {
    const int64_t srows = fmt::scale_rows(f, rows);
    const size_t eb = sdt == ScaleDtype::f32 ? 4 : 2;
    b.scales.assign(size_t(srows * b.layout.scale_stride) * eb, 0xFF);  // NaN padding
    for (int64_t r = 0; r < srows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float v = std::ldexp(1.0f + float(rng() % 64) / 64.0f, -8 + int(rng() % 4));
        if (sdt == ScaleDtype::f32)
          reinterpret_cast<float*>(b.scales.data())[r * b.layout.scale_stride + c] = v;
        else
          reinterpret_cast<uint16_t*>(b.scales.data())[r * b.layout.scale_stride + c] = fmt::f32_to_bf16(v);
      }
  }
  b.w.insert(b.w.begin(), w_offset, uint8_t(0xA5));
  b.w_offset = w_offset;
  return b;
}

// Runs one kernel on rows [0, key.rows) of the bank (weights at `w` if given),
// its tokens from slot c0 of the prepared x.
inline std::vector<float> run_kernel(const jit::Kernel& kern, const Bank& b, const std::vector<float>& x,
                                     int c0 = 0, const uint8_t* w = nullptr) {
  const jit::KernelKey& key = kern.key();
  std::vector<uint8_t> xp = prepare_x(key, x, c0);
  std::vector<float> y(size_t(key.rows) * size_t(key.tokens), -12345.0f);
  jit::GemvArgs a{};
  a.w = w ? w : b.wp();
  a.scales = b.scales.empty() ? nullptr : b.scales.data();
  if (fmt::is_kquant(key.format)) a.scales = a.w;  // the super-blocks hold the scales (runtime/matmul.cpp)
  a.row_scales = b.row_scales.empty() ? nullptr : b.row_scales.data();
  a.x = jit::x_prep(key.isa, key.format, key.flags).slot_ptr(xp.data(), key.k, c0);
  a.y = y.data();
  a.w_prefetch = b.wp();
  kern.fn()(&a);
  return y;
}

inline jit::KernelKey make_key(const Variant& v, Format f, ScaleDtype sdt, int k, int rows, int tokens,
                               int group = 128, int64_t stride = 0) {
  jit::KernelKey key;
  if (is_mx8(f) || f == Format::nvfp4) {
    key.group = f == Format::nvfp4 ? 16 : group;
    key.scale_stride = stride;
  }
  key.format = f;
  key.k = k;
  key.rows = rows;
  key.tokens = tokens;
  key.scale_dtype = f == Format::fp8_block ? int32_t(sdt) : 0;
  key.isa = v.isa;
  key.flags = v.flags;
  return key;
}

}  // namespace jit_test
