#include "raw/raw_image.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "io/forwarding_storage.h"
#include "io/memory_storage.h"

namespace thindisk::raw {
namespace {

constexpr uint64_t kChunk = io::MemoryStorage::kChunkSize;

// A storage whose host can neither punch holes nor reserve space (NFS v3).
class NoPunchStorage final : public io::Storage {
 public:
  explicit NoPunchStorage(io::MemoryStorage* mem) : mem_(mem) {}
  Status ReadAt(uint64_t o, std::span<uint8_t> b) override { return mem_->ReadAt(o, b); }
  Status WriteAt(uint64_t o, std::span<const uint8_t> b) override { return mem_->WriteAt(o, b); }
  Status Flush() override { return mem_->Flush(); }
  Result<uint64_t> Size() override { return mem_->Size(); }
  Status Resize(uint64_t s) override { return mem_->Resize(s); }
  Status Allocate(uint64_t, uint64_t) override { return Status::NotSupported("no fallocate"); }
  Status PunchHole(uint64_t, uint64_t) override { return Status::NotSupported("no punch"); }
  Status ZeroRange(uint64_t o, uint64_t l) override { return mem_->ZeroRange(o, l); }
  Result<uint64_t> NextData(uint64_t o) override { return mem_->NextData(o); }
  Result<uint64_t> NextHole(uint64_t o) override { return mem_->NextHole(o); }
  Result<uint64_t> AllocatedBytes() override { return mem_->AllocatedBytes(); }
  uint64_t bytes_written() const override { return mem_->bytes_written(); }
  const std::string& name() const override { return mem_->name(); }

 private:
  io::MemoryStorage* mem_;
};

std::unique_ptr<block::Device> OpenSized(uint64_t size, io::MemoryStorage** raw_mem = nullptr,
                                         bool read_only = false) {
  auto mem = io::NewMemoryStorage("disk.raw");
  EXPECT_TRUE(CreateRaw(*mem, size, RawPrealloc::kOff).ok());
  if (raw_mem) *raw_mem = mem.get();
  auto dev = OpenRaw(std::move(mem), read_only, "disk.raw");
  EXPECT_TRUE(dev.has_value());
  return std::move(dev).value();
}

TEST(RawImageTest, ReportsSizeAndInfo) {
  auto dev = OpenSized(10 * kChunk);
  EXPECT_EQ(dev->size(), 10 * kChunk);
  EXPECT_EQ(dev->info().format, "raw");
  EXPECT_EQ(dev->info().filename, "disk.raw");
  EXPECT_EQ(dev->info().preferred_block, 4096u);
  EXPECT_EQ(dev->info().cluster_size, 0u);
}

TEST(RawImageTest, WriteThenReadRoundTrips) {
  auto dev = OpenSized(4 * kChunk);
  std::vector<uint8_t> data(5000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 1);
  ASSERT_TRUE(dev->Write(1234, data).ok());
  std::vector<uint8_t> back(data.size());
  ASSERT_TRUE(dev->Read(1234, back).ok());
  EXPECT_EQ(back, data);
  std::vector<uint8_t> before(1234, 0xff);
  ASSERT_TRUE(dev->Read(0, before).ok());
  EXPECT_EQ(before, std::vector<uint8_t>(1234, 0));
}

TEST(RawImageTest, RequestsPastEndFailWithOutOfRange) {
  auto dev = OpenSized(kChunk);
  std::vector<uint8_t> buf(16);
  EXPECT_EQ(dev->Read(kChunk - 8, buf).code(), Code::kOutOfRange);
  EXPECT_EQ(dev->Write(kChunk - 8, buf).code(), Code::kOutOfRange);
  EXPECT_EQ(dev->WriteZeroes(kChunk, 1).code(), Code::kOutOfRange);
  EXPECT_EQ(dev->Discard(0, kChunk + 1).code(), Code::kOutOfRange);
  EXPECT_EQ(dev->GetStatus(kChunk, 1).status().code(), Code::kOutOfRange);
}

TEST(RawImageTest, ReadOnlyRefusesWrites) {
  auto dev = OpenSized(kChunk, nullptr, /*read_only=*/true);
  std::vector<uint8_t> buf(16, 1);
  EXPECT_EQ(dev->Write(0, buf).code(), Code::kReadOnly);
  EXPECT_EQ(dev->WriteZeroes(0, 16).code(), Code::kReadOnly);
  EXPECT_EQ(dev->Discard(0, 16).code(), Code::kReadOnly);
  EXPECT_EQ(dev->Resize(2 * kChunk).code(), Code::kReadOnly);
  EXPECT_TRUE(dev->Read(0, buf).ok());
  EXPECT_TRUE(dev->info().read_only);
}

TEST(RawImageTest, GetStatusReportsHolesAndData) {
  auto dev = OpenSized(8 * kChunk);
  std::vector<uint8_t> data(kChunk, 0x5a);
  ASSERT_TRUE(dev->Write(2 * kChunk, data).ok());
  ASSERT_TRUE(dev->Write(3 * kChunk, data).ok());

  auto hole = dev->GetStatus(0, 8 * kChunk);
  ASSERT_TRUE(hole.has_value());
  EXPECT_EQ(hole->offset, 0u);
  EXPECT_EQ(hole->length, 2 * kChunk);
  EXPECT_FALSE(hole->data);
  EXPECT_TRUE(hole->zero);
  EXPECT_TRUE(hole->present);
  EXPECT_TRUE(hole->has_host_offset);
  EXPECT_EQ(hole->host_offset, 0u);

  auto ext = dev->GetStatus(2 * kChunk, 8 * kChunk);
  ASSERT_TRUE(ext.has_value());
  EXPECT_EQ(ext->length, 2 * kChunk);
  EXPECT_TRUE(ext->data);
  EXPECT_FALSE(ext->zero);
  EXPECT_TRUE(ext->has_host_offset);
  EXPECT_EQ(ext->host_offset, 2 * kChunk);
  EXPECT_EQ(ext->depth, 0u);

  // max_length clips, and the tail hole ends at the device size.
  auto clipped = dev->GetStatus(2 * kChunk + 10, 100);
  ASSERT_TRUE(clipped.has_value());
  EXPECT_EQ(clipped->length, 100u);
  EXPECT_EQ(clipped->host_offset, 2 * kChunk + 10);
  auto tail = dev->GetStatus(4 * kChunk, ~0ull);
  ASSERT_TRUE(tail.has_value());
  EXPECT_EQ(tail->length, 4 * kChunk);
  EXPECT_FALSE(tail->data);
}

// Counts the seeks (NextData/NextHole) that reach the storage.
class SeekCounter final : public io::ForwardingStorage {
 public:
  SeekCounter(std::unique_ptr<io::Storage> inner, std::atomic<int>* seeks)
      : ForwardingStorage(std::move(inner)), seeks_(seeks) {}
  Result<uint64_t> NextData(uint64_t o) override {
    ++*seeks_;
    return inner().NextData(o);
  }
  Result<uint64_t> NextHole(uint64_t o) override {
    ++*seeks_;
    return inner().NextHole(o);
  }

