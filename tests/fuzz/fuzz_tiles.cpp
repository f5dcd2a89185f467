// Fuzz harness for the avx512_amx tier's tile kernels (jit/tile_body.cpp and
// every format's tile decoder): the input picks a format, its group (and
// fp8_block's scale dtype), K, rows, the call's tokens and first slot, the
// weight bytes (kept finite: the codes that mean inf or NaN, and block scales
// outside a range where fp32 cannot overflow, are moved into it) and the
// activations. Each kernel runs on the emulated tile unit (kFlagTileEmu, any
// CPU with avx512_bf16) and, where the CPU has AMX and the OS grants tile
// data, on the tile unit itself.
//
// Oracles: a float64 dot product from the tests' own decoders
// (format_oracle.h, and the per-bit K-quant decoder of kquants_test_util.h),
// within formats.md's bounds (with the flush of bf16 products below 2^-126 to
// zero); each token's bits the same when it is computed alone (batch
// invariance); and weights, scales and activations each ending at an
// inaccessible page, so a read past them faults.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "format_oracle.h"
#include "formats/formats.h"
#include "fuzz_util.h"
#include "jit/cpu.h"
#include "jit/gemv.h"
#include "jit/kernel_cache.h"
#include "jit/x_layout.h"
#include "kquants_test_util.h"

namespace fm = moejit::formats;
namespace jit = moejit::jit;
using fm::Format;

