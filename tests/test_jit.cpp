// White-box tests of jit/: properties of the generated kernels of every tier
// this CPU has, called directly (every code of a format, every column of a
// block); the decoders in another body; the kernel cache; W^X code memory.
// Every format x tier against float64 is test_jit_formats.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "jit/cpu.h"
#include "jit/decoder.h"
#include "jit/gemv.h"
#include "jit/generator.h"
#include "jit/kernel_cache.h"
#include "jit/tile_body.h"
#include "jit_test_util.h"
#include "rng.h"

namespace {

using namespace jit_test;

class GemvKernels : public ::testing::TestWithParam<Variant> {};

// Every e4m3 code through the real kernel: row r holds code r in column c, x is
// one-hot at c, scale 1: y[r] must be exactly e4m3(r).
TEST_P(GemvKernels, EveryE4m3Code) {
  const Variant v = GetParam();
  if (!variant_available(v, Format::fp8_block)) GTEST_SKIP() << skip_message(v);
  for (int k : {64, 100}) {
    for (int c : {0, 37, k - 1}) {
      const jit::KernelKey key = make_key(v, Format::fp8_block, ScaleDtype::bf16, k, 128, 1);
      std::string err;
      auto kern = jit::global_cache().get(key, &err);
      ASSERT_TRUE(kern) << err;
      for (int half = 0; half < 2; ++half) {
        Bank b;
        b.layout.format = Format::fp8_block;
        b.layout.rows = 128;
        b.layout.k = k;
        b.layout.scale_stride = 1;
        b.w.assign(size_t(128 * k), 0);
        for (int r = 0; r < 128; ++r) b.w[size_t(r * k + c)] = uint8_t(half * 128 + r);
        b.scales.assign(2, 0);
        reinterpret_cast<uint16_t*>(b.scales.data())[0] = 0x3F80;  // 1.0
        std::vector<float> x(size_t(k), 0.0f);
        x[size_t(c)] = 1.0f;
        const std::vector<float> y = run_kernel(*kern, b, x);
        for (int r = 0; r < 128; ++r) {
          const uint8_t code = uint8_t(half * 128 + r);
          const float want = fmt::e4m3_to_f32(code);
          EXPECT_EQ(y[size_t(r)], want) << key.name() << " code 0x" << std::hex << int(code);
        }
      }
    }
  }
}

// Every 4-bit code in every column of two blocks through the real kernels (the
// nibble order of each decode), and every scale code (e8m0 for mxfp4, e4m3 for
// nvfp4): row r holds one code at column c, x is one-hot at c, so y[r] is exact.
TEST_P(GemvKernels, FourBitEveryCodeEveryColumn) {
  const Variant v = GetParam();
  int checked = 0;
  for (Format f : {Format::mxfp4, Format::nvfp4, Format::q4_0}) {
    if (!variant_available(v, f)) continue;
    const int k = 64, group = f == Format::nvfp4 ? 16 : 32, cols = k / group;
    const int64_t rb = fmt::row_bytes(f, k);
    for (int what = 0; what < 2; ++what) {  // 0: element codes in every column, 1: scale codes
      if (what == 1 && f == Format::q4_0) continue;
      const int rows = what == 0 ? 16 * k : 256;
      Bank b;
      b.layout.format = f;
      b.layout.group = group;
      b.layout.rows = rows;
      b.layout.k = k;
      b.layout.scale_stride = cols;
      b.w.assign(size_t(rows * rb), 0);
      if (f == Format::q4_0)  // every quant 8 (value 0), d = 1.0
        for (int64_t i = 0; i < rows * rb; i += 18) {
          b.w[size_t(i)] = 0x00, b.w[size_t(i + 1)] = 0x3C;
          std::memset(&b.w[size_t(i + 2)], 0x88, 16);
        }
      const uint8_t one_scale = f == Format::nvfp4 ? 0x38 : 127;  // 1.0
      if (f != Format::q4_0) b.scales.assign(size_t(rows * cols), one_scale);
      if (f == Format::nvfp4) b.row_scales.assign(size_t(rows), 1.0f);
      std::vector<int> col_of(static_cast<size_t>(rows)), code_of(static_cast<size_t>(rows));
      for (int r = 0; r < rows; ++r) {
        const int c = what == 0 ? r / 16 : 40 + (r % 2) * 16;
        const int code = what == 0 ? r % 16 : 2;  // e2m1 1.0 for the scale test
        col_of[size_t(r)] = c, code_of[size_t(r)] = code;
        uint8_t* row = &b.w[size_t(r * rb)];
        if (f == Format::q4_0) {  // byte j: element j (low), j + 16 (high)
          uint8_t& byte = row[(c / 32) * 18 + 2 + (c % 32) % 16];
          byte = (c % 32) < 16 ? uint8_t((byte & 0xF0) | code) : uint8_t((byte & 0x0F) | (code << 4));
        } else {
          row[c / 2] = c % 2 ? uint8_t(code << 4) : uint8_t(code);
        }
        if (what == 1) b.scales[size_t(r * cols + c / group)] = uint8_t(r);
      }
      for (int r0 = 0; r0 < rows; r0 += 64) {
        Bank part = b;
        part.w.assign(b.w.begin() + r0 * rb, b.w.begin() + (r0 + 64) * rb);
        if (!b.scales.empty())
          part.scales.assign(b.scales.begin() + r0 * cols, b.scales.begin() + (r0 + 64) * cols);
        if (!b.row_scales.empty())
          part.row_scales.assign(b.row_scales.begin() + r0, b.row_scales.begin() + r0 + 64);
        // one kernel call per column set: x one-hot at each row's column
        for (int c = 0; c < k; ++c) {
          bool used = false;
          for (int i = 0; i < 64; ++i) used |= col_of[size_t(r0 + i)] == c;
          if (!used) continue;
          const jit::KernelKey key = make_key(v, f, ScaleDtype::bf16, k, 64, 1, group, cols);
          std::string err;
          auto kern = jit::global_cache().get(key, &err);
          ASSERT_TRUE(kern) << key.name() << ": " << err;
          std::vector<float> x(size_t(k), 0.0f);
          x[size_t(c)] = 1.0f;
          const std::vector<float> y = run_kernel(*kern, part, x);
          for (int i = 0; i < 64; ++i) {
            const int r = r0 + i;
            if (col_of[size_t(r)] != c) continue;
            const float want = float(fmt::weight(part.layout, part.ref(), i, c));
            if (std::isnan(want))
              EXPECT_TRUE(std::isnan(y[size_t(i)])) << key.name() << " row " << r << " col " << c;
            else
              EXPECT_EQ(y[size_t(i)], want)
                  << key.name() << " row " << r << " col " << c << " code " << code_of[size_t(r)];
          }
        }
      }
      ++checked;
    }
  }
  if (checked == 0) GTEST_SKIP() << skip_message(v);
}

// Every element code of both mxfp8 element types, and every e8m0 scale code,
// through the real kernels: exact values, inf and NaN where the code says so.
TEST_P(GemvKernels, Mxfp8EveryCode) {
  const Variant v = GetParam();
  int checked = 0;
  for (Format f : {Format::mxfp8_e4m3, Format::mxfp8_e5m2}) {
    if (!variant_available(v, f)) continue;
    const int k = 64, group = 32;
    for (int what = 0; what < 2; ++what) {  // 0: element codes, 1: scale codes
      Bank b;
      b.layout.format = f;
      b.layout.group = group;
      b.layout.rows = 256;
      b.layout.k = k;
      b.layout.scale_stride = 2;
      b.w.assign(size_t(256 * k), 0);
      b.scales.assign(size_t(256 * 2), 127);  // 1.0
      const uint8_t one = f == Format::mxfp8_e4m3 ? 0x38 : 0x3C;
      for (int r = 0; r < 256; ++r) {
        b.w[size_t(r * k + 40)] = what == 0 ? uint8_t(r) : one;
        if (what == 1) b.scales[size_t(r * 2 + 1)] = uint8_t(r);
      }
      const jit::KernelKey key = make_key(v, f, ScaleDtype::bf16, k, 64, 1, group, 2);
      std::string err;
      auto kern = jit::global_cache().get(key, &err);
      ASSERT_TRUE(kern) << err;
      std::vector<float> x(size_t(k), 0.0f);
      x[40] = 1.0f;
      for (int r0 = 0; r0 < 256; r0 += 64) {
        Bank part = b;  // rows r0..r0+63
        part.w.assign(b.w.begin() + r0 * k, b.w.begin() + (r0 + 64) * k);
        part.scales.assign(b.scales.begin() + r0 * 2, b.scales.begin() + (r0 + 64) * 2);
        const std::vector<float> y = run_kernel(*kern, part, x);
        for (int i = 0; i < 64; ++i) {
          const int r = r0 + i;
          const float elem = f == Format::mxfp8_e4m3 ? fmt::e4m3_to_f32(uint8_t(what == 0 ? r : one))
                                                     : fmt::e5m2_to_f32(uint8_t(what == 0 ? r : one));
          const float want = elem * fmt::e8m0_to_f32(uint8_t(what == 1 ? r : 127));
          const float got = y[size_t(i)];
          if (std::isnan(want))
            EXPECT_TRUE(std::isnan(got)) << key.name() << " code " << r << " what " << what;
          else
            EXPECT_EQ(got, want) << key.name() << " code " << r << " what " << what;
        }
      }
      ++checked;
    }
  }
  if (checked == 0) GTEST_SKIP() << skip_message(v);
}

INSTANTIATE_TEST_SUITE_P(Tiers, GemvKernels, ::testing::ValuesIn(kVariants),
                         [](const auto& info) { return std::string(info.param.name); });

// The sums of x a decode may ask for (K-quants' S_x): one 64-byte vector after
// each block, each sub-block summed in k order, the activations' slots shifted
// past them; storing in sub-block pieces gives the bytes of one prepare.
TEST(XPrep, SubBlockSumsAfterEachBlock) {
  moejit_test::Rng rng(3);
  const int64_t k = 768;
  for (jit::XLayout lay : {jit::XLayout::bf16, jit::XLayout::bf16_q4, jit::XLayout::f32})
    for (jit::XSums sums : {jit::XSums{32, 256}, jit::XSums{16, 256}}) {
      const jit::XPrep prep(lay, jit::Isa::avx512_bf16, sums);
      EXPECT_EQ(prep.vector_bytes(k), k * int64_t(prep.elem_bytes()) + 3 * jit::kXSumBytes);
      std::vector<uint16_t> src(static_cast<size_t>(k));
      for (auto& e : src) e = fmt::f32_to_bf16(float(int(rng() % 2001) - 1000) / 997.0f);
      std::vector<uint8_t> a(size_t(prep.vector_bytes(k)), 0), b = a;
      prep.prepare(a.data(), src.data(), k);
      std::vector<float> v(static_cast<size_t>(k));
      for (int64_t i = 0; i < k; ++i) v[size_t(i)] = fmt::bf16_to_f32(src[size_t(i)]);
      for (int64_t k0 = 0; k0 < k; k0 += sums.span) prep.store(b.data(), k0, v.data() + k0, sums.span);
      EXPECT_EQ(a, b);
      for (int64_t i = 0; i < k; ++i) {
        const int64_t at = prep.position(i) * int64_t(prep.elem_bytes());
        const int64_t blk = i / sums.block;
        EXPECT_GE(at, blk * (sums.block * int64_t(prep.elem_bytes()) + jit::kXSumBytes));
        float got;
        if (prep.elem_bytes() == 4) {
          std::memcpy(&got, &a[size_t(at)], 4);
        } else {
          uint16_t h;
          std::memcpy(&h, &a[size_t(at)], 2);
          got = fmt::bf16_to_f32(h);
        }
        EXPECT_EQ(got, v[size_t(i)]) << i;
      }
      for (int64_t s0 = 0; s0 < k; s0 += sums.span) {
        float want = 0.0f, got;
        for (int64_t i = s0; i < s0 + sums.span; ++i) want += v[size_t(i)];
        std::memcpy(&got, &a[size_t(prep.sum_offset(s0))], 4);
        EXPECT_EQ(got, want) << s0;
      }
    }
}

// Tile layouts (avx512_amx): a group's tokens are runs of up to 16 slots, each
// run its tokens interleaved as B tiles with rows of 4 * width bytes (a run of
// one token is natural bf16); per-token layouts give each token a slot. Prepare,
// store and copy write the same bytes, zeros at the token's positions past K,
// and nothing outside the slot.
TEST(XPrep, TileRunsPackTheirTokens) {
  const jit::XPrep tile(jit::XLayout::bf16, jit::Isa::avx512_amx),
      flat(jit::XLayout::bf16, jit::Isa::avx512_bf16);
  for (int64_t i : {0, 15, 16, 31, 32, 34}) {
    const jit::XPrep::Slot s = tile.group_slot(5, 35, i), f = flat.group_slot(5, 35, i);
    EXPECT_EQ(s.run, 5 + i / 16 * 16) << i;
    EXPECT_EQ(s.width, i < 32 ? 16 : 3) << i;
    EXPECT_EQ(s.col, i % 16) << i;
    EXPECT_EQ(f.run + f.col, 5 + i) << i;
    EXPECT_EQ(f.width, 1) << i;
  }
  const int64_t k = 100;  // 128 positions: 4 chunks of 32
  const int64_t vb = tile.vector_bytes(k);
  EXPECT_EQ(tile.buffer_bytes(k, 7), 7 * vb);
  std::vector<uint16_t> src(static_cast<size_t>(k));
  std::vector<float> v(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {
    src[size_t(i)] = uint16_t(0x3F80 + i);
    v[size_t(i)] = fmt::bf16_to_f32(src[size_t(i)]);
  }
  for (int width : {1, 3, 16})
    for (int col : {0, width - 1}) {
      const jit::XPrep::Slot s{2, width, col};
      std::vector<uint8_t> a(size_t(vb * (2 + width + 1)), 0xAB), b = a, c = a;
      tile.prepare_slot(a.data(), s, src.data(), k);
      tile.store_slot(b.data(), s, k, 0, v.data(), k);
      EXPECT_EQ(a, b) << width << " " << col;
      std::vector<uint8_t> one(size_t(vb), 0);
      tile.prepare_slot(one.data(), {0, 1, 0}, src.data(), k);
      EXPECT_EQ(0, std::memcmp(one.data(), src.data(), size_t(k) * 2));  // one token: natural order
      tile.copy_slot(c.data(), s, one.data(), {0, 1, 0}, k);
      for (size_t i = 0; i < a.size(); ++i) {
        const int64_t off = int64_t(i) - 2 * vb;
        const int64_t pair = off / (4 * width), in = off % (4 * width);
        const bool mine = off >= 0 && off < width * vb && in / 4 == col;
        if (!mine) {
          EXPECT_EQ(a[i], 0xAB) << width << " " << col << " byte " << i;
          continue;
        }
        const int64_t e = 2 * pair + in % 4 / 2;           // the element this byte holds
        const uint16_t want = e < k ? src[size_t(e)] : 0;  // the token's padding past K is zeroed
        EXPECT_EQ(a[i], uint8_t(in % 2 ? want >> 8 : want)) << width << " " << col << " element " << e;
        if (e < k) {
          EXPECT_EQ(c[i], a[i]) << width << " " << col << " element " << e;
        }
      }
    }
}

// Tile layouts with sums of x (q4_K's and q5_K's tile kernels): after each
// block, one chunk holds the block's sums, sub-block j's as row j of one dword
// per token; the activations keep their places in the other chunks. Prepare
// and store (in sub-block pieces) write the same bytes, copying a token moves
// its sums too, and a run of one token is the per-token layout's vector.
TEST(XPrep, TileRunsCarryTheirSums) {
  moejit_test::Rng rng(5);
  const int64_t k = 512;
  for (jit::XSums sums : {jit::XSums{32, 256}, jit::XSums{16, 256}}) {
    const jit::XPrep tile(jit::XLayout::bf16, jit::Isa::avx512_amx, sums),
        flat(jit::XLayout::bf16, jit::Isa::avx512_bf16, sums);
    const int64_t vb = tile.vector_bytes(k);
    ASSERT_EQ(vb, k * 2 + 2 * jit::kXSumBytes);
    std::vector<uint16_t> src(static_cast<size_t>(k));
    std::vector<float> v(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) {
      src[size_t(i)] = fmt::f32_to_bf16(float(int(rng() % 2001) - 1000) / 997.0f);
      v[size_t(i)] = fmt::bf16_to_f32(src[size_t(i)]);
    }
    std::vector<uint8_t> one(size_t(vb), 0), want(size_t(vb), 0);
    tile.prepare_slot(one.data(), {0, 1, 0}, src.data(), k);
    flat.prepare(want.data(), src.data(), k);
    EXPECT_EQ(one, want);
    for (int width : {1, 5, 16})
      for (int col : {0, width - 1}) {
        const jit::XPrep::Slot s{1, width, col};
        std::vector<uint8_t> a(size_t(vb * (1 + width + 1)), 0), b = a, c = a;
        tile.prepare_slot(a.data(), s, src.data(), k);
        for (int64_t k0 = 0; k0 < k; k0 += sums.span)
          tile.store_slot(b.data(), s, k, k0, &v[size_t(k0)], sums.span);
        EXPECT_EQ(a, b) << width << " " << col;
        tile.copy_slot(c.data(), s, one.data(), {0, 1, 0}, k);
        EXPECT_EQ(a, c) << width << " " << col;
        const uint8_t* run = a.data() + vb;  // the run's first byte (slot 1)
        const int64_t row = 4 * width, chunk = 16 * row;
        for (int64_t i = 0; i < k; ++i) {  // element i: chunk i / 32 plus one per block before it
          const int64_t at = (i / 32 + i / 256) * chunk + i % 32 / 2 * row + 4 * col + i % 2 * 2;
          uint16_t h;
          std::memcpy(&h, run + at, 2);
          ASSERT_EQ(h, src[size_t(i)]) << width << " " << col << " element " << i;
        }
        for (int64_t s0 = 0; s0 < k; s0 += sums.span) {
          float sum = 0.0f, got;
          for (int64_t i = s0; i < s0 + sums.span; ++i) sum += v[size_t(i)];
          const int64_t at = (s0 / 256 * 9 + 8) * chunk + s0 % 256 / sums.span * row + 4 * col;
          std::memcpy(&got, run + at, 4);
          ASSERT_EQ(got, sum) << width << " " << col << " sub-block from " << s0;
        }
      }
  }
}

// Halves layouts (tile kernels of groups of 16: nvfp4, q6_K, q2_K, q3_K): a
// chunk of 32 positions is 16 rows of 8 * width bytes; the first 16 elements
// put token t's pairs in dword t of rows 0-7, the last 16 in dword width + t of
// rows 8-15, and the token's other dword of each row is zero, however the
// buffer was used before (a run of another width). Chunks of sums keep rows of
// 4 * width bytes. Prepare, store and copy write the same bytes.
TEST(XPrep, HalvesRunsPutEachGroupInColumnsOfItsOwn) {
  moejit_test::Rng rng(9);
  for (jit::XSums sums : {jit::XSums{}, jit::XSums{16, 256}}) {
    const int64_t k = sums.span ? 512 : 100;
    const jit::XPrep tile(jit::XLayout::bf16, jit::Isa::avx512_amx, sums, true),
        plain(jit::XLayout::bf16, jit::Isa::avx512_amx, sums);
    ASSERT_TRUE(tile.halves());
    const int64_t vb = tile.vector_bytes(k);
    ASSERT_EQ(vb, 2 * plain.vector_bytes(k));
    std::vector<uint16_t> src(static_cast<size_t>(k));
    std::vector<float> v(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) {
      src[size_t(i)] = fmt::f32_to_bf16(float(int(rng() % 2001) - 1000) / 997.0f);
      v[size_t(i)] = fmt::bf16_to_f32(src[size_t(i)]);
    }
    std::vector<uint8_t> one(size_t(vb), 0);
    tile.prepare_slot(one.data(), {0, 1, 0}, src.data(), k);
    for (int width : {1, 2, 4, 16})
      for (int col : {0, width - 1}) {
        const jit::XPrep::Slot s{1, width, col};
        // The buffer as a run of another width left it: every token's bytes nonzero.
        const int other = width == 1 ? 2 : 1;
        std::vector<uint8_t> a(size_t(vb * (1 + width + 1)), 0xAB);
        for (int t = 0; t < other; ++t) tile.prepare_slot(a.data(), {1, other, t}, src.data(), k);
        std::vector<uint8_t> b = a, c = a, before = a;
        tile.prepare_slot(a.data(), s, src.data(), k);
        for (int64_t k0 = 0; k0 < k; k0 += 16)
          tile.store_slot(b.data(), s, k, k0, &v[size_t(k0)], std::min<int64_t>(16, k - k0));
        tile.copy_slot(c.data(), s, one.data(), {0, 1, 0}, k);
        EXPECT_EQ(a, b) << width << " " << col;
        const uint8_t* run = a.data() + vb;
        const int64_t period = sums.span ? 256 / 32 + 1 : 1 << 30;  // chunks per block, with its sums
        for (int64_t i = 0; i < k; ++i) {
          const int64_t chunk = i / 32 + i / 256 * (sums.span ? 1 : 0), r = i % 32 / 2, h = i % 32 / 16;
          const int64_t dword = chunk * 128 * width + r * 8 * width + 4 * (h * width + col);
          uint16_t got, other_half[2];
          std::memcpy(&got, run + dword + i % 2 * 2, 2);
          ASSERT_EQ(got, src[size_t(i)]) << width << " " << col << " element " << i;
          std::memcpy(other_half, run + dword + (h ? -4 : 4) * width, 4);
          EXPECT_EQ(other_half[0] | other_half[1], 0)
              << width << " " << col << " element " << i << ": the other half";
          EXPECT_EQ(0, std::memcmp(c.data() + vb + dword, run + dword, 4))
              << width << " " << col << " element " << i;
          EXPECT_EQ(0, std::memcmp(c.data() + vb + dword + (h ? -4 : 4) * width, other_half, 4))
              << width << " " << col << " element " << i << ": the other half of the copy";
          ASSERT_LT(chunk % period, period - (sums.span ? 1 : 0));
        }
        if (sums.span)
          for (int64_t blk = 0; blk < k / 256; ++blk)
            for (int j = 0; j < 16; ++j) {
              float sum = 0.0f, got;
              for (int64_t i = blk * 256 + 16 * j; i < blk * 256 + 16 * (j + 1); ++i) sum += v[size_t(i)];
              const int64_t at = (blk * 9 + 8) * 128 * width + j * 4 * width + 4 * col;
              std::memcpy(&got, run + at, 4);
              EXPECT_EQ(got, sum) << width << " " << col << " block " << blk << " sum " << j;
              EXPECT_EQ(0, std::memcmp(c.data() + vb + at, run + at, 4));
            }
        // Nothing outside the token's dwords of its run changed (dwords col and
        // width + col of a row of 8 * width bytes are both col modulo width).
        for (size_t i = 0; i < a.size(); ++i) {
          const int64_t off = int64_t(i) - vb;
          if (off >= 0 && off < width * vb && off % (4 * width) / 4 == col) continue;
          EXPECT_EQ(a[i], before[i]) << width << " " << col << " byte " << i;
        }
      }
  }
}

// A body other than the row body driving a decoder: other registers lent
// (the row body lends 0-9 in order), rows read through one cursor register with
// displacements, the widened vectors stored. This is what a tile body does
// (16 rows widened into a tile buffer); each slot must hold the element the
// prepared-x layout puts there.
class WidenProbe : public jit::Generator {
 public:
  using Fn = void (*)(const void* w, void* out);
  bool build(jit::Decoder& dec, int64_t row_bytes, int rows, std::string* err) {
    using namespace Xbyak;
    const bool zmm = dec.key().isa != jit::Isa::avx2;
    auto v = [&](int i) { return zmm ? Xmm(Zmm(i)) : Xmm(Ymm(i)); };
    jit::DecodeRegs r;
    for (int i = 0; i < 4; ++i) r.w[i] = v(10 + i);
    r.t[0] = v(14);
    r.t[1] = v(15);
    r.scale = v(9);
    for (int i = 0; i < 5; ++i) r.c[i] = v(4 + i);
    r.tmp = rax;
    r.aux = r11;
    r.tail = k1;
    r.scale_row = r8;
    r.rows_left = r9;
    r.count = r10;
    r.src = rcx;
    r.dst = rdx;
    dec.bind(*this, r);
    dec.emit_constants();
    const int n = dec.shape().vectors(), vbytes = zmm ? 64 : 32;
    for (int row = 0; row < rows; ++row) {
      dec.load_widen(jit::Cursor{rdi, row * row_bytes}, 0, dec.shape().step, r.w);
      for (int i = 0; i < n; ++i) vmovups(ptr[rsi + (row * n + i) * vbytes], r.w[i]);
    }
    vzeroupper();
    ret();
    dec.emit_data();
    return finalize(err);
  }
  Fn fn() const { return getCode<Fn>(); }
};

// Element bytes with unit scales, so formats::weight gives each element's value.
Bank unit_bank(Format f, int64_t rows, int64_t k, int group, moejit_test::Rng& rng) {
  Bank b = make_bank(f, ScaleDtype::bf16, rows, k, rng, group);
  const int bb = f == Format::q4_0 ? 18 : 34;
  if (f == Format::q4_0 || f == Format::q8_0)
    for (size_t blk = 0; blk < b.w.size() / size_t(bb); ++blk)
      b.w[blk * size_t(bb)] = 0x00, b.w[blk * size_t(bb) + 1] = 0x3C;  // d = 1.0
  if (f == Format::fp8_block)
    for (size_t i = 0; i + 1 < b.scales.size(); i += 2) b.scales[i] = 0x80, b.scales[i + 1] = 0x3F;  // 1.0
  if (is_mx8(f)) std::fill(b.scales.begin(), b.scales.end(), uint8_t(127));
  if (f == Format::nvfp4) {
    std::fill(b.scales.begin(), b.scales.end(), uint8_t(0x38));
    std::fill(b.row_scales.begin(), b.row_scales.end(), 1.0f);
  }
  return b;
}

TEST(Decoders, LoadWidenIntoAnyRegistersAndRows) {
  moejit_test::Rng rng(17);
  int checked = 0;
  for (const Variant& v : kVariants)
    for (Format f : {Format::bf16, Format::fp8_block, Format::mxfp8_e4m3, Format::mxfp8_e5m2, Format::q8_0,
                     Format::q4_0, Format::mxfp4, Format::nvfp4}) {
      if (!variant_available(v, f)) continue;
      const int group = f == Format::nvfp4 ? 16 : f == Format::fp8_block ? 128 : 32;
      const int k = 256, rows = 3;
      Bank b = unit_bank(f, rows, k, group, rng);
      jit::KernelKey key = make_key(v, f, ScaleDtype::bf16, k, rows, 1, group, b.layout.scale_stride);
      key.group = f == Format::bf16 ? 0 : group;
      std::string err;
      ASSERT_TRUE(jit::gemv_supported(key, &err)) << key.name() << ": " << err;
      auto dec = jit::make_decoder(key);
      ASSERT_TRUE(dec) << key.name();
      WidenProbe probe;
      ASSERT_TRUE(probe.build(*dec, fmt::row_bytes(f, k), rows, &err)) << key.name() << ": " << err;
      const jit::DecodeShape& s = dec->shape();
      const jit::XPrep prep = dec->x_prep();
      const int vbytes = v.isa == jit::Isa::avx2 ? 32 : 64;
      std::vector<uint8_t> out(size_t(rows * s.vectors() * vbytes), 0xEE);
      probe.fn()(b.w.data(), out.data());
      // fp32 widenings through fp16 hold e4m3 * 2^-8 (the row total's factor).
      double factor = 0.0;
      for (int r = 0; r < rows; ++r)
        for (int kk = 0; kk < s.step; ++kk) {
          const int64_t slot = prep.position(kk);
          const uint8_t* at = &out[size_t(r * s.vectors() * vbytes) + size_t(slot) * prep.elem_bytes()];
          double got;
          if (prep.elem_bytes() == 4) {
            float g;
            std::memcpy(&g, at, 4);
            got = g;
          } else {
            uint16_t h;
            std::memcpy(&h, at, 2);
            got = fmt::bf16_to_f32(h);
          }
          const double want = fmt::weight(b.layout, b.ref(), r, kk);
          if (factor == 0.0 && got != 0.0) factor = want / got;
          ASSERT_TRUE(factor == 0.0 || factor == 1.0 || factor == 256.0) << key.name() << " " << factor;
          ASSERT_EQ(got * (factor == 0.0 ? 1.0 : factor), want) << key.name() << " row " << r << " k " << kk;
        }
      ++checked;
    }
  EXPECT_GT(checked, 8);
}

// kFlagLinePrefetch (bf16 on Intel, jit/gemv.h) changes how a kernel
// prefetches, never what it computes: with and without it the kernels give the
// same bits on every tier this CPU runs, for one token and several, while the
// one-token row kernels are different code. Other formats reject it, and the
// runtime sets it on Intel only, for bf16 only.
TEST(LinePrefetch, SameBitsDifferentCode) {
  moejit_test::Rng rng(29);
  int checked = 0;
  for (jit::Isa isa : {jit::Isa::avx2, jit::Isa::avx512, jit::Isa::avx512_bf16, jit::Isa::avx512_amx}) {
    if (!jit::isa_available(isa)) continue;
    for (int k : {1000, 2048, 7168})
      for (int tokens : {1, 2}) {  // avx2 takes two bf16 tokens per call
        const int rows = 17;
        Bank b = make_bank(Format::bf16, ScaleDtype::bf16, rows, k, rng);
        std::vector<float> x(size_t(k) * size_t(tokens));
        for (float& v : x) v = float(int(rng() % 255) - 127) / 64.0f;  // exact in bf16
        jit::KernelKey sparse = make_key({isa, 0, ""}, Format::bf16, ScaleDtype::bf16, k, rows, tokens);
        jit::KernelKey line = sparse;
        line.flags = jit::kFlagLinePrefetch;
        EXPECT_NE(sparse.name(), line.name());
        std::string err;
        auto ks = jit::global_cache().get(sparse, &err);
        ASSERT_TRUE(ks) << sparse.name() << ": " << err;
        auto kl = jit::global_cache().get(line, &err);
        ASSERT_TRUE(kl) << line.name() << ": " << err;
        const std::vector<float> ys = run_kernel(*ks, b, x), yl = run_kernel(*kl, b, x);
        ASSERT_EQ(ys.size(), yl.size());
        EXPECT_EQ(std::memcmp(ys.data(), yl.data(), ys.size() * 4), 0) << line.name();
        if (tokens == 1 &&
            isa != jit::Isa::avx512_amx) {  // the row body: unrolled rows and one prefetch per KiB, or not
          const bool same =
              ks->code_size() == kl->code_size() && std::memcmp(ks->code(), kl->code(), ks->code_size()) == 0;
          EXPECT_FALSE(same) << line.name() << " is the same code as " << sparse.name();
        }
        ++checked;
      }
  }
  if (checked == 0) GTEST_SKIP() << "this CPU has no JIT tier";
}

TEST(LinePrefetch, OnlyForBf16AndOnIntel) {
  for (jit::Isa isa : {jit::Isa::avx2, jit::Isa::avx512, jit::Isa::avx512_bf16, jit::Isa::avx512_amx})
    for (int32_t id = 0; id <= fmt::kMaxFormatId; ++id) {
      const Format f = Format(id);
      if (!fmt::known_format(id)) continue;
      const bool hw = !jit::streams_with_prefetch(f);
      EXPECT_EQ(hw, f == Format::bf16) << fmt::info(f).name;
      const uint32_t flags = jit::runtime_flags(isa, f, fmt::default_group(f, 0));
      EXPECT_EQ((flags & jit::kFlagLinePrefetch) != 0, hw && jit::host_features().intel)
          << fmt::info(f).name << " on " << jit::isa_name(isa);
      EXPECT_EQ(jit::prefetches_far(f, flags), !hw || (flags & jit::kFlagLinePrefetch));
      EXPECT_TRUE(jit::prefetches_far(f, jit::kFlagLinePrefetch));
    }
  for (jit::Isa isa : {jit::Isa::avx2, jit::Isa::avx512, jit::Isa::avx512_bf16}) {
    if (!jit::isa_available(isa)) continue;
    for (Format f : {Format::fp8_block, Format::q4_K}) {
      jit::KernelKey key = make_key({isa, jit::kFlagLinePrefetch, ""}, f, ScaleDtype::bf16, 256, 4, 1);
      if (f == Format::q4_K) key.group = 256;
      std::string why;
      EXPECT_FALSE(jit::gemv_supported(key, &why)) << key.name();
      EXPECT_NE(why.find("line-prefetch flag"), std::string::npos) << why;
    }
  }
}

// kFlagNearL1 is for the row kernels (the tile body has no near prefetch), and
// the runtime sets it on Intel only, for the AVX-512 tiers' row kernels.
TEST(NearL1Prefetch, OnlyRowKernelsAndOnIntel) {
  for (jit::Isa isa : {jit::Isa::avx2, jit::Isa::avx512, jit::Isa::avx512_bf16, jit::Isa::avx512_amx})
    for (int32_t id = 0; id <= fmt::kMaxFormatId; ++id) {
      const Format f = Format(id);
      if (!fmt::known_format(id)) continue;
      const uint32_t flags = jit::runtime_flags(isa, f, fmt::default_group(f, 0));
      const bool avx512_rows = isa == jit::Isa::avx512 || isa == jit::Isa::avx512_bf16;
      EXPECT_EQ((flags & jit::kFlagNearL1) != 0, avx512_rows && jit::host_features().intel)
          << fmt::info(f).name << " on " << jit::isa_name(isa);
    }
  jit::KernelKey key =
      make_key({jit::Isa::avx512_amx, jit::kFlagNearL1, ""}, Format::bf16, ScaleDtype::bf16, 256, 16, 1);
  std::string why;
  EXPECT_FALSE(jit::gemv_supported(key, &why, /*run_here=*/false)) << key.name();
  EXPECT_NE(why.find("near-L1 prefetch flag"), std::string::npos) << why;
  key.isa = jit::Isa::avx512_bf16;
  EXPECT_TRUE(jit::gemv_supported(key, &why, /*run_here=*/false)) << key.name() << ": " << why;
}

TEST(KernelKey, NameHashEquality) {
  jit::KernelKey a;
  a.format = Format::fp8_block;
  a.k = 2048;
  a.rows = 16;
  a.tokens = 4;
  a.scale_stride = 16;
  a.isa = jit::Isa::avx512_bf16;
  EXPECT_EQ(a.name(), "fp8_block_k2048_r16_m4_s16_bf16_avx512bf16");
  jit::KernelKey b = a;
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.hash(), b.hash());
  b.isa = jit::Isa::avx512;  // the ISA is part of the key
  EXPECT_NE(a, b);
  EXPECT_NE(a.hash(), b.hash());
  b = a;
  b.scale_dtype = 1;
  EXPECT_NE(a.name(), b.name());
}

TEST(KernelCache, SharesAndReleases) {
  if (!jit::isa_available(jit::Isa::avx2)) GTEST_SKIP() << "this CPU lacks avx2";
  jit::KernelCache cache;
  jit::KernelKey key;
  key.format = Format::bf16;
  key.k = 96;
  key.rows = 4;
  key.tokens = 1;
  key.isa = jit::Isa::avx2;
  std::string err;
  auto a = cache.get(key, &err);
  auto b = cache.get(key, &err);
  ASSERT_TRUE(a && b) << err;
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(cache.generated_count(), 1u);
  EXPECT_EQ(cache.size(), 1u);
  a.reset();
  b.reset();  // last user gone: the code is released, the entry dropped, generated again on demand
  EXPECT_EQ(cache.size(), 0u);
  auto c = cache.get(key, &err);
  ASSERT_TRUE(c);
  EXPECT_EQ(cache.generated_count(), 2u);
  // A failed generation is reported and not cached.
  jit::KernelKey bad = key;
  bad.tokens = 1000;
  EXPECT_FALSE(cache.get(bad, &err));
  EXPECT_FALSE(err.empty());
  EXPECT_FALSE(cache.get(bad, &err));
}

TEST(KernelCache, RejectsTiersTheCpuLacks) {
  for (jit::Isa isa : {jit::Isa::avx2, jit::Isa::avx512, jit::Isa::avx512_bf16}) {
    jit::KernelKey key;
    key.format = Format::bf16;
    key.k = 64;
    key.rows = 1;
    key.tokens = 1;
    key.isa = isa;
    std::string why;
    EXPECT_EQ(jit::gemv_supported(key, &why), jit::isa_available(isa)) << jit::isa_name(isa) << ": " << why;
  }
}

// No mapping of the process is writable and executable after generating every
// format x tier kernel; the largest kernels (most tokens per call, a tail
// block) stay well inside the fixed code buffer.
TEST(CodeMemory, NeverWritableAndExecutable) {
  std::vector<std::shared_ptr<const jit::Kernel>> keep;
  for (const Variant& v : kVariants)
    for (int32_t id = 0; id <= fmt::kMaxFormatId; ++id) {
      const Format f = Format(id);
      if (!variant_available(v, f)) continue;
      const int group = f == Format::nvfp4 ? 16 : f == Format::fp8_block ? 128 : fmt::is_kquant(f) ? 256 : 32;
      // K-quants: K of DeepSeek-V3's hidden (the other two are not multiples of 256).
      for (int k : {300, 2880 + group, fmt::is_kquant(f) ? 7168 : 300}) {
        const char* bad = nullptr;
        if (!fmt::k_is_valid(f, group, k, &bad)) continue;
        jit::KernelKey key = make_key(v, f, ScaleDtype::bf16, k, 16, 1, group);
        key.tokens = jit::max_tokens_per_call(v.isa, f);
        std::string why;
        if (!jit::gemv_supported(key, &why) && why.find("no generated kernel") != std::string::npos) continue;
        auto kern = jit::global_cache().get(key, &why);
        ASSERT_TRUE(kern) << key.name() << ": " << why;
        const size_t buffer = (v.flags & jit::kFlagTileEmu) ? jit::kTileEmuCodeBytes : jit::kMaxCodeBytes;
        EXPECT_LT(kern->code_size(), buffer / 2) << key.name();
        keep.push_back(kern);
      }
    }
  ASSERT_GE(keep.size(), 8u);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int exec_maps = 0;
  while (std::getline(maps, line)) {
    const size_t sp = line.find(' ');
    const std::string perms = line.substr(sp + 1, 4);
    if (perms[2] == 'x') ++exec_maps;
    EXPECT_FALSE(perms[1] == 'w' && perms[2] == 'x') << "writable+executable mapping: " << line;
  }
  EXPECT_GT(exec_maps, 0);
}

}  // namespace
