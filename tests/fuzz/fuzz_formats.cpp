// Fuzz harness for formats/: every scalar element decoder, f32_to_bf16 and
// round_bf16, the layout traits, weight() and gemv_scalar() on small fuzzed
// layouts of all nine formats, and quantize() into those layouts.
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

#include "formats/formats.h"
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

// value = (-1)^sign * mant * 2^exp as double; special handled by callers.
double make(bool neg, double mant, int exp) { return (neg ? -1.0 : 1.0) * std::ldexp(mant, exp); }

double ref_bf16(uint16_t v) {
  const int e = (v >> 7) & 0xFF, m = v & 0x7F;
  const bool neg = v & 0x8000;
  if (e == 0xFF) return m ? NAN : (neg ? -INFINITY : INFINITY);
  if (e == 0) return make(neg, m, -133);
  return make(neg, 128 + m, e - 134);
}

double ref_fp16(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const bool neg = h & 0x8000;
  if (e == 31) return m ? NAN : (neg ? -INFINITY : INFINITY);
  if (e == 0) return make(neg, m, -24);
  return make(neg, 1024 + m, e - 25);
}

double ref_e4m3(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  const bool neg = b & 0x80;
  if (e == 0) return make(neg, m, -9);
  return make(neg, 8 + m, e - 10);  // 0x7F: 15 * 2^5 = 480 (no NaN, no inf)
}

double ref_e5m2(uint8_t b) { return ref_fp16(uint16_t(b) << 8); }

double ref_e2m1(uint8_t c) {
  static const double kMag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const double m = kMag[c & 7];
  return (c & 8) ? -m : m;
}

double ref_e8m0(uint8_t s) { return s == 255 ? NAN : std::ldexp(1.0, int(s) - 127); }

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
    default: return group * in.range(1, 600 / group);
  }
}

int64_t ref_row_bytes(Format f, int64_t k) {
  switch (f) {
    case Format::bf16: return 2 * k;
    case Format::nvfp4:
    case Format::mxfp4:
    case Format::ds_fp4: return k / 2;
    case Format::q4_0: return k / 32 * 18;
    case Format::q8_0: return k / 32 * 34;
    default: return k;
  }
}

// Weight (r, k) from the bytes, per docs/FORMATS.md, as its three factors:
// the element value, the block scale and (nvfp4) the per-row scale.
struct Parts {
  double code = 0, bscale = 1, rscale = 1;
  double weight() const { return code * bscale * rscale; }  // exact in double
};

Parts ref_parts(const Case& c, int64_t r, int64_t k) {
  const fm::Layout& l = c.l;
  const uint8_t* row = c.data.data() + r * ref_row_bytes(l.format, l.k);
  const int64_t stride = c.ref.scale_stride ? c.ref.scale_stride : l.scale_stride;
  auto e8m0_scale = [&](int64_t g) { return ref_e8m0(c.scales[size_t(r * stride + k / g)]); };
  auto nibble = [&] {
    const uint8_t byte = row[k / 2];
    return ref_e2m1(k % 2 ? byte >> 4 : byte & 0xF);  // low nibble = even k
  };
  Parts p;
  switch (l.format) {
    case Format::bf16: p.code = ref_bf16(uint16_t(row[2 * k] | row[2 * k + 1] << 8)); break;
    case Format::nvfp4:
      p.code = nibble();
      p.bscale = ref_e4m3(c.scales[size_t(r * stride + k / 16)]);
      p.rscale = double(c.row_scales[size_t(r)]);
      break;
    case Format::mxfp4:
    case Format::ds_fp4:
      p.code = nibble();
      p.bscale = e8m0_scale(32);
      break;
    case Format::q4_0: {
      const uint8_t* blk = row + k / 32 * 18;  // fp16 d, then 16 bytes: j low nibbles, j + 16 high
      const int j = int(k % 32);
      p.code = (j < 16 ? blk[2 + j] & 0xF : blk[2 + j - 16] >> 4) - 8;
      p.bscale = ref_fp16(uint16_t(blk[0] | blk[1] << 8));
      break;
    }
    case Format::q8_0: {
      const uint8_t* blk = row + k / 32 * 34;  // fp16 d, then 32 int8
      p.code = double(int8_t(blk[2 + k % 32]));
      p.bscale = ref_fp16(uint16_t(blk[0] | blk[1] << 8));
      break;
    }
    case Format::fp8_block: {
      const size_t idx = size_t((r / 128) * stride + k / 128);
      if (l.scale_dtype == fm::ScaleDtype::f32) {
        float v;
        std::memcpy(&v, c.scales.data() + 4 * idx, 4);
        p.bscale = v;
      } else {
        p.bscale = ref_bf16(uint16_t(c.scales[2 * idx] | c.scales[2 * idx + 1] << 8));
      }
      p.code = ref_e4m3(row[k]);
      break;
    }
    case Format::mxfp8_e4m3:
      p.code = ref_e4m3(row[k]);
      p.bscale = e8m0_scale(l.group);
      break;
    case Format::mxfp8_e5m2:
      p.code = ref_e5m2(row[k]);
      p.bscale = e8m0_scale(l.group);
      break;
  }
  return p;
}

double ref_weight(const Case& c, int64_t r, int64_t k) { return ref_parts(c, r, k).weight(); }

// Elements per scale block (the unit gemv_scalar sums before scaling).
int64_t ref_block(const Case& c) {
  switch (c.l.format) {
    case Format::bf16: return c.l.k;
    case Format::fp8_block: return 128;
    case Format::nvfp4: return 16;
    case Format::mxfp8_e4m3:
    case Format::mxfp8_e5m2: return c.l.group;
    default: return 32;
  }
}

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

void check_layout(fuzz::Reader& in) {
  Case c;
  if (!build_case(in, c)) return;
  const fm::Layout& l = c.l;

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Reader in(data, size);
  if (in.u8() & 1) {
    check_decoders(in);
  } else {
    check_layout(in);
  }
  return 0;
}
