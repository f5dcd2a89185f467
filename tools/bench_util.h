// moejit-bench: machine helpers (big buffers, fast random fill, threads, DRAM read bandwidth).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace moejit_bench {

// A large anonymous mapping, 2 MiB aligned, transparent huge pages requested (like the pinned
// host banks an engine holds; huge_pages = false asks for 4 KiB pages instead). Move-only; throws
// std::runtime_error when the mapping fails.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes, bool huge_pages = true);
  Buffer(Buffer&& other) noexcept { *this = static_cast<Buffer&&>(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Bytes of the buffer on transparent huge pages now (AnonHugePages of /proc/self/smaps over the
  // mappings it spans; MADV_HUGEPAGE is a request the kernel may not grant), -1 when unknown.
  int64_t huge_page_bytes() const;

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
// Bytes of L3 the affinity CPUs can fill: the sum over the distinct L3 caches they share (one on
// most single-socket parts, one per CCD on AMD), 0 when unknown.
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

// One way to stream-read a buffer. Each thread sums 128 bytes per step of each of its `streams`
// cursors (interleaved), with `vector_bytes` loads, and prefetches each cursor's lines `distance`
// bytes ahead with `prefetch`. static: thread t reads the t-th contiguous slice; dynamic: threads
// take 2 MiB chunks from a shared counter until none is left (no thread idles while a slower one
// finishes its slice).
enum class Prefetch { none, t0, t1, nta };
struct ReadVariant {
  int vector_bytes = 32;  // 32: AVX2 loads, 64: AVX-512 loads
  int streams = 1;        // 1, 2, 4 or 8
  Prefetch prefetch = Prefetch::none;
  int distance = 0;  // bytes ahead of each cursor (prefetch != none)
  bool dynamic = false;
  std::string name() const;  // "avx2 x1", "avx512 x4 t1+4K dyn", ...
  bool available() const;    // this CPU has the loads
  bool operator==(const ReadVariant&) const = default;
};
// The probe moejit-bench had before it tried variants: AVX2, one stream, no prefetch, static.
inline constexpr ReadVariant kPlainRead{};
// Variants moejit-bench tries at start-up (the plain one first), and the larger grid of --probe;
// only those this CPU can run.
std::vector<ReadVariant> startup_read_variants();
std::vector<ReadVariant> all_read_variants();
// The variant of all_read_variants() with this name, false if none.
bool parse_read_variant(const std::string& name, ReadVariant* out);

// Read bandwidth in GB/s (1e9 bytes/s) of `threads` threads reading `buffer` with each variant,
// median of `passes` passes per variant; the variants take turns pass by pass, so a drift of the
// machine's bandwidth hits them alike. Threads are pinned to the affinity CPUs in turn.
std::vector<double> measure_read_variants(const Buffer& buffer, int threads, int passes,
                                          const std::vector<ReadVariant>& variants);
double measure_read_bandwidth(const Buffer& buffer, int threads, int passes,
                              const ReadVariant& variant = kPlainRead);
// One pass of `variant`: the bytes it counts and the sum of the 64-bit words it read (a test checks
// that every variant reads exactly the bytes its GB/s counts).
struct ReadCheck {
  uint64_t bytes = 0, sum = 0;
};
ReadCheck check_read_variant(const Buffer& buffer, int threads, const ReadVariant& variant);

}  // namespace moejit_bench
