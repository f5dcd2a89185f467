// Test-only probe of formats/kquants for tests/python/crosscheck_kquants.py:
// runs our K-quant quantizers, decoders and reference GEMV on raw files made by
// the script. Raw files are little-endian, host layout; FORMAT is a K-quant
// name (q4_K, q5_K, q6_K, q2_K, q3_K).
//
//   kquants_probe quantize FORMAT ROWS K IN.f32 OUT.bin
//   kquants_probe dequantize FORMAT ROWS K IN.bin OUT
//       writes OUT.f64 (kquant_weight of every element) and OUT.f32 (kquant_dequantize_row)
//   kquants_probe fields FORMAT NBLOCKS IN.bin OUT.i32
//       per super-block: sub_blocks (sc, m) pairs, then 256 q (kquant_sub, kquant_q)
//   kquants_probe gemv FORMAT ROWS K IN.bin X.f32 OUT.f32
//       kquant_gemv of the rows with x (OUT: ROWS floats, then the K / B sums of x)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "formats/kquants.h"
#include "probe_io.h"

namespace fm = moejit::formats;

namespace {

using probe_io::read_file;
using probe_io::write_file;

template <typename T>
std::vector<T> as(const std::vector<uint8_t>& b) {
  std::vector<T> v(b.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

fm::KQuant format(const char* name) {
  fm::KQuant f;
  if (!fm::kquant_from_name(name, &f)) {
    std::fprintf(stderr, "kquants_probe: unknown K-quant %s\n", name);
    std::exit(2);
  }
  return f;
}

void expect_size(size_t got, size_t want, const char* what) {
  if (got != want) {
    std::fprintf(stderr, "kquants_probe: %s has %zu bytes, want %zu\n", what, got, want);
    std::exit(2);
  }
}

int quantize(char** a) {
  const fm::KQuant f = format(a[0]);
  const int64_t rows = std::atoll(a[1]), k = std::atoll(a[2]);
  const std::vector<float> w = as<float>(read_file(a[3]));
  expect_size(w.size() * 4, size_t(rows * k) * 4, "IN.f32");
  std::vector<uint8_t> out(size_t(rows * fm::kquant_row_bytes(f, k)));
  const fm::QuantResult r = fm::kquant_quantize(f, rows, k, w.data(), out.data());
  if (!r.ok) {
    std::fprintf(stderr, "kquants_probe: quantize: %s\n", r.error);
    return 1;
  }
  write_file(a[4], out.data(), out.size());
  return 0;
}

int dequantize(char** a) {
  const fm::KQuant f = format(a[0]);
  const int64_t rows = std::atoll(a[1]), k = std::atoll(a[2]), rb = fm::kquant_row_bytes(f, k);
  const std::vector<uint8_t> data = read_file(a[3]);
  expect_size(data.size(), size_t(rows * rb), "IN.bin");
  std::vector<double> w(size_t(rows * k));
  std::vector<float> v(size_t(rows * k));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < k; ++i) w[size_t(r * k + i)] = fm::kquant_weight(f, data.data() + r * rb, i);
    fm::kquant_dequantize_row(f, data.data() + r * rb, k, v.data() + r * k);
  }
  const std::string out = a[4];
  write_file(out + ".f64", w.data(), w.size() * 8);
  write_file(out + ".f32", v.data(), v.size() * 4);
  return 0;
}

int fields(char** a) {
  const fm::KQuant f = format(a[0]);
  const fm::KQuantTraits& t = fm::kquant_traits(f);
  const int64_t n = std::atoll(a[1]);
  const std::vector<uint8_t> data = read_file(a[2]);
  expect_size(data.size(), size_t(n * t.block_bytes), "IN.bin");
  std::vector<int32_t> out;
  for (int64_t b = 0; b < n; ++b) {
    const uint8_t* blk = data.data() + b * t.block_bytes;
    for (int j = 0; j < t.sub_blocks; ++j) {
      const fm::KQuantSub s = fm::kquant_sub(f, blk, j);
      out.push_back(s.sc);
      out.push_back(s.m);
    }
    for (int i = 0; i < 256; ++i) out.push_back(fm::kquant_q(f, blk, i));
  }
  write_file(a[3], out.data(), out.size() * 4);
  return 0;
}

int gemv(char** a) {
  const fm::KQuant f = format(a[0]);
  const int64_t rows = std::atoll(a[1]), k = std::atoll(a[2]);
  const std::vector<uint8_t> data = read_file(a[3]);
  const std::vector<float> x = as<float>(read_file(a[4]));
  expect_size(data.size(), size_t(rows * fm::kquant_row_bytes(f, k)), "IN.bin");
  expect_size(x.size() * 4, size_t(k) * 4, "X.f32");
  std::vector<float> out(size_t(rows + fm::kquant_sub_sums_len(f, k)));
  fm::kquant_sub_sums(f, x.data(), k, out.data() + rows);
  fm::kquant_gemv(f, data.data(), k, rows, x.data(), out.data() + rows, out.data());
  write_file(a[5], out.data(), out.size() * 4);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "quantize" && argc == 7) return quantize(argv + 2);
  if (cmd == "dequantize" && argc == 7) return dequantize(argv + 2);
  if (cmd == "fields" && argc == 6) return fields(argv + 2);
  if (cmd == "gemv" && argc == 8) return gemv(argv + 2);
  std::fprintf(stderr,
               "usage: kquants_probe quantize FORMAT ROWS K IN.f32 OUT.bin |\n"
               "       dequantize FORMAT ROWS K IN.bin OUT | fields FORMAT NBLOCKS IN.bin OUT.i32 |\n"
               "       gemv FORMAT ROWS K IN.bin X.f32 OUT.f32\n");
  return 2;
}