namespace {

// A fuzzed matrix and its kernel key's parts.
struct Case {
  Format f = Format::bf16;
  fm::ScaleDtype sdt = fm::ScaleDtype::bf16;
  int32_t group = 0;
  int64_t k = 0, rows = 0, stride = 0;  // stride: scale elements between scale rows (dense)
  int tokens = 1, c0 = 0;
  fuzz::Guarded w, scales;
  std::vector<float> row_scales, x;  // x: tokens x k
};

// Keeps a code finite: e5m2's inf and NaN codes, e4m3's NaN codes.
uint8_t finite_e5m2(uint8_t b) { return (b & 0x7C) == 0x7C ? uint8_t(b & 0xBB) : b; }
uint8_t finite_e4m3(uint8_t b) { return (b & 0x7F) == 0x7F ? uint8_t(b ^ 1) : b; }
// An fp16 between 2^-10 and 2^3, either sign, from two fuzzed bytes.
uint16_t sane_fp16(uint16_t v) { return uint16_t((v & 0x8000) | (5 + (v >> 10) % 13) << 10 | (v & 0x3FF)); }

// Weight bytes from the input, made finite in the format's terms.
void fill_weights(Case& c, fuzz::Reader& in) {
  const fm::FormatInfo& fi = fm::info(c.f);
  uint8_t* w = c.w.data();
  const size_t n = c.w.size();
  in.fill(w, n);
  switch (fi.element) {
    case fm::Element::bf16:  // exponents 2^-12 .. 2^-7, either sign
      for (size_t i = 1; i < n; i += 2) w[i] = uint8_t((w[i] & 0x80) | (0x3A + w[i] % 6));
      break;
    case fm::Element::e5m2:
      for (size_t i = 0; i < n; ++i) w[i] = finite_e5m2(w[i]);
      break;
    case fm::Element::e4m3:
      for (size_t i = 0; i < n; ++i) w[i] = finite_e4m3(w[i]);
      break;
    default: break;
  }
  if (fi.scales == fm::ScaleKind::inline_fp16)  // q4_0, q8_0: d at the start of every block
    for (size_t b = 0; b < n / size_t(fi.block_bytes); ++b) {
      uint8_t* d = w + b * size_t(fi.block_bytes);
      const uint16_t h = sane_fp16(uint16_t(d[0] | d[1] << 8));
      d[0] = uint8_t(h), d[1] = uint8_t(h >> 8);
    }
  if (fi.scales == fm::ScaleKind::inline_super) {  // the K-quants' d and dmin
    const kquants_test::BitMap bm = kquants_test::bit_map(fm::KQuant(int32_t(c.f)));
    for (size_t b = 0; b < n / size_t(bm.bytes); ++b) {
      uint8_t* blk = w + b * size_t(bm.bytes);
      for (const kquants_test::Field* fld : {&bm.d, &bm.dmin}) {
        if (fld->bits.empty()) continue;
        const uint16_t h = uint16_t(blk[fld->bits[0] / 8] | blk[fld->bits[8] / 8] << 8);
        kquants_test::set_fp16(*fld, blk, sane_fp16(h));
      }
    }
  }
}

// Scale bytes (one dense scale row per weight row, or per 128 rows for
// fp8_block), each a finite scale between about 2^-10 and 2^8.
void fill_scales(Case& c, fuzz::Reader& in) {
  const fm::FormatInfo& fi = fm::info(c.f);
  uint8_t* s = c.scales.data();
  const size_t n = c.scales.size();
  in.fill(s, n);
  switch (fi.scale_code) {
    case fm::ScaleCode::e8m0:
      for (size_t i = 0; i < n; ++i) s[i] = uint8_t(117 + s[i] % 18);
      break;
    case fm::ScaleCode::e4m3:  // nvfp4: any finite code
      for (size_t i = 0; i < n; ++i) s[i] = finite_e4m3(s[i]);
      break;
    case fm::ScaleCode::bf16_f32:
      if (c.sdt == fm::ScaleDtype::f32)
        for (size_t i = 0; i < n / 4; ++i) {
          const float v = std::ldexp(1.0f + float(s[4 * i] % 64) / 64.0f, -10 + s[4 * i + 1] % 12);
          std::memcpy(s + 4 * i, &v, 4);
        }
      else
        for (size_t i = 0; i < n / 2; ++i) {
          const uint16_t h =
              fm::f32_to_bf16(std::ldexp(1.0f + float(s[2 * i] % 64) / 64.0f, -10 + s[2 * i + 1] % 12));
          s[2 * i] = uint8_t(h), s[2 * i + 1] = uint8_t(h >> 8);
        }
      break;
    default: break;
  }
  if (fi.row_globals)
    for (int64_t r = 0; r < c.rows; ++r)
      c.row_scales.push_back(std::ldexp(1.0f + float(in.u8()) / 256.0f, -3));
}

// Builds a case from the input; false when the input names none.
bool make_case(Case& c, fuzz::Reader& in) {
  c.f = Format(in.range(0, fm::kMaxFormatId));
  if (fm::kernel_format(c.f) != c.f) return false;  // ds_fp4: mxfp4's kernels
  const fm::FormatInfo& fi = fm::info(c.f);
  std::vector<int32_t> groups;
  for (int b = 0; b < 32; ++b)
    if ((fi.api_groups >> b) & 1u) groups.push_back(1 << b);
  c.group =
      groups.empty() ? fm::default_group(c.f, 0) : groups[size_t(in.range(0, int64_t(groups.size()) - 1))];
  if (fi.scale_code == fm::ScaleCode::bf16_f32 && in.flag()) c.sdt = fm::ScaleDtype::f32;
  // K: units of the format's block (or group), up to about 1100.
  const int64_t unit = fi.any_k ? 1 : std::max<int64_t>({int64_t(fi.block_elems), c.group, 1});
  c.k = unit * in.range(1, std::max<int64_t>(1, 1100 / unit));
  const char* why = nullptr;
  if (!fm::k_is_valid(c.f, c.group, c.k, &why)) return false;
  c.rows = in.range(1, 40);
  c.tokens = int(in.range(1, jit::XPrep::kTileSlots));
  c.c0 = int(in.range(0, jit::XPrep::kTileSlots - c.tokens));
  c.w.init(size_t(fm::row_bytes(c.f, c.k) * c.rows), true);
  fill_weights(c, in);
  const int64_t cols = fm::scale_cols(c.f, c.group, c.k);
  if (cols > 0) {
    c.stride = cols;
    c.scales.init(size_t(fm::scale_rows(c.f, c.rows) * cols * fm::scale_elem_bytes(c.f, c.sdt)), true);
    fill_scales(c, in);
  }
  c.x.resize(size_t(c.tokens * c.k));
  for (float& v : c.x) {
    const uint16_t u = in.u16();
    v = u % 64 == 0 ? 0.0f : fm::round_bf16(float(int(u % 2001) - 1000) / 997.0f);
  }
  return true;
}

jit::KernelKey key_of(const Case& c, int tokens, uint32_t flags) {
  const fm::FormatInfo& fi = fm::info(c.f);
  jit::KernelKey key;
  key.format = c.f;
  key.k = int32_t(c.k);
  key.rows = int32_t(c.rows);
  key.tokens = tokens;
  key.scale_stride = fi.stride_in_kernel ? c.stride : 0;
  key.scale_dtype = fi.scale_code == fm::ScaleCode::bf16_f32 ? int32_t(c.sdt) : 0;
  key.group = fi.scales == fm::ScaleKind::none ? 0 : c.group;
  key.isa = jit::Isa::avx512_amx;
  key.flags = flags;
  return key;
}

// Runs the kernel for `tokens` tokens of x from token t0, in slots c0.. of a
// prepared buffer that ends at an inaccessible page.
std::vector<float> run(const Case& c, const jit::Kernel& kern, int t0, int c0) {
  const jit::KernelKey& key = kern.key();
  const jit::XPrep prep = jit::x_prep(key.isa, key.format, key.flags);
  const int64_t slots = c0 + key.tokens;
  fuzz::Guarded xb(size_t(prep.buffer_bytes(c.k, slots)), true);
  std::memset(xb.data(), 0, xb.size());
  for (int m = 0; m < key.tokens; ++m)
    prep.store_slot(xb.data(), prep.group_slot(c0, key.tokens, m), c.k, 0, &c.x[size_t((t0 + m) * c.k)], c.k);
  std::vector<float> y(size_t(c.rows * key.tokens), -12345.0f);
  jit::GemvArgs a{};
  a.w = c.w.data();
  a.scales = fm::is_kquant(c.f) ? c.w.data() : (c.scales.size() ? c.scales.data() : nullptr);
  a.row_scales = c.row_scales.empty() ? nullptr : c.row_scales.data();
  a.x = prep.slot_ptr(xb.data(), c.k, c0);
  a.y = y.data();
  a.w_prefetch = c.w.data();
  kern.fn()(&a);
  return y;
}

// Output y of row r, token t against float64 within formats.md's bounds.
void check_row(const Case& c, int64_t r, int t, float got, const char* unit) {
  const float* x = &c.x[size_t(t * c.k)];
  double want = 0, mag = 0, smax = 1, bound = 0;
  if (fm::is_kquant(c.f)) {
    const fm::KQuant q = fm::KQuant(int32_t(c.f));
    const int64_t rb = fm::row_bytes(c.f, c.k);
    kquants_test::float64_row(q, c.w.data() + r * rb, c.k, x, &want, &mag, &smax);
    bound = double(c.k + 64) * (std::ldexp(mag, -24) * 1.001 + std::ldexp(smax, -149)) +
            double(c.k) * 32 * std::ldexp(smax, -126);  // bf16 products flush below 2^-126
  } else {
    moejit_test::oracle::Matrix m;
    m.format = c.f;
    m.scale_dtype = c.sdt;
    m.group = c.group;
    m.k = c.k;
    m.data = c.w.data();
    m.scales = c.scales.size() ? c.scales.data() : nullptr;
    m.scale_stride = c.stride;
    m.row_scales = c.row_scales.empty() ? nullptr : c.row_scales.data();
    for (int64_t kk = 0; kk < c.k; ++kk) {
      const double w = moejit_test::oracle::weight(m, r, kk);
      want += w * double(x[kk]);
      mag += std::fabs(w * double(x[kk]));
    }
    bound = std::ldexp(1.0, -24) * double(c.k + 64) * mag;
  }
  FUZZ_CHECK(
      std::fabs(double(got) - want) <= bound,
      "%s: %s K=%lld rows=%lld tokens=%d slot %d group %d: row %lld token %d = %a, float64 %a, bound %g",
      unit, fm::format_name(c.f), (long long)c.k, (long long)c.rows, c.tokens, c.c0, c.group, (long long)r, t,
      double(got), want, bound);
}

void check_unit(const Case& c, uint32_t flags, const char* unit) {
  std::string err;
  const auto kern = jit::global_cache().get(key_of(c, c.tokens, flags), &err);
  FUZZ_CHECK(kern, "%s: no kernel: %s", unit, err.c_str());
  FUZZ_CHECK(kern->key().isa == jit::Isa::avx512_amx, "%s: %s ran on another tier", unit,
             fm::format_name(c.f));
  const std::vector<float> y = run(c, *kern, 0, c.c0);
  for (int t = 0; t < c.tokens; ++t)
    for (int64_t r = 0; r < c.rows; ++r) check_row(c, r, t, y[size_t(t * c.rows + r)], unit);
  // The last token alone, in slot 0: the same bits.
  const int t = c.tokens - 1;
  const auto one = jit::global_cache().get(key_of(c, 1, flags), &err);
  FUZZ_CHECK(one, "%s: no one-token kernel: %s", unit, err.c_str());
  const std::vector<float> y1 = run(c, *one, t, 0);
  for (int64_t r = 0; r < c.rows; ++r)
    FUZZ_CHECK(std::memcmp(&y1[size_t(r)], &y[size_t(t * c.rows + r)], 4) == 0,
               "%s: %s K=%lld row %lld token %d: %a alone, %a in a call of %d from slot %d", unit,
               fm::format_name(c.f), (long long)c.k, (long long)r, t, double(y1[size_t(r)]),
               double(y[size_t(t * c.rows + r)]), c.tokens, c.c0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Reader in(data, size);
  Case c;
  if (!make_case(c, in)) return 0;
  const bool vbmi = !jit::needs_vbmi(jit::Isa::avx512_amx, c.f, 0) || jit::host_features().avx512_vbmi;
  if (jit::isa_available(jit::Isa::avx512_bf16) && vbmi)
    check_unit(c, jit::kFlagTileEmu, "emulated tile unit");
  if (jit::isa_available(jit::Isa::avx512_amx)) check_unit(c, 0, "tile unit");
  return 0;
}
