// Test-only probe of formats/ for tests/python/crosscheck_formats.py: prints our
// decoders' value of every code, runs our element encoders and quantizers on
// fp32 inputs given as raw files, and dequantizes raw banks with
// formats::weight. Raw files are little-endian, host layout.
//
//   formats_probe decoders OUT.json
//   formats_probe encode IN.f32 OUT.bin
//       OUT = n e4m3 | n e5m2 | n e5m2 (saturating) | n e2m1 | n fp16 (u16) | n bf16 (u16)
//   formats_probe quantize FORMAT ROWS K GROUP SCALE_DTYPE IN.f32 PREFIX
//       writes PREFIX.data, PREFIX.scales (dense stride), PREFIX.rows (nvfp4 globals)
//   formats_probe dequantize FORMAT ROWS K GROUP SCALE_DTYPE PREFIX OUT.f64
// FORMAT is a format name (formats::format_name), SCALE_DTYPE bf16 or f32.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "formats/quantize.h"
#include "probe_io.h"

namespace fm = moejit::formats;

namespace {

using probe_io::read_file;
using probe_io::write_file;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<float> floats(const std::vector<uint8_t>& b) {
  std::vector<float> v(b.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * 4);  // never memcpy from/to null
  return v;
}

fm::Layout layout(char** argv) {
  fm::Layout l;
  int f = -1;
  for (int i = 0; i <= fm::kMaxFormatId; ++i)
    if (std::strcmp(argv[0], fm::format_name(static_cast<fm::Format>(i))) == 0) f = i;
  if (f < 0) {
    std::fprintf(stderr, "formats_probe: unknown format %s\n", argv[0]);
    std::exit(2);
  }
  l.format = static_cast<fm::Format>(f);
  l.rows = std::atoll(argv[1]);
  l.k = std::atoll(argv[2]);
  l.group = std::atoi(argv[3]);
  l.scale_dtype = std::strcmp(argv[4], "f32") == 0 ? fm::ScaleDtype::f32 : fm::ScaleDtype::bf16;
  l.scale_stride = fm::scale_cols(l.format, l.group, l.k);
  return l;
}

size_t scale_bytes(const fm::Layout& l) {
  return size_t(fm::scale_rows(l.format, l.rows) * l.scale_stride *
                fm::scale_elem_bytes(l.format, l.scale_dtype));
}

int decoders(const std::string& out) {
  nlohmann::json j;
  std::vector<uint32_t> e4m3, e5m2, e2m1, e8m0, fp16, bf16;
  for (int c = 0; c < 256; ++c) {
    e4m3.push_back(bits(fm::e4m3_to_f32(uint8_t(c))));
    e5m2.push_back(bits(fm::e5m2_to_f32(uint8_t(c))));
    e8m0.push_back(bits(fm::e8m0_to_f32(uint8_t(c))));
  }
  for (int c = 0; c < 16; ++c) e2m1.push_back(bits(fm::e2m1_to_f32(uint8_t(c))));
  for (int c = 0; c < 65536; ++c) {
    fp16.push_back(bits(fm::fp16_to_f32(uint16_t(c))));
    bf16.push_back(bits(fm::bf16_to_f32(uint16_t(c))));
  }
  j["e4m3"] = e4m3, j["e5m2"] = e5m2, j["e2m1"] = e2m1, j["e8m0"] = e8m0, j["fp16"] = fp16, j["bf16"] = bf16;
  const std::string s = j.dump();
  write_file(out, s.data(), s.size());
  return 0;
}

int encode(const std::string& in, const std::string& out) {
  const std::vector<float> x = floats(read_file(in));
  const size_t n = x.size();
  std::vector<uint8_t> o(n * 8);
  for (size_t i = 0; i < n; ++i) {
    o[i] = fm::f32_to_e4m3(x[i]);
    o[n + i] = fm::f32_to_e5m2(x[i]);
    o[2 * n + i] = fm::f32_to_e5m2(x[i], true);
    o[3 * n + i] = fm::f32_to_e2m1(x[i]);
    const uint16_t h = fm::f32_to_fp16(x[i]), b = fm::f32_to_bf16(x[i]);
    std::memcpy(&o[4 * n + 2 * i], &h, 2);
    std::memcpy(&o[6 * n + 2 * i], &b, 2);
  }
  write_file(out, o.data(), o.size());
  return 0;
}

int quantize(char** argv) {
  const fm::Layout l = layout(argv);
  const std::vector<float> w = floats(read_file(argv[5]));
  if (int64_t(w.size()) != l.rows * l.k) {
    std::fprintf(stderr, "formats_probe: %zu floats, want %lld\n", w.size(), (long long)(l.rows * l.k));
    return 2;
  }
  std::vector<uint8_t> data(size_t(l.rows * fm::row_bytes(l.format, l.k))), scales(scale_bytes(l));
  std::vector<float> rows(fm::has_row_scales(l.format) ? size_t(l.rows) : 0);
  fm::MatrixOut o;
  o.data = data.data();
  o.scales = scales.empty() ? nullptr : scales.data();
  o.row_scales = rows.empty() ? nullptr : rows.data();
  const fm::QuantResult r = fm::quantize(l, w.data(), o);
  if (!r.ok) {
    std::fprintf(stderr, "formats_probe: quantize: %s\n", r.error);
    return 1;
  }
  const std::string prefix = argv[6];
  write_file(prefix + ".data", data.data(), data.size());
  write_file(prefix + ".scales", scales.data(), scales.size());
  write_file(prefix + ".rows", rows.data(), rows.size() * 4);
  return 0;
}

int dequantize(char** argv) {
  const fm::Layout l = layout(argv);
  const std::string prefix = argv[5];
  const std::vector<uint8_t> data = read_file(prefix + ".data");
  std::vector<uint8_t> scales = read_file(prefix + ".scales");
  const std::vector<float> rows = floats(read_file(prefix + ".rows"));
  if (int64_t(data.size()) != l.rows * fm::row_bytes(l.format, l.k) || scales.size() != scale_bytes(l) ||
      rows.size() != (fm::has_row_scales(l.format) ? size_t(l.rows) : 0)) {
    std::fprintf(stderr, "formats_probe: input sizes do not match the layout\n");
    return 2;
  }
  fm::MatrixRef m;
  m.data = data.data();
  m.scales = scales.empty() ? nullptr : scales.data();
  m.row_scales = rows.empty() ? nullptr : rows.data();
  std::vector<double> out(size_t(l.rows * l.k));
  for (int64_t r = 0; r < l.rows; ++r)
    for (int64_t k = 0; k < l.k; ++k) out[size_t(r * l.k + k)] = fm::weight(l, m, r, k);
  write_file(argv[6], out.data(), out.size() * 8);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "decoders" && argc == 3) return decoders(argv[2]);
  if (cmd == "encode" && argc == 4) return encode(argv[2], argv[3]);
  if (cmd == "quantize" && argc == 9) return quantize(argv + 2);
  if (cmd == "dequantize" && argc == 9) return dequantize(argv + 2);
  std::fprintf(stderr,
               "usage: formats_probe decoders OUT.json | encode IN.f32 OUT.bin |\n"
               "       quantize FORMAT ROWS K GROUP bf16|f32 IN.f32 PREFIX |\n"
               "       dequantize FORMAT ROWS K GROUP bf16|f32 PREFIX OUT.f64\n");
  return 2;
}
