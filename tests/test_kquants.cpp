// formats/kquants (GGUF K-quants, formats.md ids 9..13): traits, decoders and
// the reference GEMV against computations written independently of
// kquants.cpp (kquants_test_util.h):
//  - a per-bit decoder, checked to cover every bit of the block exactly once;
//  - fp16 values from their fields in double;
//  - the weight formula in double, and the reference GEMV's documented
//    operation order re-implemented on the per-bit decode (bit-exact), as
//    well as a float64 dot product with an error bound against
//    sum(|d sc q x| + |dmin m x|).
// The quantizers are in test_kquants_quantize.cpp; gguf-py and ggml's
// quantizers are the references of crosscheck_kquants.
#include <gtest/gtest.h>

#include "kquants_test_util.h"
#include "rng.h"

using namespace kquants_test;

// ---------------------------------------------------------------- traits

TEST(KQuantFormat, SizesIdsNamesAndKRule) {
  struct Want {
    KQuant f;
    int id;
    const char* name;
    int bytes, subs, sub_size;
    bool mins;
    double bytes_per_weight;  // formats.md "Reference numbers", 4 decimals
  };
  const Want want[] = {{KQuant::q4_K, 9, "q4_K", 144, 8, 32, true, 0.5625},
                       {KQuant::q5_K, 10, "q5_K", 176, 8, 32, true, 0.6875},
                       {KQuant::q6_K, 11, "q6_K", 210, 16, 16, false, 0.8203},
                       {KQuant::q2_K, 12, "q2_K", 84, 16, 16, true, 0.3281},
                       {KQuant::q3_K, 13, "q3_K", 110, 16, 16, false, 0.4297}};
  for (const Want& w : want) {
    const fm::KQuantTraits& t = fm::kquant_traits(w.f);
    EXPECT_EQ(int(w.f), w.id);
    EXPECT_STREQ(fm::kquant_name(w.f), w.name);
    EXPECT_STREQ(t.name, w.name);
    EXPECT_EQ(t.block_bytes, w.bytes) << w.name;
    EXPECT_EQ(t.sub_blocks, w.subs) << w.name;
    EXPECT_EQ(t.sub_block_size, w.sub_size) << w.name;
    EXPECT_EQ(t.sub_blocks * t.sub_block_size, 256) << w.name;
    EXPECT_EQ(t.has_mins, w.mins) << w.name;
    EXPECT_NEAR(t.block_bytes / 256.0, w.bytes_per_weight, 5e-5) << w.name;
    for (int64_t n : {1, 2, 7, 28}) {
      EXPECT_EQ(fm::kquant_row_bytes(w.f, 256 * n), n * w.bytes) << w.name;
      EXPECT_EQ(fm::kquant_sub_sums_len(w.f, 256 * n), 256 * n / w.sub_size) << w.name;
    }
    KQuant g;
    ASSERT_TRUE(fm::kquant_from_id(w.id, &g));
    EXPECT_EQ(g, w.f);
    ASSERT_TRUE(fm::kquant_from_name(w.name, &g));
    EXPECT_EQ(g, w.f);
    // The layout of formats.md takes every byte of the block.
    EXPECT_EQ(bit_map(w.f).bytes, w.bytes);
  }
  KQuant g;
  for (int id : {-1, 0, 4, 8, 14, 100}) EXPECT_FALSE(fm::kquant_from_id(id, &g)) << id;
  for (const char* n : {"Q4_K", "q4_k", "q4_K_M", "", "q8_0"}) EXPECT_FALSE(fm::kquant_from_name(n, &g)) << n;
  for (int64_t k : {256, 512, 768, 7168}) {
    const char* why = nullptr;
    EXPECT_TRUE(fm::kquant_k_is_valid(k, &why)) << k;
  }
  for (int64_t k : {-256, 0, 1, 32, 128, 255, 257, 384, 1000}) {
    const char* why = nullptr;
    EXPECT_FALSE(fm::kquant_k_is_valid(k, &why)) << k;
    EXPECT_TRUE(why && *why) << k;
  }
}

// ---------------------------------------------------------------- decoders

