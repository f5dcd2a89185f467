// The tests' one random number generator (splitmix64): deterministic for a
// seed on every platform and C++ library, and a UniformRandomBitGenerator, so
// the <random> distributions and std::shuffle take it too.
#pragma once

#include <cstdint>
#include <limits>

namespace moejit_test {

struct Rng {
  using result_type = uint64_t;
  uint64_t s;
  explicit Rng(uint64_t seed = 1) : s(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t operator()() { return next(); }
  static constexpr uint64_t min() { return 0; }
  static constexpr uint64_t max() { return std::numeric_limits<uint64_t>::max(); }
  int uniform(int lo, int hi) { return lo + int(next() % uint64_t(hi - lo + 1)); }  // inclusive
  double unit() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }       // [0, 1)
  bool chance(double p) { return unit() < p; }
};

}  // namespace moejit_test
