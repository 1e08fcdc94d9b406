#include "block/concat_device.h"

#include <gtest/gtest.h>

#include <vector>

#include "io/memory_storage.h"
#include "raw/raw_image.h"

namespace thindisk::block {
namespace {

// A raw device of `size` bytes, byte i holding fill + i.
std::unique_ptr<Device> RawPart(const std::string& name, size_t size, uint8_t fill) {
  auto storage = io::NewMemoryStorage(name);
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(fill + i);
  EXPECT_TRUE(storage->WriteAt(0, bytes).ok());
  auto device = raw::OpenRaw(std::move(storage), /*read_only=*/true, name);
  EXPECT_TRUE(device.has_value());
  return std::move(*device);
}

// 1000 bytes (taking 1024), an empty part, 4096 bytes.
ConcatDevice ThreeParts() {
  std::vector<std::unique_ptr<Device>> parts;
  parts.push_back(RawPart("a", 1000, 1));
  parts.push_back(RawPart("empty", 0, 0));
  parts.push_back(RawPart("c", 4096, 100));
  return ConcatDevice(std::move(parts));
}

TEST(ConcatDeviceTest, PartsTakeWholeSectorsAndReadsCrossThem) {
  ConcatDevice concat = ThreeParts();
  EXPECT_EQ(concat.size(), 1024u + 4096u);
  EXPECT_EQ(concat.info().filename, "a + empty + c");
  std::vector<uint8_t> buf(200);
  ASSERT_TRUE(concat.Read(950, buf).ok());
  for (size_t i = 0; i < buf.size(); ++i) {
    const uint64_t at = 950 + i;
    const uint8_t want = at < 1000   ? static_cast<uint8_t>(1 + at)
                         : at < 1024 ? 0
                                     : static_cast<uint8_t>(100 + (at - 1024));
    ASSERT_EQ(buf[i], want) << "byte " << at;
  }
  EXPECT_EQ(concat.Read(5000, buf).code(), Code::kOutOfRange);
  EXPECT_TRUE(concat.Write(0, buf).code() != Code::kOk);
}

TEST(ConcatDeviceTest, StatusStopsAtPartsAndShowsThePaddingAsZeros) {
  ConcatDevice concat = ThreeParts();
  auto first = concat.GetStatus(0, concat.size());
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->offset, 0u);
  EXPECT_EQ(first->length, 1000u);
  EXPECT_TRUE(first->data);
  EXPECT_FALSE(first->has_host_offset);
  auto padding = concat.GetStatus(1000, concat.size() - 1000);
  ASSERT_TRUE(padding.has_value());
  EXPECT_EQ(padding->offset, 1000u);
  EXPECT_EQ(padding->length, 24u);
  EXPECT_TRUE(padding->zero);
  EXPECT_FALSE(padding->data);
  auto last = concat.GetStatus(1024, 10000);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->offset, 1024u);
  EXPECT_EQ(last->length, 4096u);
  EXPECT_TRUE(last->data);
  EXPECT_FALSE(concat.GetStatus(concat.size(), 1).has_value());
  EXPECT_TRUE(concat.Close().ok());
}

}  // namespace
}  // namespace thindisk::block