TEST(KQuantFormatDecode, BitMapCoversEveryBitOnce) {
  // Checks the per-bit decoder itself: fields of the right widths that tile the block.
  for (KQuant f : kAll) {
    const BitMap b = bit_map(f);
    std::vector<int> owner(size_t(b.bytes) * 8, 0);
    auto own = [&](const Field& fld, size_t width) {
      EXPECT_EQ(fld.bits.size(), width) << name(f);
      for (int p : fld.bits) ++owner[size_t(p)];
    };
    own(b.d, 16);
    if (b.mins) own(b.dmin, 16);
    const size_t sc_bits = f == KQuant::q6_K ? 8 : f == KQuant::q2_K ? 4 : 6;
    for (int j = 0; j < b.sub_blocks; ++j) {
      own(b.sc[j], sc_bits);
      if (b.mins) own(b.m[j], sc_bits);
    }
    const size_t q_bits = f == KQuant::q4_K   ? 4
                          : f == KQuant::q5_K ? 5
                          : f == KQuant::q6_K ? 6
                          : f == KQuant::q2_K ? 2
                                              : 3;
    for (int i = 0; i < 256; ++i) own(b.q[i], q_bits);
    for (size_t p = 0; p < owner.size(); ++p) EXPECT_EQ(owner[p], 1) << name(f) << " bit " << p;
  }
}

TEST(KQuantFormatDecode, EveryBitFlipChangesOnlyItsField) {
  // Flips each bit of random blocks in turn; every decoded field must equal the
  // per-bit decode of the flipped block (a swapped nibble or shifted field fails).
  moejit_test::Rng rng(11);
  for (KQuant f : kAll) {
    const BitMap b = bit_map(f);
    const fm::KQuantTraits& t = fm::kquant_traits(f);
    std::vector<uint8_t> blocks = random_blocks(f, 4, rng, false);
    int bad = 0;
    for (int n = 0; n < 4; ++n) {
      uint8_t* blk = blocks.data() + n * t.block_bytes;
      for (int p = -1; p < t.block_bytes * 8; ++p) {
        if (p >= 0) blk[p / 8] ^= uint8_t(1 << (p % 8));
        const Decoded o = decode(b, blk);
        bad += !same_or_both_nan(o.d, fm::kquant_d(f, blk));
        bad += !same_or_both_nan(o.dmin, fm::kquant_dmin(f, blk));
        for (int j = 0; j < t.sub_blocks; ++j) {
          const fm::KQuantSub s = fm::kquant_sub(f, blk, j);
          bad += s.sc != o.sc[j] || s.m != o.m[j];
        }
        for (int i = 0; i < 256; ++i) bad += fm::kquant_q(f, blk, i) != o.q[i];
        if (p >= 0) blk[p / 8] ^= uint8_t(1 << (p % 8));
        if (bad) {
          ADD_FAILURE() << name(f) << ": decode differs from the per-bit decode after flipping bit " << p;
          break;
        }
      }
    }
  }
}

TEST(KQuantFormatDecode, EveryValueOfEveryScaleByte) {
  // Each byte of the scale field (q4_K / q5_K / q3_K: 12 packed bytes; q2_K:
  // 16 nibble pairs; q6_K: 16 int8) takes all 256 values, the others random.
  moejit_test::Rng rng(12);
  for (KQuant f : kAll) {
    const BitMap b = bit_map(f);
    const fm::KQuantTraits& t = fm::kquant_traits(f);
    const int first = f == KQuant::q6_K ? 192 : f == KQuant::q2_K ? 0 : f == KQuant::q3_K ? 96 : 4;
    const int len = f == KQuant::q4_K || f == KQuant::q5_K || f == KQuant::q3_K ? 12 : 16;
    std::vector<uint8_t> blk = random_blocks(f, 1, rng, false);
    int checked = 0;
    for (int p = first; p < first + len; ++p)
      for (int v = 0; v < 256; ++v) {
        blk[size_t(p)] = uint8_t(v);
        const Decoded o = decode(b, blk.data());
        for (int j = 0; j < t.sub_blocks; ++j) {
          const fm::KQuantSub s = fm::kquant_sub(f, blk.data(), j);
          ASSERT_EQ(s.sc, o.sc[j]) << name(f) << " byte " << p << " = " << v << " sub-block " << j;
          ASSERT_EQ(s.m, o.m[j]) << name(f) << " byte " << p << " = " << v << " sub-block " << j;
          ++checked;
        }
        // Ranges of the factors (kquants.h).
        for (int j = 0; j < t.sub_blocks; ++j) {
          const fm::KQuantSub s = fm::kquant_sub(f, blk.data(), j);
          const int lo = f == KQuant::q6_K ? -128 : f == KQuant::q3_K ? -32 : 0;
          const int hi = f == KQuant::q6_K ? 127 : f == KQuant::q3_K ? 31 : f == KQuant::q2_K ? 15 : 63;
          ASSERT_TRUE(s.sc >= lo && s.sc <= hi && s.m >= 0 && s.m <= (t.has_mins ? hi : 0)) << name(f);
        }
        blk[size_t(p)] = uint8_t(rng());
      }
    EXPECT_EQ(checked, len * 256 * t.sub_blocks);
  }
}

