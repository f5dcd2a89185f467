// Small helpers shared by the C API suites.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "moejit.h"

namespace moejit_test {

inline std::string last_error() {
  const char* m = moejit_last_error();
  return m ? std::string(m) : std::string("<NULL>");
}

inline bool is_ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// A problem's name as a gtest parameter name: every character but letters and
// digits becomes '_'.
inline std::string sanitize(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

// True when `msg` mentions `arg` as a whole C expression: not preceded or
// followed by an identifier character ("out" does not match "output_dtype",
// "gate_up[3].data" matches "desc->gate_up[3].data is NULL").
inline bool names_arg(const std::string& msg, const std::string& arg) {
  for (size_t pos = msg.find(arg); pos != std::string::npos; pos = msg.find(arg, pos + 1)) {
    const bool left_ok = pos == 0 || !is_ident_char(msg[pos - 1]);
    const size_t end = pos + arg.size();
    const bool right_ok = end >= msg.size() || !is_ident_char(msg[end]) || !is_ident_char(arg.back());
    if (left_ok && right_ok) return true;
  }
  return false;
}

// The library's message convention: "<function>: ..." naming the argument.
inline ::testing::AssertionResult message_names(const char* function, const std::string& arg) {
  const std::string msg = last_error();
  const std::string prefix = std::string(function) + ": ";
  if (msg.compare(0, prefix.size(), prefix) != 0)
    return ::testing::AssertionFailure()
           << "message does not start with \"" << prefix << "\": \"" << msg << "\"";
  if (!arg.empty() && !names_arg(msg.substr(prefix.size()), arg))
    return ::testing::AssertionFailure() << "message does not name \"" << arg << "\": \"" << msg << "\"";
  return ::testing::AssertionSuccess();
}

// Every tier of the API, lowest first (api.md). Tests force each one the host
// has and skip, with a message, the ones it lacks.
inline const moejit_isa kTiers[] = {MOEJIT_ISA_SCALAR, MOEJIT_ISA_AVX2, MOEJIT_ISA_AVX512,
                                    MOEJIT_ISA_AVX512_BF16, MOEJIT_ISA_AVX512_AMX};
inline constexpr moejit_isa kHighestTier = MOEJIT_ISA_AVX512_AMX;

// Status names for readable failures.
inline const char* sname(moejit_status s) { return moejit_status_name(s); }

// A byte buffer filled with a sentinel pattern, checked afterwards.
struct Sentinel {
  std::vector<uint8_t> bytes;
  explicit Sentinel(size_t n, uint8_t pattern = 0xA5) : bytes(n, pattern), pattern_(pattern) {}
  void* data() { return bytes.data(); }
  // Index of the first byte at or after `from` that no longer holds the pattern, or -1.
  long first_changed(size_t from = 0) const {
    for (size_t i = from; i < bytes.size(); ++i)
      if (bytes[i] != pattern_) return long(i);
    return -1;
  }
  uint8_t pattern_;
};

// Keeps MOEJIT_MAX_ISA out of tests that do not set it on purpose.
inline void clear_isa_env() { unsetenv("MOEJIT_MAX_ISA"); }

inline moejit_context_desc context_desc(moejit_isa isa = MOEJIT_ISA_AUTO, int32_t threads = 0) {
  moejit_context_desc d;
  std::memset(&d, 0, sizeof(d));
  d.struct_size = sizeof(d);
  d.num_threads = threads;
  d.max_isa = isa;
  return d;
}

}  // namespace moejit_test