 private:
  std::atomic<int>* seeks_;
};

TEST(RawImageTest, ReadOnlyImageRemembersDataRunsButNotHoles) {
  // Data in chunks 2-5; a writer other than the read-only device (another
  // process, in life) changes the storage under it.
  auto mem = io::NewMemoryStorage("base.raw");
  io::MemoryStorage* writer = mem.get();
  ASSERT_TRUE(CreateRaw(*mem, 8 * kChunk, RawPrealloc::kOff).ok());
  std::vector<uint8_t> data(4 * kChunk, 0x5a);
  ASSERT_TRUE(writer->WriteAt(2 * kChunk, data).ok());
  std::atomic<int> seeks{0};
  auto opened = OpenRaw(std::make_unique<SeekCounter>(std::move(mem), &seeks), true, "base.raw");
  ASSERT_TRUE(opened.has_value());
  block::Device& dev = **opened;

  // The first lookup in the run seeks; later ones anywhere in it do not,
  // and answer exactly what a seek would (clipped to the request).
  auto first = dev.GetStatus(2 * kChunk + 512, 512);
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(first->data);
  EXPECT_EQ(first->length, 512u);
  const int after_first = seeks.load();
  EXPECT_GT(after_first, 0);
  for (uint64_t off : {2 * kChunk + 512, 3 * kChunk + 4096, 6 * kChunk - 1}) {
    auto e = dev.GetStatus(off, 8 * kChunk);
    ASSERT_TRUE(e.has_value());
    EXPECT_TRUE(e->data);
    EXPECT_EQ(e->offset, off);
    EXPECT_EQ(e->host_offset, off);
    EXPECT_EQ(e->length, 6 * kChunk - off);
  }
  EXPECT_EQ(seeks.load(), after_first);
  // Found from below its first lookup, the run is remembered whole.
  auto below = dev.GetStatus(2 * kChunk, 512);
  ASSERT_TRUE(below.has_value());
  EXPECT_TRUE(below->data);
  const int after_below = seeks.load();
  EXPECT_GT(after_below, after_first);
  for (uint64_t off : {2 * kChunk, 2 * kChunk + 1024, 5 * kChunk}) {
    auto e = dev.GetStatus(off, 512);
    ASSERT_TRUE(e.has_value());
    EXPECT_TRUE(e->data);
    EXPECT_EQ(e->length, 512u);
  }
  EXPECT_EQ(seeks.load(), after_below);

  // A hole is asked afresh every time: once written by the other writer,
  // it is data at once, never a remembered hole hiding the new bytes.
  auto hole = dev.GetStatus(7 * kChunk, kChunk);
  ASSERT_TRUE(hole.has_value());
  EXPECT_FALSE(hole->data);
  ASSERT_TRUE(writer->WriteAt(7 * kChunk, std::vector<uint8_t>(kChunk, 0x33)).ok());
  auto now = dev.GetStatus(7 * kChunk, kChunk);
  ASSERT_TRUE(now.has_value());
  EXPECT_TRUE(now->data);
  std::vector<uint8_t> out(kChunk);
  ASSERT_TRUE(dev.Read(7 * kChunk, out).ok());
  EXPECT_EQ(out, std::vector<uint8_t>(kChunk, 0x33));

  // A punched remembered run still says data (a safe answer) and reads the
  // zeros that are there.
  ASSERT_TRUE(writer->PunchHole(2 * kChunk, kChunk).ok());
  ASSERT_TRUE(dev.Read(2 * kChunk, out).ok());
  EXPECT_EQ(out, std::vector<uint8_t>(kChunk, 0));
}

TEST(RawImageTest, WritableImageSeesItsOwnDiscards) {
  io::MemoryStorage* mem = nullptr;
  auto dev = OpenSized(4 * kChunk, &mem);
  ASSERT_TRUE(dev->Write(0, std::vector<uint8_t>(2 * kChunk, 0x5a)).ok());
  auto before = dev->GetStatus(0, 4 * kChunk);
  ASSERT_TRUE(before.has_value());
  EXPECT_TRUE(before->data);
  ASSERT_TRUE(dev->Discard(0, kChunk).ok());
  auto after = dev->GetStatus(0, 4 * kChunk);
  ASSERT_TRUE(after.has_value());
  EXPECT_FALSE(after->data);
  EXPECT_EQ(after->length, kChunk);
}

TEST(RawImageTest, DiscardAndWriteZeroesReadAsZeros) {
  io::MemoryStorage* mem = nullptr;
  auto dev = OpenSized(4 * kChunk, &mem);
  std::vector<uint8_t> data(4 * kChunk, 0x11);
  ASSERT_TRUE(dev->Write(0, data).ok());
  ASSERT_TRUE(dev->Discard(0, kChunk).ok());
  ASSERT_TRUE(dev->WriteZeroes(kChunk + 100, 200).ok());
  block::ZeroFlags unmap;
  unmap.may_unmap = true;
  ASSERT_TRUE(dev->WriteZeroes(2 * kChunk, kChunk, unmap).ok());

  std::vector<uint8_t> back(4 * kChunk);
  ASSERT_TRUE(dev->Read(0, back).ok());
  for (uint64_t i = 0; i < back.size(); ++i) {
    bool zero = i < kChunk || (i >= kChunk + 100 && i < kChunk + 300) ||
                (i >= 2 * kChunk && i < 3 * kChunk);
    ASSERT_EQ(back[i], zero ? 0 : 0x11) << "offset " << i;
  }
  // The discarded chunk's space went back to the host.
  EXPECT_EQ(mem->ChunkCount(), 2u);
}

TEST(RawImageTest, DiscardWithoutPunchStillZeroes) {
  auto mem = io::NewMemoryStorage("nfs.raw");
  ASSERT_TRUE(mem->Resize(2 * kChunk).ok());
  auto dev = OpenRaw(std::make_unique<NoPunchStorage>(mem.get()), false, "nfs.raw");
  ASSERT_TRUE(dev.has_value());
  std::vector<uint8_t> data(2 * kChunk, 0x77);
  ASSERT_TRUE((*dev)->Write(0, data).ok());
  ASSERT_TRUE((*dev)->Discard(10, kChunk).ok());
  std::vector<uint8_t> back(2 * kChunk);
  ASSERT_TRUE((*dev)->Read(0, back).ok());
  for (uint64_t i = 0; i < back.size(); ++i) {
    ASSERT_EQ(back[i], (i >= 10 && i < kChunk + 10) ? 0 : 0x77) << "offset " << i;
  }
  block::ZeroFlags fast;
  fast.may_unmap = true;
  fast.fast_only = true;
  EXPECT_EQ((*dev)->WriteZeroes(0, kChunk, fast).code(), Code::kNotSupported);
}

TEST(RawImageTest, ResizeGrowsAndShrinksOnlyWhenAsked) {
  auto dev = OpenSized(kChunk);
  EXPECT_TRUE(dev->Resize(3 * kChunk).ok());
  EXPECT_EQ(dev->size(), 3 * kChunk);
  std::vector<uint8_t> buf(kChunk, 0xee);
  EXPECT_TRUE(dev->Read(2 * kChunk, buf).ok());
  EXPECT_EQ(buf, std::vector<uint8_t>(kChunk, 0));
  EXPECT_EQ(dev->Resize(kChunk).code(), Code::kInvalidArgument);
  EXPECT_TRUE(dev->Resize(kChunk, /*shrink=*/true).ok());
  EXPECT_EQ(dev->size(), kChunk);
}

TEST(RawImageTest, CloseFlushesAndRefusesLaterIo) {
  auto dev = OpenSized(kChunk);
  EXPECT_TRUE(dev->Close().ok());
  std::vector<uint8_t> buf(8);
  EXPECT_FALSE(dev->Read(0, buf).ok());
  EXPECT_FALSE(dev->Write(0, buf).ok());
}

TEST(RawImageTest, PlanReadIsTheSameRangeOfTheHostFile) {
  auto storage = io::NewMemoryStorage("plan.raw");
  io::MemoryStorage* mem = storage.get();
  ASSERT_TRUE(storage->WriteAt(0, std::vector<uint8_t>(3 * kChunk, 0x42)).ok());
  auto dev = OpenRaw(std::move(storage), /*read_only=*/true, "plan.raw");
  ASSERT_TRUE(dev.has_value());
  auto plan = (*dev)->PlanRead(kChunk + 10, kChunk);
  ASSERT_TRUE(plan.has_value()) << plan.status().ToString();
  ASSERT_EQ(plan->pieces.size(), 1u);
  EXPECT_EQ(plan->pieces[0].buf_offset, 0u);
  EXPECT_EQ(plan->pieces[0].length, kChunk);
  EXPECT_EQ(plan->pieces[0].storage, mem);
  EXPECT_EQ(plan->pieces[0].host_offset, kChunk + 10);
  EXPECT_EQ((*dev)->PlanRead(2 * kChunk + 1, kChunk).status().code(), Code::kOutOfRange);
  EXPECT_EQ(mem->ReadFd(), -1) << "memory has no descriptor: callers use Read";
}

TEST(RawImageTest, CreatePreallocationModes) {
  auto off = io::NewMemoryStorage();
  ASSERT_TRUE(CreateRaw(*off, 3 * kChunk, RawPrealloc::kOff).ok());
  EXPECT_EQ(off->Size().value(), 3 * kChunk);
  EXPECT_EQ(off->ChunkCount(), 0u);

  auto full = io::NewMemoryStorage();
  ASSERT_TRUE(CreateRaw(*full, 3 * kChunk, RawPrealloc::kFull).ok());
  EXPECT_EQ(full->Size().value(), 3 * kChunk);
  EXPECT_EQ(full->bytes_written(), 3 * kChunk);

  auto mem = io::NewMemoryStorage("nfs.raw");
  NoPunchStorage nfs(mem.get());
  std::string warning;
  ASSERT_TRUE(CreateRaw(nfs, 2 * kChunk, RawPrealloc::kFalloc, &warning).ok());
  EXPECT_NE(warning.find("fallocate"), std::string::npos);
  EXPECT_EQ(mem->bytes_written(), 2 * kChunk);
  EXPECT_EQ(mem->Size().value(), 2 * kChunk);
}

}  // namespace
}  // namespace thindisk::raw
