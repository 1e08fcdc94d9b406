// The export views of serve_devices.h over an in-memory device: a window
// shows exactly its bytes and block status and refuses the rest; write
// through marks every write and write-zeroes FUA.
#include "cli/serve_devices.h"

#include <gtest/gtest.h>

#include "io/memory_storage.h"
#include "nbd/testing/memory_device.h"
#include "raw/raw_image.h"

namespace thindisk::cli {
namespace {

using nbd::testing::MemoryDevice;

constexpr uint64_t kBlock = MemoryDevice::kBlock;

std::vector<uint8_t> Filled(size_t n, uint8_t v) { return std::vector<uint8_t>(n, v); }

TEST(WindowDeviceTest, ShiftsRequestsAndRefusesOutside) {
  auto mem = std::make_shared<MemoryDevice>(16 * kBlock);
  ASSERT_TRUE(mem->Write(4 * kBlock, Filled(kBlock, 0xaa), {}).ok());
  WindowDevice win(mem, 4 * kBlock, 8 * kBlock);
  EXPECT_EQ(win.size(), 8 * kBlock);

  std::vector<uint8_t> got(kBlock);
  ASSERT_TRUE(win.Read(0, got).ok());
  EXPECT_EQ(got, Filled(kBlock, 0xaa));
  ASSERT_TRUE(win.Write(7 * kBlock, Filled(kBlock, 0xbb), {}).ok());
  std::vector<uint8_t> under = mem->Contents();
  EXPECT_EQ(under[11 * kBlock], 0xbb);
  EXPECT_EQ(under[12 * kBlock], 0);  // past the window: untouched

  EXPECT_EQ(win.Read(7 * kBlock + 1, got).code(), Code::kOutOfRange);
  EXPECT_EQ(win.Write(8 * kBlock, Filled(1, 1), {}).code(), Code::kOutOfRange);
  EXPECT_EQ(win.WriteZeroes(0, 9 * kBlock, {}).code(), Code::kOutOfRange);
  EXPECT_EQ(win.Discard(~0ull - 10, 20).code(), Code::kOutOfRange);
  EXPECT_EQ(win.Resize(4 * kBlock, true).code(), Code::kNotSupported);
  EXPECT_EQ(mem->size(), 16 * kBlock);

  ASSERT_TRUE(win.Discard(0, kBlock).ok());
  ASSERT_TRUE(win.Read(0, got).ok());
  EXPECT_EQ(got, Filled(kBlock, 0));
}

TEST(WindowDeviceTest, BlockStatusIsClippedToTheWindow) {
  auto mem = std::make_shared<MemoryDevice>(16 * kBlock);
  // Data at blocks 2..5; the window is blocks 3..6.
  ASSERT_TRUE(mem->Write(2 * kBlock, Filled(4 * kBlock, 1), {}).ok());
  WindowDevice win(mem, 3 * kBlock, 4 * kBlock);
  auto first = win.GetStatus(0, 100 * kBlock);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->offset, 0u);
  EXPECT_TRUE(first->data);
  EXPECT_EQ(first->length, 3 * kBlock);
  auto hole = win.GetStatus(3 * kBlock, 100 * kBlock);
  ASSERT_TRUE(hole.has_value());
  EXPECT_EQ(hole->offset, 3 * kBlock);
  EXPECT_FALSE(hole->data);
  EXPECT_EQ(hole->length, kBlock);  // not the rest of the image
  EXPECT_FALSE(win.GetStatus(5 * kBlock, 1).has_value());
}

// Counts write-zeroes requests that carry FUA (MemoryDevice counts writes).
class ZeroFuaCounter : public MemoryDevice {
 public:
  using MemoryDevice::MemoryDevice;
  Status WriteZeroes(uint64_t offset, uint64_t length, block::ZeroFlags flags) override {
    if (flags.fua) ++fua_zeroes;
    return MemoryDevice::WriteZeroes(offset, length, flags);
  }
  int fua_zeroes = 0;
};

// Read plans go through both views: the window's shifted by its offset.
TEST(WindowDeviceTest, ReadPlansAreShiftedAndWriteThroughPassesThemOn) {
  auto storage = io::NewMemoryStorage("w.raw");
  io::MemoryStorage* mem = storage.get();
  ASSERT_TRUE(storage->WriteAt(0, Filled(16 * kBlock, 1)).ok());
  auto raw = raw::OpenRaw(std::move(storage), /*read_only=*/true, "w.raw");
  ASSERT_TRUE(raw.has_value());
  auto win = std::make_shared<WindowDevice>(
      std::shared_ptr<block::Device>(std::move(*raw)), 4 * kBlock, 8 * kBlock);
  WriteThroughDevice through(win);
  auto plan = through.PlanRead(kBlock, 2 * kBlock);
  ASSERT_TRUE(plan.has_value()) << plan.status().ToString();
  ASSERT_EQ(plan->pieces.size(), 1u);
  EXPECT_EQ(plan->pieces[0].storage, mem);
  EXPECT_EQ(plan->pieces[0].host_offset, 5 * kBlock);
  EXPECT_EQ(plan->pieces[0].buf_offset, 0u);
  EXPECT_EQ(plan->pieces[0].length, 2 * kBlock);
  EXPECT_EQ(win->PlanRead(7 * kBlock, 2 * kBlock).status().code(), Code::kOutOfRange);
}

TEST(WriteThroughDeviceTest, EveryWriteIsFua) {
  auto mem = std::make_shared<ZeroFuaCounter>(16 * kBlock);
  WriteThroughDevice wt(mem);
  ASSERT_TRUE(wt.Write(0, Filled(kBlock, 3), {}).ok());
  ASSERT_TRUE(wt.Write(kBlock, Filled(kBlock, 4), {}).ok());
  EXPECT_EQ(mem->fua_writes(), 2u);
  ASSERT_TRUE(wt.WriteZeroes(0, kBlock, {}).ok());
  EXPECT_EQ(mem->fua_zeroes, 1);
  ASSERT_TRUE(wt.Discard(2 * kBlock, kBlock).ok());
  EXPECT_EQ(mem->fua_writes(), 2u);  // reads and discards pass as they are
  std::vector<uint8_t> got(kBlock);
  ASSERT_TRUE(wt.Read(kBlock, got).ok());
  EXPECT_EQ(got, Filled(kBlock, 4));
}

}  // namespace
}  // namespace thindisk::cli
