// File input and output of the probe programs that the Python cross-checks
// drive (formats_probe, kquants_probe): a failure names the program and the
// file and exits with 2.
#pragma once

#include <errno.h>  // program_invocation_short_name (glibc)

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace probe_io {

inline std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "%s: cannot read %s\n", program_invocation_short_name, path.c_str());
    std::exit(2);
  }
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

inline void write_file(const std::string& path, const void* p, size_t n) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(p), std::streamsize(n));
  if (!f) {
    std::fprintf(stderr, "%s: cannot write %s\n", program_invocation_short_name, path.c_str());
    std::exit(2);
  }
}

}  // namespace probe_io
