// AlignedBuffer (runtime/aligned_buffer.h), the storage of the layers' prepared
// activations and per-worker outputs: every size starts on a 64-byte line, the
// large ones included (a std::vector's block starts 16 bytes past one there),
// holds the value it was assigned, and a failed assign keeps the old contents.
#include <gtest/gtest.h>

#include <cstdint>
#include <new>

#include "runtime/aligned_buffer.h"

namespace {

using moejit::AlignedBuffer;

TEST(AlignedBuffer, EverySizeStartsOnALineAndHoldsItsValue) {
  for (size_t n : {size_t(1), size_t(63), size_t(100), size_t(4096), size_t(70000), size_t(200000),
                   size_t(3) << 20, size_t(40) << 20}) {
    AlignedBuffer<uint8_t> b;
    b.assign(n, 0x5A);
    ASSERT_EQ(b.size(), n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u) << n << " bytes";
    EXPECT_EQ(b.data()[0], 0x5A);
    EXPECT_EQ(b.data()[n - 1], 0x5A);
    EXPECT_EQ(b.data()[n / 2], 0x5A);
  }
  AlignedBuffer<float> f;
  f.assign(1000, 1.5f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data()) % 64, 0u);
  for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(f.data()[i], 1.5f) << i;
}

TEST(AlignedBuffer, EmptyAndReassigned) {
  AlignedBuffer<float> b;
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(b.data(), nullptr);
  b.assign(10, 2.0f);
  b.assign(3, 7.0f);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b.data()[2], 7.0f);
  b.assign(0, 0.0f);
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(b.data(), nullptr);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizedAllocator = true;  // reports an impossible size instead of throwing
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitizedAllocator = true;
#else
constexpr bool kSanitizedAllocator = false;
#endif
#else
constexpr bool kSanitizedAllocator = false;
#endif

TEST(AlignedBuffer, AFailedAssignKeepsTheOldContents) {
  if (kSanitizedAllocator) GTEST_SKIP() << "the sanitizer's allocator aborts on an impossible size";
  AlignedBuffer<uint8_t> b;
  b.assign(16, 9);
  EXPECT_THROW(b.assign(size_t(1) << 62, 0), std::bad_alloc);
  ASSERT_EQ(b.size(), 16u);
  EXPECT_EQ(b.data()[15], 9);
}

TEST(AlignedBuffer, ACountWhoseBytesOverflowIsRefused) {
  AlignedBuffer<float> b;
  b.assign(4, 3.0f);
  EXPECT_THROW(b.assign((size_t(-1) / sizeof(float)) + 2, 0.0f), std::bad_alloc);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b.data()[3], 3.0f);
}

TEST(AlignedBuffer, AlignedElemsRoundsUpToWholeLines) {
  EXPECT_EQ(moejit::aligned_elems<float>(0), 0u);
  EXPECT_EQ(moejit::aligned_elems<float>(1), 16u);
  EXPECT_EQ(moejit::aligned_elems<float>(16), 16u);
  EXPECT_EQ(moejit::aligned_elems<float>(17), 32u);
  EXPECT_EQ(moejit::aligned_elems<uint8_t>(65), 128u);
}

}  // namespace
