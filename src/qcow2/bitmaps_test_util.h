// Helpers shared by the persistent bitmap tests (bitmaps_test.cc,
// bitmaps_tracking_test.cc, bitmaps_fault_test.cc, bitmaps_interop_test.cc):
// expected bits from byte ranges, readable mismatches, listing and checking
// images, and editing a bitmap's flags on disk the way a crashed qemu leaves
// them.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "qcow2/bitmaps.h"
#include "qcow2/check.h"
#include "qcow2/image_test_util.h"

namespace thindisk::qcow2::testing {

struct ByteRange {
  uint64_t offset;
  uint64_t length;
};

// Marks in `bits` (one per 2^granularity_bits bytes) every granule that
// [offset, offset + length) touches.
inline void MarkRange(BitVector& bits, uint32_t granularity_bits, ByteRange r) {
  if (r.length == 0) return;
  const uint64_t first = r.offset >> granularity_bits;
  const uint64_t last = (r.offset + r.length - 1) >> granularity_bits;
  bits.SetRange(first, last - first + 1);
}

// The bits a bitmap of this granularity over `disk_size` bytes holds after
// changes to `ranges` (and nothing else).
inline BitVector Touched(uint64_t disk_size, uint32_t granularity_bits,
                         const std::vector<ByteRange>& ranges) {
  BitVector bits(BitmapBits(disk_size, granularity_bits));
  for (const ByteRange& r : ranges) MarkRange(bits, granularity_bits, r);
  return bits;
}

// "[a, b) [c, d) ..." of the set bits, for failure messages.
inline std::string SetRuns(const BitVector& bits) {
  std::string out = "size " + std::to_string(bits.size()) + ":";
  for (uint64_t a = bits.NextSet(0); a < bits.size();) {
    const uint64_t b = bits.NextClear(a);
    out += " [" + std::to_string(a) + ", " + std::to_string(b) + ")";
    a = bits.NextSet(b);
  }
  return out;
}

inline BitVector MustRead(block::Device& image, const std::string& name) {
  auto bits = ReadBitmap(image, name);
  EXPECT_TRUE(bits.has_value()) << name << ": " << bits.status().ToString();
  return bits ? *bits : BitVector();
}

// Bitmap `name` of `image` holds exactly `want`; a mismatch prints both as runs.
#define EXPECT_BITS(image, name, want)                                             \
  do {                                                                             \
    const BitVector got_bits_ = ::thindisk::qcow2::testing::MustRead(image, name); \
    const BitVector& want_bits_ = (want);                                          \
    EXPECT_TRUE(got_bits_ == want_bits_)                                           \
        << "bitmap " << (name) << "\n  got  "                                      \
        << ::thindisk::qcow2::testing::SetRuns(got_bits_) << "\n  want "           \
        << ::thindisk::qcow2::testing::SetRuns(want_bits_);                        \
  } while (0)

// Whether every bit of `want` is set in `got` (same size).
inline bool Covers(const BitVector& got, const BitVector& want) {
  if (got.size() != want.size()) return false;
  BitVector both = got;
  both.Or(want);
  return both == got;
}

inline std::vector<BitmapInfo> MustList(block::Device& image) {
  auto list = ListBitmaps(image);
  EXPECT_TRUE(list.has_value()) << list.status().ToString();
  return list ? *list : std::vector<BitmapInfo>{};
}

inline std::vector<std::string> Names(block::Device& image) {
  std::vector<std::string> names;
  for (const BitmapInfo& b : MustList(image)) names.push_back(b.name);
  return names;
}

inline Status Add(Image& image, const std::string& name, uint32_t granularity_bits = 16,
                  bool enabled = true) {
  return AddBitmap(image, BitmapAddOptions{name, granularity_bits, enabled});
}

// The check finds neither corruption nor leaks (`leaks_allowed`: leaks at most).
inline void ExpectCheckClean(io::Storage& storage, bool leaks_allowed = false) {
  auto report = Check(storage, RepairMode::kNone);
  ASSERT_TRUE(report.has_value()) << report.status().ToString();
  std::string all;
  for (const std::string& m : report->messages) all += m + "\n";
  EXPECT_EQ(report->corruptions, 0u) << all;
  EXPECT_EQ(report->check_errors, 0u) << all;
  if (!leaks_allowed) {
    EXPECT_EQ(report->leaks, 0u) << all;
  }
}

inline CreateOptions Options(uint64_t size, uint32_t cluster_size = 128 * 1024,
                             bool extended_l2 = true) {
  CreateOptions co;
  co.size = size;
  co.cluster_size = cluster_size;
  co.extended_l2 = extended_l2;
  return co;
}

// Sets `flags` on bitmap `name` in the directory that `header` names, on a
// closed image's storage: what a qemu that crashed leaves (in_use).
inline void SetDirectoryFlags(io::Storage& storage, const Header& header,
                              const std::string& name, uint32_t flags) {
  ASSERT_TRUE(header.bitmaps.has_value());
  std::vector<uint8_t> raw(header.bitmaps->bitmap_directory_size);
  ASSERT_TRUE(storage.ReadAt(header.bitmaps->bitmap_directory_offset, raw).ok());
  auto dir = DecodeBitmapDirectory(raw, header.bitmaps->nb_bitmaps);
  ASSERT_TRUE(dir.has_value()) << dir.status().ToString();
  bool found = false;
  for (BitmapDirectoryEntry& e : *dir) {
    if (e.name == name) {
      e.flags |= flags;
      found = true;
    }
  }
  ASSERT_TRUE(found) << name;
  std::vector<uint8_t> bytes = EncodeBitmapDirectory(*dir);
  ASSERT_EQ(bytes.size(), raw.size());
  ASSERT_TRUE(storage.WriteAt(header.bitmaps->bitmap_directory_offset, bytes).ok());
}

}  // namespace thindisk::qcow2::testing