TEST(KQuantFormatDecode, WeightsMatchTheFormulaForEveryElement) {
  moejit_test::Rng rng(13);
  for (KQuant f : kAll) {
    const BitMap b = bit_map(f);
    const int nb = 6;
    const std::vector<uint8_t> row = random_blocks(f, nb, rng);
    std::vector<float> deq(256 * nb);
    fm::kquant_dequantize_row(f, row.data(), 256 * nb, deq.data());
    for (int64_t k = 0; k < 256 * nb; ++k) {
      const Decoded o = decode(b, row.data() + k / 256 * b.bytes);
      const double want = weight_formula(b, o, int(k % 256));
      const double got = fm::kquant_weight(f, row.data(), k);
      ASSERT_EQ(got, want) << name(f) << " k " << k;
      // The same bytes as a [6, 256] matrix: element (k / 256, k % 256).
      ASSERT_EQ(fm::kquant_weight(f, row.data(), 256, k / 256, k % 256), want) << name(f) << " k " << k;
      // The fp32 row: the exact weight rounded once (as gguf-py's float32).
      ASSERT_EQ(f32_bits(deq[size_t(k)]), f32_bits(float(want))) << name(f) << " k " << k;
    }
  }
}

TEST(KQuantFormatDecode, ExtremeDAndDminPropagate) {
  // fp16 zeros, subnormals, the largest finite, inf and NaN in d and in dmin.
  const uint16_t special[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00,
                              0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF};
  moejit_test::Rng rng(14);
  for (KQuant f : kAll) {
    const BitMap b = bit_map(f);
    for (uint16_t hd : special)
      for (uint16_t hm : special) {
        if (!b.mins && hm != 0) continue;
        std::vector<uint8_t> blk = random_blocks(f, 1, rng);
        set_fp16(b.d, blk.data(), hd);
        if (b.mins) set_fp16(b.dmin, blk.data(), hm);
        const Decoded o = decode(b, blk.data());
        std::vector<float> deq(256);
        fm::kquant_dequantize_row(f, blk.data(), 256, deq.data());
        for (int i = 0; i < 256; ++i) {
          const double want = weight_formula(b, o, i), got = fm::kquant_weight(f, blk.data(), i);
          ASSERT_TRUE(same_or_both_nan(want, got))
              << name(f) << std::hex << " d 0x" << hd << " dmin 0x" << hm << std::dec << " i " << i << ": "
              << got << " want " << want;
          ASSERT_TRUE(same_or_both_nan(double(float(want)), double(deq[size_t(i)]))) << name(f) << " i " << i;
          if (std::isnan(fp16_formula(hd)) || std::isnan(fp16_formula(hm))) {
            ASSERT_TRUE(std::isnan(got));
          }
        }
        // The GEMV: NaN in d or dmin makes the row NaN whatever x is (NaN * 0 is NaN);
        // inf d makes it non-finite; finite scales with finite x give a finite row.
        std::vector<float> x = bf16_x(256, rng);
        float y = 0;
        fm::kquant_gemv(f, blk.data(), 256, 1, x.data(), &y);
        const double d = fp16_formula(hd), dm = b.mins ? fp16_formula(hm) : 0;
        if (std::isnan(d) || std::isnan(dm)) {
          EXPECT_TRUE(std::isnan(y)) << name(f) << std::hex << " d 0x" << hd << " dmin 0x" << hm;
        } else if (std::isinf(d) || std::isinf(dm)) {
          EXPECT_FALSE(std::isfinite(y)) << name(f) << std::hex << " d 0x" << hd << " dmin 0x" << hm;
        } else {
          double want, mag, smax;
          float64_row(f, blk.data(), 256, x.data(), &want, &mag, &smax);
          EXPECT_LE(std::fabs(double(y) - want), gemv_bound(f, 256, mag, smax))
              << name(f) << std::hex << " d 0x" << hd << " dmin 0x" << hm;
        }
        std::vector<float> zero(256, 0.0f);
        fm::kquant_gemv(f, blk.data(), 256, 1, zero.data(), &y);
        if (std::isnan(d) || std::isnan(dm)) {
          EXPECT_TRUE(std::isnan(y)) << name(f) << " x = 0";
        }
      }
  }
}

