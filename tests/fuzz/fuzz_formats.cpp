// Fuzz harness for formats/: every scalar element decoder, f32_to_bf16 and
// round_bf16, the layout traits, weight() and gemv_scalar() on small fuzzed
// layouts of all fourteen formats, and quantize() into those layouts; and the GGUF
// K-quants of formats/kquants (decoders, reference GEMV, quantizers) on
// arbitrary super-block bytes and fp32 inputs.
//
// Oracles: an independent decoder written here from docs/FORMATS.md (bit
// fields, not the library's code), exact equality for every decoded element and
// weight (all exact in double), round-to-nearest-even for f32_to_bf16, and an
// error bound for gemv_scalar against a float64 dot product. Buffers are exactly
// the size the layout needs (the last scale row without its padding), so
// ASan reports any read past them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "format_oracle.h"
#include "formats/formats.h"
#include "formats/kquants.h"
#include "formats/quantize.h"
#include "fuzz_util.h"

namespace fm = moejit::formats;
using fm::Format;

namespace {

// ---------------------------------------------------------------- reference decoders

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

namespace oracle = moejit_test::oracle;
using oracle::Parts;
double ref_bf16(uint16_t v) { return oracle::bf16(v); }
double ref_fp16(uint16_t h) { return oracle::fp16(h); }
double ref_e4m3(uint8_t b) { return oracle::e4m3(b); }
double ref_e5m2(uint8_t b) { return oracle::e5m2(b); }
double ref_e2m1(uint8_t c) { return oracle::e2m1(c); }
double ref_e8m0(uint8_t s) { return oracle::e8m0(s); }

// Same value, or both NaN; zeros must agree in sign.
bool same(double want, double got) {
  if (std::isnan(want)) return std::isnan(got);
  return want == got && std::signbit(want) == std::signbit(got);
}

void check_decoders(fuzz::Reader& in) {
  const uint16_t h = in.u16();
  const uint8_t b = uint8_t(h);
  {
    const float got = fm::bf16_to_f32(h);
    FUZZ_CHECK(same(ref_bf16(h), got), "bf16_to_f32(0x%04x) = %a", h, double(got));
    FUZZ_CHECK(f32_bits(got) == uint32_t(h) << 16, "bf16_to_f32(0x%04x) bits 0x%08x", h, f32_bits(got));
  }
  {
    const float got = fm::fp16_to_f32(h);
    FUZZ_CHECK(same(ref_fp16(h), got), "fp16_to_f32(0x%04x) = %a", h, double(got));
    if (std::isnan(got))
      FUZZ_CHECK(std::signbit(got) == bool(h & 0x8000), "fp16_to_f32(0x%04x): NaN lost its sign", h);
  }
  FUZZ_CHECK(same(ref_e4m3(b), fm::e4m3_to_f32(b)), "e4m3_to_f32(0x%02x) = %a", b,
             double(fm::e4m3_to_f32(b)));
  FUZZ_CHECK(same(ref_e5m2(b), fm::e5m2_to_f32(b)), "e5m2_to_f32(0x%02x) = %a", b,
             double(fm::e5m2_to_f32(b)));
  FUZZ_CHECK(same(ref_e2m1(b), fm::e2m1_to_f32(b)), "e2m1_to_f32(0x%02x) = %a", b,
             double(fm::e2m1_to_f32(b)));
  FUZZ_CHECK(same(ref_e8m0(b), fm::e8m0_to_f32(b)), "e8m0_to_f32(0x%02x) = %a", b,
             double(fm::e8m0_to_f32(b)));

  // f32 -> bf16: round to nearest, ties to even; overflow past max + half an ulp is inf; NaN stays NaN.
  const uint32_t u = in.u32();
  const float f = bits_f32(u);
  const uint16_t r = fm::f32_to_bf16(f);
  if (std::isnan(f)) {
    FUZZ_CHECK(std::isnan(ref_bf16(r)) && bool(r & 0x8000) == bool(u >> 31),
               "f32_to_bf16(NaN 0x%08x) = 0x%04x: not a NaN of the same sign", u, r);
  } else {
    const uint16_t lo = uint16_t(u >> 16);  // truncation toward zero
    const uint16_t hi = uint16_t(lo + 1);   // next magnitude (0x7F80 = inf when lo = max)
    const double dlo = ref_bf16(lo);
    const double dhi = (hi & 0x7FFF) == 0x7F80 ? std::copysign(std::ldexp(1.0, 128), dlo) : ref_bf16(hi);
    const double x = double(f);
    uint16_t want;
    if (std::fabs(x - dlo) < std::fabs(dhi - x))
      want = lo;
    else if (std::fabs(x - dlo) > std::fabs(dhi - x))
      want = hi;
    else
      want = (lo & 1) ? hi : lo;
    if ((u & 0xFFFF) == 0) want = lo;  // exact (covers +-0 and +-inf)
    FUZZ_CHECK(r == want, "f32_to_bf16(%a = 0x%08x) = 0x%04x, want 0x%04x", x, u, r, want);
    const float rb = fm::round_bf16(f);
    FUZZ_CHECK(f32_bits(rb) == uint32_t(want) << 16, "round_bf16(%a) bits 0x%08x, want 0x%04x0000", x,
               f32_bits(rb), want);
  }
}

// ---------------------------------------------------------------- layouts

// Offsets of d and dmin and the ranges of the factors, from docs/FORMATS.md's K-quant table.
struct KqSpec {
  int block, subs, d, dmin;  // dmin -1: none
  int sc_lo, sc_hi, q_lo, q_hi;
};
KqSpec kq_spec(fm::KQuant f) {
  switch (f) {
    case fm::KQuant::q4_K: return {144, 8, 0, 2, 0, 63, 0, 15};
    case fm::KQuant::q5_K: return {176, 8, 0, 2, 0, 63, 0, 31};
    case fm::KQuant::q6_K: return {210, 16, 208, -1, -128, 127, -32, 31};
    case fm::KQuant::q2_K: return {84, 16, 80, 82, 0, 15, 0, 3};
    case fm::KQuant::q3_K: return {110, 16, 108, -1, -32, 31, -4, 3};
  }
  return {};
}

struct Case {
  fm::Layout l;
  int64_t cols = 0, srows = 0, sbytes = 0;  // scale columns, rows, bytes per element
  std::vector<uint8_t> data, scales;
  std::vector<float> row_scales;
  fm::MatrixRef ref{};
};

// The K rule and group of docs/FORMATS.md, written out here.
int64_t pick_k(fuzz::Reader& in, Format f, int32_t group) {
  switch (f) {
    case Format::bf16:
    case Format::fp8_block: return in.range(1, 700);
    case Format::nvfp4: return 16 * in.range(1, 40);
    case Format::q4_K:
    case Format::q5_K:
    case Format::q6_K:
    case Format::q2_K:
    case Format::q3_K: return 256 * in.range(1, 3);
    default: return group * in.range(1, 600 / group);
  }
}

int64_t ref_row_bytes(Format f, int64_t k) { return oracle::row_bytes(f, k); }

oracle::Matrix oracle_matrix(const Case& c) {
  oracle::Matrix m;
  m.format = c.l.format;
  m.scale_dtype = c.l.scale_dtype;
  m.group = c.l.group;
  m.k = c.l.k;
  m.data = c.data.data();
  m.scales = c.scales.data();
  m.scale_stride = c.ref.scale_stride ? c.ref.scale_stride : c.l.scale_stride;
  m.row_scales = c.row_scales.data();
  return m;
}

// Weight (r, k) from the bytes, per docs/FORMATS.md (tests/format_oracle.h).
Parts ref_parts(const Case& c, int64_t r, int64_t k) { return oracle::parts(oracle_matrix(c), r, k); }

double ref_weight(const Case& c, int64_t r, int64_t k) { return ref_parts(c, r, k).weight(); }

// Elements per scale block (the unit gemv_scalar sums before scaling).
int64_t ref_block(const Case& c) { return oracle::block_elems(c.l.format, c.l.group, c.l.k); }

bool build_case(fuzz::Reader& in, Case& c) {
  const Format f = static_cast<Format>(in.range(0, fm::kMaxFormatId));
  const fm::ScaleDtype sdt = f == Format::fp8_block && in.flag() ? fm::ScaleDtype::f32 : fm::ScaleDtype::bf16;
  static const int32_t kGroups[] = {0, 32, 64, 128};
  const int32_t group = fm::default_group(f, kGroups[in.u8() % 4]);
  const int64_t k = pick_k(in, f, group);
  const char* why = "";
  FUZZ_CHECK(fm::k_is_valid(f, group, k, &why), "k_is_valid(%s, %d, %lld) rejected a valid K: %s",
             fm::format_name(f), group, (long long)k, why);
  const int64_t rows = in.range(1, 300);

  // Traits against the table of docs/FORMATS.md.
  FUZZ_CHECK(fm::row_bytes(f, k) == ref_row_bytes(f, k), "row_bytes(%s, %lld)", fm::format_name(f),
             (long long)k);
  const bool scaled = f == Format::nvfp4 || f == Format::mxfp4 || f == Format::ds_fp4 ||
                      f == Format::fp8_block || f == Format::mxfp8_e4m3 || f == Format::mxfp8_e5m2;
  FUZZ_CHECK(fm::has_block_scales(f) == scaled, "has_block_scales(%s)", fm::format_name(f));
  FUZZ_CHECK(fm::has_row_scales(f) == (f == Format::nvfp4), "has_row_scales(%s)", fm::format_name(f));
  const int64_t ref_group = f == Format::fp8_block ? 128 : f == Format::nvfp4 ? 16 : group;
  const int64_t cols = scaled ? (k + ref_group - 1) / ref_group : 0;
  const int64_t srows = !scaled ? 0 : f == Format::fp8_block ? (rows + 127) / 128 : rows;
  const int64_t sbytes = !scaled ? 0 : f == Format::fp8_block ? (sdt == fm::ScaleDtype::f32 ? 4 : 2) : 1;
  FUZZ_CHECK(fm::scale_cols(f, group, k) == cols, "scale_cols(%s, %d, %lld) = %lld, want %lld",
             fm::format_name(f), group, (long long)k, (long long)fm::scale_cols(f, group, k),
             (long long)cols);
  FUZZ_CHECK(fm::scale_rows(f, rows) == srows, "scale_rows(%s, %lld)", fm::format_name(f), (long long)rows);
  FUZZ_CHECK(fm::scale_elem_bytes(f, sdt) == sbytes, "scale_elem_bytes(%s)", fm::format_name(f));
  // An invalid K of the same format is rejected with a reason.
  if (f != Format::bf16 && f != Format::fp8_block) {
    const int64_t bad = k + in.range(1, (f == Format::nvfp4 ? 16 : group) - 1);
    why = nullptr;
    FUZZ_CHECK(!fm::k_is_valid(f, group, bad, &why) && why && *why, "k_is_valid(%s, %d, %lld) accepted it",
               fm::format_name(f), group, (long long)bad);
  }
  why = nullptr;
  FUZZ_CHECK(!fm::k_is_valid(f, group, -in.range(0, 1000), &why) && why, "k_is_valid accepted K <= 0");

  c.l.format = f;
  c.l.scale_dtype = sdt;
  c.l.group = group;
  c.l.rows = rows;
  c.l.k = k;
  c.cols = cols;
  c.srows = srows;
  c.sbytes = sbytes;
  // Layout stride, optionally overridden per matrix (MatrixRef::scale_stride).
  c.l.scale_stride = scaled ? cols + in.range(0, 3) : 0;
  c.ref.scale_stride = scaled && in.chance(64) ? cols + in.range(0, 5) : 0;
  const int64_t stride = c.ref.scale_stride ? c.ref.scale_stride : c.l.scale_stride;

  c.data.resize(size_t(rows * ref_row_bytes(f, k)));
  in.fill(c.data.data(), c.data.size());
  if (scaled) {
    // The last scale row without its padding: nothing past its `cols` elements may be read.
    c.scales.resize(size_t(((srows - 1) * stride + cols) * sbytes));
    in.fill(c.scales.data(), c.scales.size());
  }
  if (f == Format::nvfp4) {
    c.row_scales.resize(size_t(rows));
    for (auto& v : c.row_scales)
      v = in.chance(32) ? in.f32() : std::ldexp(float(in.range(1, 255)), int(in.range(-12, 4)));
  }
  c.ref.data = c.data.data();
  c.ref.scales = scaled ? c.scales.data() : nullptr;
  c.ref.row_scales = f == Format::nvfp4 ? c.row_scales.data() : nullptr;
  return true;
}

// The layout entry points of a K-quant (weight, gemv_scalar, quantize) are
// formats/kquants' functions, whose numerics check_kquant fuzzes: the same
// values and bits, and the same bytes.
void check_layout_kquant(fuzz::Reader& in, const Case& c) {
  const fm::Layout& l = c.l;
  const fm::KQuant f = fm::KQuant(int(l.format));
  const char* nm = fm::format_name(l.format);
  FUZZ_CHECK(fm::info(l.format).sub_block == 256 / kq_spec(f).subs, "%s sub-block", nm);
  for (int i = 0; i < 16; ++i) {
    const int64_t r = i == 0 ? l.rows - 1 : in.range(0, l.rows - 1);
    const int64_t k = i == 0 ? l.k - 1 : in.range(0, l.k - 1);
    const double want = fm::kquant_weight(f, c.data.data(), l.k, r, k), got = fm::weight(l, c.ref, r, k);
    FUZZ_CHECK(same(want, got), "weight(%s, r=%lld, k=%lld) = %a, kquant_weight %a", nm, (long long)r,
               (long long)k, got, want);
  }
  const int64_t r0 = in.range(0, l.rows - 1);
  const int64_t n = in.range(1, l.rows - r0 < 8 ? l.rows - r0 : 8);
  std::vector<float> x(size_t(l.k));
  for (auto& v : x) v = fm::bf16_to_f32(in.chance(16) ? in.u16() : uint16_t((in.u16() & 0x80FF) | 0x3C00));
  std::vector<float> y(size_t(n) + 1, 12345.0f), want(static_cast<size_t>(n));
  fm::gemv_scalar(l, c.ref, r0, n, x.data(), y.data());
  FUZZ_CHECK(y[size_t(n)] == 12345.0f, "gemv_scalar(%s) wrote past its n = %lld outputs", nm, (long long)n);
  fm::kquant_gemv(f, c.data.data() + r0 * ref_row_bytes(l.format, l.k), l.k, n, x.data(), want.data());
  FUZZ_CHECK(std::memcmp(y.data(), want.data(), size_t(n) * 4) == 0, "gemv_scalar(%s) is not kquant_gemv",
             nm);
  std::vector<float> w(size_t(l.rows * l.k));
  for (auto& v : w)
    v = in.chance(24) ? in.f32() : std::ldexp(float(int(in.range(-1000, 1000))), int(in.range(-20, 4)));
  std::vector<uint8_t> a(c.data.size(), 0xA5), b(c.data.size(), 0x5A);
  const fm::QuantResult qa = fm::quantize(l, w.data(), {a.data(), nullptr, nullptr});
  const fm::QuantResult qb = fm::kquant_quantize(f, l.rows, l.k, w.data(), b.data());
  FUZZ_CHECK(qa.ok && qb.ok && qa.nonfinite == qb.nonfinite && a == b, "quantize(%s) is not kquant_quantize",
             nm);
}

void check_layout(fuzz::Reader& in) {
  Case c;
  if (!build_case(in, c)) return;
  const fm::Layout& l = c.l;
  if (fm::is_kquant(l.format)) return check_layout_kquant(in, c);

  // weight() at fuzzed positions, including the corners.
  for (int i = 0; i < 16; ++i) {
    const int64_t r = i == 0 ? l.rows - 1 : in.range(0, l.rows - 1);
    const int64_t k = i == 0 ? l.k - 1 : in.range(0, l.k - 1);
    const double want = ref_weight(c, r, k), got = fm::weight(l, c.ref, r, k);
    FUZZ_CHECK(same(want, got) || (want == 0 && got == 0), "weight(%s, r=%lld, k=%lld) = %a, want %a",
               fm::format_name(l.format), (long long)r, (long long)k, got, want);
  }

  // gemv_scalar on rows [r0, r0 + n) against a float64 dot product.
  const int64_t r0 = in.range(0, l.rows - 1);
  const int64_t n = in.range(1, l.rows - r0 < 8 ? l.rows - r0 : 8);
  std::vector<float> x(size_t(l.k));
  for (auto& v : x) v = fm::bf16_to_f32(in.chance(16) ? in.u16() : uint16_t((in.u16() & 0x80FF) | 0x3C00));
  std::vector<float> y(size_t(n) + 1, 12345.0f);
  fm::gemv_scalar(l, c.ref, r0, n, x.data(), y.data());
  FUZZ_CHECK(y[size_t(n)] == 12345.0f, "gemv_scalar wrote past its n = %lld outputs", (long long)n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = r0 + i;
    // float64 result; the largest magnitude any fp32 intermediate can reach (block
    // sums before and after scaling, the running total); the largest scale factor.
    double want = 0, mag = 0, peak = 0, smax = 1;
    bool finite = true;
    const int64_t bl = ref_block(c);
    for (int64_t k0 = 0; k0 < l.k; k0 += bl) {
      double part_mag = 0, bscale = 1, rscale = 1;
      for (int64_t k = k0; k < k0 + bl && k < l.k; ++k) {
        const Parts p = ref_parts(c, r, k);
        const double prod = p.weight() * double(x[size_t(k)]);
        finite = finite && std::isfinite(prod) && std::isfinite(p.code * double(x[size_t(k)]));
        want += prod;
        mag += std::fabs(prod);
        part_mag += std::fabs(p.code * double(x[size_t(k)]));
        bscale = std::fabs(p.bscale);
        rscale = std::fabs(p.rscale);
      }
      finite = finite && std::isfinite(bscale) && std::isfinite(rscale);
      peak = std::max({peak, part_mag, part_mag * bscale, mag / (rscale > 0 ? rscale : 1), mag});
      smax = std::max({smax, bscale * rscale, rscale});
    }
    const double got = y[size_t(i)];
    // No bound where an fp32 intermediate may overflow (inf, inf - inf, inf * 0).
    if (!finite || !(peak < 1e37)) continue;
    // Each product enters one fp32 rounding per addition, plus the block-scale
    // FMA and the nvfp4 row scale; results below the fp32 normal range lose up
    // to 2^-150 per operation, magnified by the scales.
    const double bound =
        double(l.k + 4) * (mag * std::ldexp(1.0, -24) + smax * std::ldexp(1.0, -149)) * 1.0001;
    FUZZ_CHECK(std::fabs(got - want) <= bound,
               "gemv_scalar(%s, K=%lld, row %lld) = %a, float64 %a, |diff| %g > bound %g",
               fm::format_name(l.format), (long long)l.k, (long long)r, got, want, std::fabs(got - want),
               bound);
  }

  // quantize() of fuzzed fp32 (NaN, inf, subnormals, huge) into the same layout:
  // it accepts it, writes only the weight bytes and the scale columns (ASan:
  // the buffers end at the last scale row's columns), and every weight it
  // produces from finite inputs of moderate size decodes finite.
  std::vector<float> w(size_t(l.rows * l.k));
  bool moderate = true;
  for (auto& v : w) {
    v = in.chance(24) ? in.f32() : std::ldexp(float(int(in.range(-1000, 1000))), int(in.range(-20, 4)));
    moderate = moderate && std::isfinite(v) && std::fabs(v) < 1e4f;
  }
  std::fill(c.data.begin(), c.data.end(), 0xA5);
  std::fill(c.scales.begin(), c.scales.end(), 0xA5);
  fm::Layout ql = l;  // the stride the buffer was sized with (a MatrixRef override wins)
  if (c.ref.scale_stride) ql.scale_stride = c.ref.scale_stride;
  const fm::QuantResult q = fm::quantize(ql, w.data(),
                                         {c.data.data(), c.scales.empty() ? nullptr : c.scales.data(),
                                          c.row_scales.empty() ? nullptr : c.row_scales.data()});
  FUZZ_CHECK(q.ok, "quantize(%s, rows %lld, K %lld) refused a valid layout: %s", fm::format_name(l.format),
             (long long)l.rows, (long long)l.k, q.error ? q.error : "");
  if (!moderate) return;
  for (int i = 0; i < 16; ++i) {
    const int64_t r = in.range(0, l.rows - 1), k = in.range(0, l.k - 1);
    const double got = fm::weight(l, c.ref, r, k);
    FUZZ_CHECK(std::isfinite(got), "quantize(%s) of finite %g decodes to %g at r=%lld k=%lld",
               fm::format_name(l.format), double(w[size_t(r * l.k + k)]), got, (long long)r, (long long)k);
  }
}

// ---------------------------------------------------------------- K-quants

// Super-block bytes, weights, GEMV and quantizer on fuzzed input. Buffers end
// exactly at the rows' last byte and start at odd addresses (rows lie anywhere
// in a mapped file), so ASan reports any read past them.
void check_kquant(fuzz::Reader& in) {
  const fm::KQuant f = fm::KQuant(fm::kMinKQuantId + int(in.u8() % 5));
  const KqSpec sp = kq_spec(f);
  const char* nm = fm::kquant_name(f);
  const int64_t nb = in.range(1, 6), rows = in.range(1, 4), k = 256 * nb;
  const char* why = "";
  FUZZ_CHECK(fm::kquant_k_is_valid(k, &why), "kquant_k_is_valid(%lld) rejected a valid K", (long long)k);
  const int64_t bad_k = in.range(-300, 300) * (in.flag() ? 1 : 3) + (in.flag() ? 0 : 256 * in.range(0, 9));
  FUZZ_CHECK(fm::kquant_k_is_valid(bad_k, &why) == (bad_k >= 256 && bad_k % 256 == 0),
             "kquant_k_is_valid(%lld)", (long long)bad_k);
  FUZZ_CHECK(fm::kquant_traits(f).block_bytes == sp.block && fm::kquant_row_bytes(f, k) == nb * sp.block,
             "%s sizes", nm);
  const int64_t rb = nb * sp.block;
  std::vector<uint8_t> buf(size_t(rows * rb) + 1);
  uint8_t* data = buf.data() + 1;
  in.fill(data, size_t(rows * rb));
  // Special fp16 scales now and then: subnormals, inf, NaN.
  static const uint16_t kSpecial[] = {0x0000, 0x8000, 0x0001, 0x03FF, 0x7BFF, 0x7C00, 0xFC00, 0x7E00, 0xFD01};
  for (int64_t b = 0; b < rows * nb; ++b)
    for (int off : {sp.d, sp.dmin})
      if (off >= 0 && in.chance(24)) {
        const uint16_t h = kSpecial[in.u8() % 9];
        data[b * sp.block + off] = uint8_t(h), data[b * sp.block + off + 1] = uint8_t(h >> 8);
      }

  // Fields in range, d / dmin as the fp16 at their offsets, and weights as the formula.
  std::vector<float> deq(static_cast<size_t>(k));
  std::vector<char> nan_scale(size_t(rows), 0), inf_scale(size_t(rows), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = data + r * rb;
    fm::kquant_dequantize_row(f, row, k, deq.data());
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = row + b * sp.block;
      const double d = ref_fp16(uint16_t(blk[sp.d] | blk[sp.d + 1] << 8));
      const double dmin = sp.dmin < 0 ? 0.0 : ref_fp16(uint16_t(blk[sp.dmin] | blk[sp.dmin + 1] << 8));
      FUZZ_CHECK(same(d, fm::kquant_d(f, blk)) && same(dmin, fm::kquant_dmin(f, blk)), "%s d / dmin", nm);
      nan_scale[size_t(r)] |= std::isnan(d) || std::isnan(dmin);
      inf_scale[size_t(r)] |= std::isinf(d) || std::isinf(dmin);
      for (int i = 0; i < 256; ++i) {
        const fm::KQuantSub s = fm::kquant_sub(f, blk, i / (256 / sp.subs));
        const int q = fm::kquant_q(f, blk, i);
        FUZZ_CHECK(s.sc >= sp.sc_lo && s.sc <= sp.sc_hi && s.m >= 0 && s.m <= (sp.dmin < 0 ? 0 : sp.sc_hi) &&
                       q >= sp.q_lo && q <= sp.q_hi,
                   "%s element %d: sc %d m %d q %d out of range", nm, i, s.sc, s.m, q);
        const double want = d * s.sc * q - dmin * s.m, got = fm::kquant_weight(f, row, b * 256 + i);
        FUZZ_CHECK(same(want, got) || (want == 0 && got == 0), "%s weight(%lld) = %a, want %a", nm,
                   (long long)(b * 256 + i), got, want);
        const float w32 = deq[size_t(b * 256 + i)];
        FUZZ_CHECK(std::isnan(want) ? std::isnan(w32) : f32_bits(w32) == f32_bits(float(got)),
                   "%s dequantize_row(%lld) = %a, weight %a", nm, (long long)(b * 256 + i), double(w32), got);
      }
    }
  }

