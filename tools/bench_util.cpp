#include "bench_util.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace moejit_bench {

namespace {

constexpr size_t kHugePage = size_t(2) << 20;

void pin_to(std::thread& t, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(t.native_handle(), sizeof(set), &set);  // best effort
}

uint64_t sum_plain(const uint8_t* p, size_t n) {
  const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  size_t i = 0;
  for (; i + 4 <= n / 8; i += 4) {
    a0 += w[i];
    a1 += w[i + 1];
    a2 += w[i + 2];
    a3 += w[i + 3];
  }
  for (; i < n / 8; ++i) a0 += w[i];
  return a0 + a1 + a2 + a3;
}

// Streaming read: four independent 256-bit accumulators, 128 bytes per iteration.
__attribute__((target("avx2"))) uint64_t sum_avx2(const uint8_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + sum_plain(p + i, n - i);
}

uint64_t sum_slice(const uint8_t* p, size_t n) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 ? sum_avx2(p, n) : sum_plain(p, n);
}

}  // namespace

Buffer::Buffer(size_t bytes) {
  if (bytes == 0) return;
  mapped_ = (bytes + kHugePage - 1) / kHugePage * kHugePage + kHugePage;
  void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    mapped_ = 0;
    throw std::runtime_error("cannot map " + std::to_string(bytes) + " bytes: " + std::strerror(errno));
  }
  base_ = static_cast<uint8_t*>(p);
  const uintptr_t aligned = (reinterpret_cast<uintptr_t>(p) + kHugePage - 1) & ~(kHugePage - 1);
  data_ = reinterpret_cast<uint8_t*>(aligned);
  size_ = bytes;
  madvise(data_, (bytes + kHugePage - 1) / kHugePage * kHugePage, MADV_HUGEPAGE);
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    this->~Buffer();
    base_ = std::exchange(other.base_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

Buffer::~Buffer() {
  if (base_) munmap(base_, mapped_);
  base_ = data_ = nullptr;
  size_ = mapped_ = 0;
}

std::vector<int> affinity_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

int64_t l3_cache_bytes() {
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level(dir + "level"), size(dir + "size");
    int lv = 0;
    std::string s;
    if (!(level >> lv) || !(size >> s)) continue;
    if (lv != 3 || s.empty()) continue;
    int64_t v = std::stoll(s);
    const char unit = s.back();
    if (unit == 'K') v <<= 10;
    if (unit == 'M') v <<= 20;
    return v;
  }
  const long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return v > 0 ? v : 0;
}

std::string cpu_model_name() {
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "unknown CPU" : line.substr(start);
  }
  return "unknown CPU";
}

int64_t physical_memory_bytes() { return int64_t(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE); }

void parallel_for(int64_t num_chunks, int threads, const std::function<void(int64_t)>& fn) {
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t c; (c = next.fetch_add(1)) < num_chunks;) fn(c);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min<int64_t>(threads, num_chunks); ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

void fill_words(uint8_t* dst, size_t bytes, uint64_t seed, uint64_t (*shape)(uint64_t)) {
  constexpr size_t kChunk = size_t(16) << 20;
  const int64_t chunks = int64_t((bytes + kChunk - 1) / kChunk);
  parallel_for(chunks, int(affinity_cpus().size()), [&](int64_t c) {
    Rng rng(seed ^ (uint64_t(c) * 0xD1B54A32D192ED03ull));
    const size_t begin = size_t(c) * kChunk, end = std::min(bytes, begin + kChunk);
    size_t i = begin;
    for (; i + 8 <= end; i += 8) {
      const uint64_t w = shape(rng.next());
      std::memcpy(dst + i, &w, 8);
    }
    if (i < end) {
      const uint64_t w = shape(rng.next());
      std::memcpy(dst + i, &w, end - i);
    }
  });
}

CpuSample sample_cpu() {
  CpuSample s;
  s.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  std::ifstream stat("/proc/stat");
  std::string cpu;
  uint64_t v[8] = {};  // user nice system idle iowait irq softirq steal
  if (stat >> cpu && cpu == "cpu") {
    for (uint64_t& x : v) stat >> x;
    const uint64_t busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    s.machine_busy_s = double(busy) / double(sysconf(_SC_CLK_TCK));
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  s.self_s = double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
             1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  return s;
}

double foreign_cpus(const CpuSample& a, const CpuSample& b) {
  const double wall = b.wall_s - a.wall_s;
  if (wall <= 0 || b.machine_busy_s <= 0) return 0.0;
  return std::max(0.0, ((b.machine_busy_s - a.machine_busy_s) - (b.self_s - a.self_s)) / wall);
}

double measure_read_bandwidth(const Buffer& buffer, int threads, int passes) {
  const std::vector<int> cpus = affinity_cpus();
  const size_t slice = buffer.size() / size_t(threads) / 4096 * 4096;
  std::barrier sync(threads + 1);
  std::atomic<uint64_t> sink{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const uint8_t* p = buffer.data() + size_t(t) * slice;
      for (int pass = 0; pass < passes; ++pass) {
        sync.arrive_and_wait();  // start
        sink.fetch_add(sum_slice(p, slice), std::memory_order_relaxed);
        sync.arrive_and_wait();  // done
      }
    });
    pin_to(pool.back(), cpus[size_t(t) % cpus.size()]);
  }
  std::vector<double> rates;
  for (int pass = 0; pass < passes; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(double(slice) * threads / s / 1e9);
  }
  for (auto& t : pool) t.join();
  // The median, like the per-call times it is compared with.
  std::sort(rates.begin(), rates.end());
  return rates.empty() ? 0.0 : rates[rates.size() / 2];
}

}  // namespace moejit_bench
