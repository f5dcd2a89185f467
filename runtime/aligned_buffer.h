// Storage for the buffers generated kernels read or write with vector
// accesses: the prepared activations and the per-worker outputs. 64-byte
// aligned, so a 512-bit access never spans two cache lines; a std::vector's
// block starts 16 bytes past a line for glibc's large (mmap) allocations,
// which split every x load of every kernel.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

namespace moejit {

template <class T>
class AlignedBuffer {
 public:
  static constexpr std::size_t kAlign = 64;
  // n elements, each v; throws std::bad_alloc, the buffer unchanged then.
  void assign(std::size_t n, const T& v) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_alloc();
    Owned p(n ? static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kAlign))) : nullptr);
    for (std::size_t i = 0; i < n; ++i) p.get()[i] = v;
    p_ = std::move(p);
    n_ = n;
  }
  T* data() { return p_.get(); }
  const T* data() const { return p_.get(); }
  std::size_t size() const { return n_; }

 private:
  struct Free {
    void operator()(T* p) const { ::operator delete(p, std::align_val_t(kAlign)); }
  };
  using Owned = std::unique_ptr<T, Free>;
  Owned p_;
  std::size_t n_ = 0;
};

// Elements of T per aligned block: per-worker areas sized in multiples of it
// start on a line.
template <class T>
constexpr std::size_t aligned_elems(std::size_t n) {
  constexpr std::size_t per = AlignedBuffer<T>::kAlign / sizeof(T);
  return (n + per - 1) / per * per;
}

}  // namespace moejit