  // GEMV: the same bits with and without precomputed sums of x; NaN scales give a
  // NaN row and infinite ones a non-finite row whatever x is; finite scales with
  // moderate x stay within the float64 bound.
  std::vector<float> x(static_cast<size_t>(k));
  for (auto& v : x) v = fm::bf16_to_f32(in.chance(16) ? in.u16() : uint16_t((in.u16() & 0x80FF) | 0x3C00));
  std::vector<float> sx(size_t(fm::kquant_sub_sums_len(f, k)) + 1, 12345.0f);
  fm::kquant_sub_sums(f, x.data(), k, sx.data());
  FUZZ_CHECK(sx.back() == 12345.0f, "kquant_sub_sums(%s) wrote past its K / B sums", nm);
  std::vector<float> y(size_t(rows) + 1, 12345.0f), y2(static_cast<size_t>(rows));
  fm::kquant_gemv(f, data, k, rows, x.data(), sx.data(), y.data());
  fm::kquant_gemv(f, data, k, rows, x.data(), y2.data());
  FUZZ_CHECK(y.back() == 12345.0f, "kquant_gemv(%s) wrote past its rows", nm);
  for (int64_t r = 0; r < rows; ++r) {
    const float got = y[size_t(r)];
    FUZZ_CHECK(f32_bits(got) == f32_bits(y2[size_t(r)]) || (std::isnan(got) && std::isnan(y2[size_t(r)])),
               "kquant_gemv(%s) with and without sx differ", nm);
    if (nan_scale[size_t(r)]) {
      FUZZ_CHECK(std::isnan(got), "kquant_gemv(%s) row %lld with a NaN scale = %a", nm, (long long)r,
                 double(got));
      continue;
    }
    if (inf_scale[size_t(r)]) {
      FUZZ_CHECK(!std::isfinite(got), "kquant_gemv(%s) row %lld with an inf scale = %a", nm, (long long)r,
                 double(got));
      continue;
    }
    // float64 result, sum(|d sc q x| + |dmin m x|), and the largest fp32 intermediate
    // (sub-block sums of |q x| and |x| too: with d = 0 those may still overflow).
    double want = 0, mag = 0, smax = 1, peak = 0, sub_qx = 0, sub_x = 0;
    bool finite = true;
    const int64_t bl = 256 / sp.subs;
    for (int64_t i = 0; i < k; ++i) {
      const uint8_t* blk = data + r * rb + i / 256 * sp.block;
      const fm::KQuantSub s = fm::kquant_sub(f, blk, int(i % 256) / int(bl));
      const int q = fm::kquant_q(f, blk, int(i % 256));
      const double dsc = double(fm::kquant_d(f, blk)) * s.sc, dm = double(fm::kquant_dmin(f, blk)) * s.m;
      const double a = dsc * q * x[size_t(i)], b = dm * x[size_t(i)];
      finite = finite && std::isfinite(a) && std::isfinite(b) && std::isfinite(x[size_t(i)]);
      want += a - b;
      mag += std::fabs(a) + std::fabs(b);
      smax = std::max({smax, std::fabs(dsc), std::fabs(dm)});
      if (i % bl == 0) sub_qx = sub_x = 0;
      sub_qx += std::fabs(double(q) * x[size_t(i)]);
      sub_x += std::fabs(double(x[size_t(i)]));
      peak = std::max({peak, mag, sub_qx, sub_x});
    }
    if (!finite || !(peak < 1e37)) continue;  // an fp32 intermediate may overflow
    const double ops = double(256 / sp.subs + 2 * k / (256 / sp.subs));
    const double bound = ops * (std::ldexp(mag, -24) + std::ldexp(smax, -149)) * 1.001;
    FUZZ_CHECK(std::fabs(double(got) - want) <= bound,
               "kquant_gemv(%s, K=%lld, row %lld) = %a, float64 %a, bound %g", nm, (long long)k, (long long)r,
               double(got), want, bound);
  }

