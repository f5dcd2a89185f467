// Helpers shared by the fuzz harnesses: a reader that turns the fuzz input into
// values (running out of input yields zeros, never fails), buffers whose first
// or last byte touches an inaccessible page (so out-of-bounds reads by
// generated code, which no sanitizer instruments, fault at once), and a check
// macro that aborts with a message (libFuzzer then saves the input).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

namespace fuzz {

#define FUZZ_CHECK(cond, ...)                                                         \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: check failed: %s\n  ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                              \
      std::fprintf(stderr, "\n");                                                     \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  uint8_t u8() { return i_ < n_ ? p_[i_++] : 0; }
  uint16_t u16() { return uint16_t(u8() | u8() << 8); }
  uint32_t u32() { return uint32_t(u16()) | uint32_t(u16()) << 16; }
  uint64_t u64() { return uint64_t(u32()) | uint64_t(u32()) << 32; }
  int32_t i32() { return int32_t(u32()); }
  int64_t i64() { return int64_t(u64()); }
  float f32() {
    const uint32_t u = u32();
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  bool flag() { return u8() & 1; }
  // True with probability about n/256.
  bool chance(int n) { return u8() < n; }
  // Uniform-ish integer in [lo, hi].
  int64_t range(int64_t lo, int64_t hi) {
    const uint64_t span = uint64_t(hi - lo) + 1;
    const uint64_t v = span <= 256 ? u8() : span <= 65536 ? u16() : u32();
    return lo + int64_t(v % span);
  }
  // Fills `n` bytes from the input, repeating what is left of it (zeros once it is used up).
  void fill(uint8_t* dst, size_t n) {
    const size_t left = n_ - i_;
    if (left == 0) {
      std::memset(dst, 0, n);
      return;
    }
    const size_t seed_len = left < 4096 ? left : 4096;
    for (size_t i = 0; i < n; ++i) dst[i] = uint8_t(p_[i_ + i % seed_len] + 0x9D * (i / seed_len));
  }
  size_t remaining() const { return n_ - i_; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t i_ = 0;
};

// `size` bytes in their own mapping: the byte after the last one (at_end) or the
// byte before the first one (!at_end) lies in a PROT_NONE page. Reads past the
// buffer on that side fault (SIGSEGV), whatever code makes them.
class Guarded {
 public:
  Guarded() = default;
  Guarded(size_t size, bool at_end) { init(size, at_end); }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;
  Guarded(Guarded&& o) noexcept { *this = std::move(o); }
  Guarded& operator=(Guarded&& o) noexcept {
    std::swap(base_, o.base_);
    std::swap(total_, o.total_);
    std::swap(ptr_, o.ptr_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~Guarded() {
    if (base_) munmap(base_, total_);
  }
  void init(size_t size, bool at_end) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t body = (size + page - 1) / page * page;
    total_ = body + 2 * page;
    void* m = mmap(nullptr, total_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    FUZZ_CHECK(m != MAP_FAILED, "mmap of %zu bytes failed", total_);
    base_ = static_cast<uint8_t*>(m);
    if (body) FUZZ_CHECK(mprotect(base_ + page, body, PROT_READ | PROT_WRITE) == 0, "mprotect failed");
    size_ = size;
    ptr_ = at_end ? base_ + page + body - size : base_ + page;
  }
  uint8_t* data() { return ptr_; }
  const uint8_t* data() const { return ptr_; }
  size_t size() const { return size_; }

 private:
  uint8_t* base_ = nullptr;
  size_t total_ = 0;
  uint8_t* ptr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fuzz
