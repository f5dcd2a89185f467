// moejit-bench: machine helpers (big buffers, fast random fill, threads, DRAM read bandwidth).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace moejit_bench {

// A large anonymous mapping, 2 MiB aligned, transparent huge pages requested (like the pinned
// host banks an engine holds). Move-only; throws std::runtime_error when the mapping fails.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes);
  Buffer(Buffer&& other) noexcept { *this = static_cast<Buffer&&>(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* base_ = nullptr;  // start of the mapping
  uint8_t* data_ = nullptr;  // 2 MiB aligned start of the usable bytes
  size_t size_ = 0;
  size_t mapped_ = 0;
};

// wyrand: 8 random bytes per step, fast enough that filling GBs is bound by page faults.
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {
    state += 0xA0761D6478BD642Full;
    const __uint128_t m = __uint128_t(state) * (state ^ 0xE7037ED1A0B428DBull);
    return uint64_t(m >> 64) ^ uint64_t(m);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }              // [0, 1)
  uint32_t below(uint32_t n) { return uint32_t((next() >> 32) * n >> 32); }  // [0, n)
};

// CPUs of this process's affinity mask (at least one entry).
std::vector<int> affinity_cpus();
// Size of the last-level (L3) cache of CPU 0 in bytes, 0 when unknown.
int64_t l3_cache_bytes();
// "model name" of /proc/cpuinfo, "unknown CPU" when absent.
std::string cpu_model_name();
// Physical memory in bytes.
int64_t physical_memory_bytes();

// Runs fn(chunk) for chunk in [0, num_chunks) on up to `threads` threads.
void parallel_for(int64_t num_chunks, int threads, const std::function<void(int64_t)>& fn);

// Fills `bytes` bytes at `dst` with random 64-bit words passed through `shape` (deterministic
// for a seed, whatever the thread count). `shape` maps a random word to the stored word.
void fill_words(uint8_t* dst, size_t bytes, uint64_t seed, uint64_t (*shape)(uint64_t));

// CPU time used on the whole machine (from /proc/stat, steal included) and by this process, to
// tell whether other processes competed with a measurement.
struct CpuSample {
  double machine_busy_s = 0;
  double self_s = 0;
  double wall_s = 0;
};
CpuSample sample_cpu();
// Average number of CPUs that others (other processes, the hypervisor) used between a and b.
double foreign_cpus(const CpuSample& a, const CpuSample& b);

// Read bandwidth in GB/s (1e9 bytes/s) of `threads` threads each summing its own contiguous
// slice of `buffer`, median of `passes` passes. Threads are pinned to the affinity CPUs in turn.
double measure_read_bandwidth(const Buffer& buffer, int threads, int passes);

}  // namespace moejit_bench
