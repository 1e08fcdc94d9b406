#include "vmdk/descriptor.h"

#include <gtest/gtest.h>

#include <string>

namespace thindisk::vmdk {
namespace {

// What qemu-img writes for -o subformat=monolithicFlat.
constexpr const char* kFlat =
    "# Disk DescriptorFile\n"
    "version=1\n"
    "CID=1764907b\n"
    "parentCID=ffffffff\n"
    "createType=\"monolithicFlat\"\n"
    "\n"
    "# Extent description\n"
    "RW 20480 FLAT \"disk flat.vmdk\" 0\n"
    "\n"
    "# The Disk Data Base\n"
    "#DDB\n"
    "\n"
    "ddb.virtualHWVersion = \"4\"\n"
    "ddb.geometry.cylinders = \"20\"\n";

std::string WithLine(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos);
  return text.replace(at, from.size(), to);
}

TEST(VmdkDescriptorTest, ParsesQemuFlatDescriptor) {
  // Zero padding after the text, as in embedded descriptors.
  std::string text = std::string(kFlat) + std::string(64, '\0') + "garbage";
  auto d = ParseDescriptor(text);
  ASSERT_TRUE(d.has_value()) << d.error().ToString();
  EXPECT_EQ(d->create_type, "monolithicFlat");
  EXPECT_EQ(d->cid, 0x1764907bu);
  EXPECT_EQ(d->parent_cid, kNoParentCid);
  ASSERT_EQ(d->extents.size(), 1u);
  EXPECT_EQ(d->extents[0].access, "RW");
  EXPECT_EQ(d->extents[0].sectors, 20480u);
  EXPECT_EQ(d->extents[0].type, "FLAT");
  EXPECT_EQ(d->extents[0].filename, "disk flat.vmdk");
  EXPECT_EQ(d->extents[0].offset, 0u);
  EXPECT_TRUE(CheckSupported(*d).ok());
}

TEST(VmdkDescriptorTest, HandlesCrLfLines) {
  std::string text = kFlat;
  for (size_t at = 0; (at = text.find('\n', at)) != std::string::npos; at += 2) {
    text.insert(at, "\r");
  }
  auto d = ParseDescriptor(text);
  ASSERT_TRUE(d.has_value()) << d.error().ToString();
  EXPECT_EQ(d->create_type, "monolithicFlat");
  EXPECT_EQ(d->extents.at(0).filename, "disk flat.vmdk");
}

TEST(VmdkDescriptorTest, RefusesSplitMultiExtentAndDeltaImages) {
  auto split = ParseDescriptor(WithLine(kFlat, "monolithicFlat", "twoGbMaxExtentFlat"));
  ASSERT_TRUE(split.has_value());
  EXPECT_EQ(CheckSupported(*split).code(), Code::kNotSupported);

  std::string two = WithLine(kFlat, "RW 20480 FLAT \"disk flat.vmdk\" 0\n",
                             "RW 20480 FLAT \"a.vmdk\" 0\nRW 20480 FLAT \"b.vmdk\" 0\n");
  auto multi = ParseDescriptor(two);
  ASSERT_TRUE(multi.has_value());
  Status s = CheckSupported(*multi);
  EXPECT_EQ(s.code(), Code::kNotSupported);
  EXPECT_NE(s.message().find("2 extents"), std::string::npos) << s.message();

  auto delta = ParseDescriptor(WithLine(kFlat, "parentCID=ffffffff", "parentCID=12345678"));
  ASSERT_TRUE(delta.has_value());
  EXPECT_EQ(CheckSupported(*delta).code(), Code::kNotSupported);

  auto other = ParseDescriptor(WithLine(kFlat, "monolithicFlat", "fullDevice"));
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(CheckSupported(*other).code(), Code::kNotSupported);
}

TEST(VmdkDescriptorTest, ExtentTypeMustMatchCreateType) {
  auto d = ParseDescriptor(WithLine(kFlat, "monolithicFlat", "monolithicSparse"));
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(CheckSupported(*d).code(), Code::kCorrupt);
}

TEST(VmdkDescriptorTest, RejectsMalformedText) {
  auto no_type = ParseDescriptor(WithLine(kFlat, "createType=\"monolithicFlat\"", ""));
  ASSERT_FALSE(no_type.has_value());
  EXPECT_EQ(no_type.error().code(), Code::kCorrupt);

  for (const char* bad_extent : {"RW lots FLAT \"a\" 0", "RW 10 FLAT \"unterminated 0",
                                 "RW 10 FLAT a.vmdk 0", "RW 10 FLAT \"a\" -5",
                                 "RW 99999999999999999999999 FLAT \"a\" 0"}) {
    auto d = ParseDescriptor(WithLine(kFlat, "RW 20480 FLAT \"disk flat.vmdk\" 0", bad_extent));
    ASSERT_FALSE(d.has_value()) << bad_extent;
    EXPECT_EQ(d.error().code(), Code::kCorrupt) << bad_extent;
  }
  auto bad_cid = ParseDescriptor(WithLine(kFlat, "CID=1764907b", "CID=notahexnumber"));
  ASSERT_FALSE(bad_cid.has_value());
  EXPECT_EQ(bad_cid.error().code(), Code::kCorrupt);
}

TEST(VmdkDescriptorTest, CapsExtentLines) {
  std::string text = "createType=\"monolithicFlat\"\n";
  for (size_t i = 0; i <= kMaxExtentLines; ++i) text += "RW 1 FLAT \"a\" 0\n";
  auto d = ParseDescriptor(text);
  ASSERT_FALSE(d.has_value());
  EXPECT_EQ(d.error().code(), Code::kCorrupt);
}

TEST(VmdkDescriptorTest, RecognisesDescriptorFiles) {
  std::string text = kFlat;
  EXPECT_TRUE(LooksLikeDescriptor(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size())));
  std::string other = "#!/bin/sh\n";
  EXPECT_FALSE(LooksLikeDescriptor(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(other.data()), other.size())));
}

}  // namespace
}  // namespace thindisk::vmdk