  // Quantizer on arbitrary fp32 (NaN, inf, subnormals, huge): accepted, writes
  // exactly the rows (ASan), the same bytes twice; finite moderate inputs decode finite.
  std::vector<float> w(size_t(rows * k));
  bool moderate = true;
  int64_t nonfinite = 0;
  for (auto& v : w) {
    v = in.chance(24) ? in.f32() : std::ldexp(float(int(in.range(-1000, 1000))), int(in.range(-30, 4)));
    moderate = moderate && std::isfinite(v) && std::fabs(v) < 1e4f;
    nonfinite += !std::isfinite(v);
  }
  const fm::QuantResult q = fm::kquant_quantize(f, rows, k, w.data(), data);
  FUZZ_CHECK(q.ok && q.nonfinite == nonfinite,
             "kquant_quantize(%s, rows %lld, K %lld): ok %d, nonfinite %lld", nm, (long long)rows,
             (long long)k, int(q.ok), (long long)q.nonfinite);
  std::vector<uint8_t> again(size_t(rows * rb));
  fm::kquant_quantize(f, rows, k, w.data(), again.data());
  FUZZ_CHECK(std::memcmp(again.data(), data, again.size()) == 0, "kquant_quantize(%s) is not deterministic",
             nm);
  if (!moderate) return;
  for (int i = 0; i < 16; ++i) {
    const int64_t r = in.range(0, rows - 1), c = in.range(0, k - 1);
    const double got = fm::kquant_weight(f, data + r * rb, c);
    FUZZ_CHECK(std::isfinite(got), "kquant_quantize(%s) of finite %g decodes to %g", nm,
               double(w[size_t(r * k + c)]), got);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Reader in(data, size);
  const uint8_t sel = in.u8();
  if (sel & 1) {
    check_decoders(in);
  } else if (sel & 2) {
    check_kquant(in);
  } else {
    check_layout(in);
  }
  return 0;
}