// ---------------------------------------------------------------- reference GEMV

TEST(KQuantFormatGemv, MatchesTheDocumentedOrderBitForBit) {
  moejit_test::Rng rng(21);
  for (KQuant f : kAll)
    for (int64_t n : {1, 2, 3, 7, 11, 28}) {
      const int64_t k = 256 * n, rows = 5;
      const std::vector<uint8_t> data = random_blocks(f, int(rows * n), rng);
      const std::vector<float> x = bf16_x(k, rng);
      std::vector<float> y(size_t(rows), -1.0f), y2(size_t(rows), -2.0f);
      std::vector<float> sx(size_t(fm::kquant_sub_sums_len(f, k)));
      fm::kquant_sub_sums(f, x.data(), k, sx.data());
      fm::kquant_gemv(f, data.data(), k, rows, x.data(), sx.data(), y.data());
      fm::kquant_gemv(f, data.data(), k, rows, x.data(), y2.data());
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = data.data() + r * fm::kquant_row_bytes(f, k);
        const float want = documented_gemv_row(f, row, k, x.data());
        EXPECT_EQ(f32_bits(y[size_t(r)]), f32_bits(want)) << name(f) << " K " << k << " row " << r;
        EXPECT_EQ(f32_bits(y2[size_t(r)]), f32_bits(want))
            << name(f) << " K " << k << " row " << r << " (no sx)";
      }
    }
}

TEST(KQuantFormatGemv, SubSumsAreSequentialFp32Sums) {
  moejit_test::Rng rng(22);
  for (KQuant f : kAll) {
    const int64_t k = 768, bl = fm::kquant_traits(f).sub_block_size;
    std::vector<float> x = bf16_x(k, rng);
    x[0] = -0.0f;  // +0.0 + -0.0 = +0.0: the sum starts from +0.0
    for (int64_t i = 1; i < bl; ++i) x[size_t(i)] = -0.0f;
    std::vector<float> sx(size_t(k / bl) + 1, 777.0f);
    fm::kquant_sub_sums(f, x.data(), k, sx.data());
    EXPECT_EQ(sx.back(), 777.0f) << name(f) << ": wrote past K / B sums";
    EXPECT_EQ(f32_bits(sx[0]), 0u) << name(f) << ": an all -0.0 sub-block sums to +0.0";
    for (int64_t s = 1; s < k / bl; ++s) {
      volatile float acc = 0.0f;  // one rounding per addition, in k order
      for (int64_t i = s * bl; i < (s + 1) * bl; ++i) acc = acc + x[size_t(i)];
      EXPECT_EQ(f32_bits(sx[size_t(s)]), f32_bits(acc)) << name(f) << " sub-block " << s;
    }
    // The sums of x are what the formats with mins use: a wrong S_x changes the row.
    if (fm::kquant_traits(f).has_mins) {
      const std::vector<uint8_t> row = random_blocks(f, 3, rng);
      float y0, y1;
      fm::kquant_gemv(f, row.data(), k, 1, x.data(), sx.data(), &y0);
      // A sub-block whose min term is not zero (dmin * m[j] != 0): its S_x counts.
      const fm::KQuantTraits& t = fm::kquant_traits(f);
      int64_t s = -1;
      for (int64_t c = 0; c < k / bl && s < 0; ++c) {
        const uint8_t* blk = row.data() + (c / t.sub_blocks) * t.block_bytes;
        if (fm::kquant_dmin(f, blk) != 0.0f && fm::kquant_sub(f, blk, int(c % t.sub_blocks)).m != 0) s = c;
      }
      ASSERT_GE(s, 0) << name(f) << ": the random row has no sub-block with a min";
      sx[size_t(s)] += 1.0f;
      fm::kquant_gemv(f, row.data(), k, 1, x.data(), sx.data(), &y1);
      EXPECT_NE(y0, y1) << name(f);
    }
  }
}

