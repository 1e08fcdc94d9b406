#include "qcow2/snapshot_table.h"

#include <gtest/gtest.h>

#include <vector>

#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

// ---- snapshots ----

TEST(SnapshotTable, RoundTrip) {
  std::vector<Snapshot> in(2);
  in[0].l1_table_offset = 0x50000;
  in[0].l1_size = 2;
  in[0].id = "1";
  in[0].name = "before upgrade";
  in[0].date_sec = 1700000000;
  in[0].date_nsec = 5;
  in[0].vm_clock_nsec = 123456789;
  in[0].vm_state_size_large = 1ull << 33;
  in[0].disk_size = 1ull << 30;
  in[1].l1_table_offset = 0x70000;
  in[1].l1_size = 4;
  in[1].id = "22";
  in[1].name = "x";
  in[1].extra = std::vector<uint8_t>(24, 0);  // QEMU writes 24 bytes (icount)
  in[1].extra[23] = 9;
  std::vector<uint8_t> bytes = EncodeSnapshotTable(in);
  EXPECT_EQ(bytes.size() % 8, 0u);
  auto out = DecodeSnapshotTable(bytes, 2, 16);
  ASSERT_TRUE(out.has_value()) << out.status().ToString();
  ASSERT_EQ(out->size(), 2u);
  EXPECT_EQ((*out)[0].name, "before upgrade");
  EXPECT_EQ((*out)[0].id, "1");
  EXPECT_EQ((*out)[0].vm_state_size_large, 1ull << 33);
  EXPECT_EQ((*out)[0].disk_size, 1ull << 30);
  EXPECT_EQ((*out)[0].vm_clock_nsec, 123456789u);
  EXPECT_EQ((*out)[0].extra.size(), 16u);
  EXPECT_EQ((*out)[1].l1_table_offset, 0x70000u);
  EXPECT_EQ((*out)[1].l1_size, 4u);
  EXPECT_EQ((*out)[1].extra.size(), 24u);
  EXPECT_EQ((*out)[1].extra[23], 9);
  EXPECT_EQ(EncodeSnapshotTable(*out), bytes);
}

TEST(SnapshotTable, HostileTablesAreCorrupt) {
  Snapshot s;
  s.l1_table_offset = 0x50000;
  s.id = "1";
  s.name = "snap";
  std::vector<uint8_t> good = EncodeSnapshotTable({s});

  auto truncated = good;
  truncated.resize(50);
  auto r = DecodeSnapshotTable(truncated, 1, 16);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kCorrupt);
  EXPECT_NE(r.error().message().find("past the end"), std::string::npos);

  r = DecodeSnapshotTable(good, 2, 16);  // more entries than bytes
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("truncated"), std::string::npos);

  auto unaligned = good;
  StoreBe64(&unaligned[0], 0x50200);
  r = DecodeSnapshotTable(unaligned, 1, 16);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("not cluster aligned"), std::string::npos);

  auto big_extra = good;
  StoreBe32(&big_extra[36], 1u << 20);
  r = DecodeSnapshotTable(big_extra, 1, 16);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("extra data size"), std::string::npos);
}

}  // namespace
}  // namespace thindisk::qcow2