TEST(KQuantFormatGemv, Float64ReferenceWithinBound) {
  // Random blocks and quantized bell-shaped rows, K = 256 n for several n; the
  // bound is taken against sum(|d sc q x| + |dmin m x|), since the two terms cancel.
  moejit_test::Rng rng(23);
  std::normal_distribution<float> nd;
  for (KQuant f : kAll)
    for (int64_t n : {1, 2, 4, 9, 16}) {
      const int64_t k = 256 * n, rows = 6;
      std::vector<uint8_t> data = random_blocks(f, int(rows * n), rng);
      std::vector<float> w(size_t(rows * k));
      for (auto& v : w) v = nd(rng) * 0.02f + 0.01f;
      std::vector<uint8_t> q(size_t(rows * fm::kquant_row_bytes(f, k)));
      ASSERT_TRUE(fm::kquant_quantize(f, rows, k, w.data(), q.data()).ok);
      const std::vector<float> x = bf16_x(k, rng);
      for (const std::vector<uint8_t>* d : {&data, &q}) {
        std::vector<float> y(static_cast<size_t>(rows));
        fm::kquant_gemv(f, d->data(), k, rows, x.data(), y.data());
        for (int64_t r = 0; r < rows; ++r) {
          double want, mag, smax;
          float64_row(f, d->data() + r * fm::kquant_row_bytes(f, k), k, x.data(), &want, &mag, &smax);
          const double err = std::fabs(double(y[size_t(r)]) - want), bound = gemv_bound(f, k, mag, smax);
          EXPECT_LE(err, bound) << name(f) << " K " << k << " row " << r << (d == &q ? " (quantized)" : "")
                                << ": y " << y[size_t(r)] << " float64 " << want;
        }
      }
    }
}

TEST(KQuantFormatGemv, UnalignedRowsGiveTheSameBits) {
  // Engines pass rows where they lie in a mapped file: any address.
  moejit_test::Rng rng(24);
  for (KQuant f : kAll) {
    const int64_t k = 512, rows = 5, rb = fm::kquant_row_bytes(f, k);
    const std::vector<uint8_t> data = random_blocks(f, int(rows * 2), rng);
    const std::vector<float> x = bf16_x(k, rng);
    std::vector<float> want(static_cast<size_t>(rows));
    fm::kquant_gemv(f, data.data(), k, rows, x.data(), want.data());
    for (int off : {1, 3, 5, 7, 13}) {
      std::vector<uint8_t> buf(data.size() + 16, 0xA5);
      std::memcpy(buf.data() + off, data.data(), data.size());
      std::vector<float> y(static_cast<size_t>(rows));
      fm::kquant_gemv(f, buf.data() + off, k, rows, x.data(), y.data());
      std::vector<float> deq(static_cast<size_t>(k));
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_EQ(f32_bits(y[size_t(r)]), f32_bits(want[size_t(r)])) << name(f) << " offset " << off;
        fm::kquant_dequantize_row(f, buf.data() + off + r * rb, k, deq.data());
        for (int64_t i = 0; i < k; i += 37)
          EXPECT_EQ(double(deq[size_t(i)]), double(float(fm::kquant_weight(f, data.data() + r * rb, i))));
      }
    }
  }
}
