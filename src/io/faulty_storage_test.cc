#include "io/faulty_storage.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <thread>
#include <vector>

namespace thindisk::io {
namespace {

std::vector<uint8_t> Fill(size_t n, uint8_t v) { return std::vector<uint8_t>(n, v); }

std::unique_ptr<FaultyStorage> Wrap(std::shared_ptr<Storage> base = NewMemoryStorage("disk")) {
  auto r = NewFaultyStorage(std::move(base));
  EXPECT_TRUE(r.has_value());
  return std::move(*r);
}

std::vector<uint8_t> Contents(Storage& s) {
  std::vector<uint8_t> v(*s.Size());
  EXPECT_TRUE(s.ReadAt(0, v).ok());
  return v;
}

TEST(FaultyStorage, FailsNthWriteOnceWithoutWriting) {
  auto f = Wrap();
  EXPECT_EQ(f->name(), "disk");
  f->FailNthWrite(3, EIO);
  EXPECT_TRUE(f->WriteAt(0, Fill(10, 1)).ok());
  EXPECT_TRUE(f->WriteAt(10, Fill(10, 2)).ok());
  const Status s = f->WriteAt(20, Fill(10, 3));
  EXPECT_EQ(s.code(), Code::kIoError);
  EXPECT_EQ(s.error_number(), EIO);
  EXPECT_EQ(*f->Size(), 20u);  // the failed write left nothing behind
  EXPECT_TRUE(f->WriteAt(20, Fill(10, 4)).ok());
  EXPECT_EQ(f->writes(), 3u);
  EXPECT_EQ(f->faults_injected(), 1u);
  EXPECT_EQ(f->bytes_written(), 30u);
}

TEST(FaultyStorage, PersistentWriteFaultKillsAllMutationsUntilCleared) {
  auto f = Wrap();
  f->FailNthWrite(2, ENOSPC, /*persistent=*/true);
  EXPECT_TRUE(f->WriteAt(0, Fill(10, 1)).ok());
  EXPECT_EQ(f->WriteAt(0, Fill(10, 2)).code(), Code::kNoSpace);
  EXPECT_EQ(f->WriteAt(0, Fill(10, 3)).code(), Code::kNoSpace);
  EXPECT_EQ(f->PunchHole(0, 10).code(), Code::kNoSpace);
  EXPECT_EQ(f->Resize(100).code(), Code::kNoSpace);
  EXPECT_EQ(Contents(*f), Fill(10, 1));
  f->ClearFaults();
  EXPECT_TRUE(f->WriteAt(0, Fill(10, 5)).ok());
  EXPECT_EQ(Contents(*f), Fill(10, 5));
}

TEST(FaultyStorage, FailedFlushMakesNothingDurable) {
  auto f = Wrap();
  ASSERT_TRUE(f->WriteAt(0, Fill(100, 1)).ok());
  f->FailNthFlush(1, EIO);
  EXPECT_EQ(f->Flush().code(), Code::kIoError);
  EXPECT_EQ(f->unflushed_ops(), 1u);
  EXPECT_TRUE((*f->SimulatePowerLoss(PowerLossMode::kDropUnflushed, 1))->Contents().empty());
  ASSERT_TRUE(f->Flush().ok());
  EXPECT_EQ(f->unflushed_ops(), 0u);
  EXPECT_EQ((*f->SimulatePowerLoss(PowerLossMode::kDropUnflushed, 1))->Contents(), Fill(100, 1));
  EXPECT_EQ(f->flushes(), 1u);
}

TEST(FaultyStorage, FullDiskAfterBytesUntilSpaceRestored) {
  auto f = Wrap();
  f->FailAfterBytes(10000);
  EXPECT_TRUE(f->WriteAt(0, Fill(4096, 1)).ok());
  EXPECT_TRUE(f->WriteAt(4096, Fill(4096, 2)).ok());
  EXPECT_EQ(f->WriteAt(8192, Fill(4096, 3)).code(), Code::kNoSpace);  // 12288 > 10000
  EXPECT_EQ(f->WriteAt(8192, Fill(100, 3)).code(), Code::kNoSpace);   // still full
  EXPECT_EQ(f->Allocate(0, 1).code(), Code::kNoSpace);
  EXPECT_EQ(*f->Size(), 8192u);
  f->ClearFaults();
  EXPECT_TRUE(f->WriteAt(8192, Fill(4096, 3)).ok());
  EXPECT_EQ(*f->Size(), 12288u);
}

TEST(FaultyStorage, DropUnflushedKeepsExactlyTheFlushedState) {
  auto f = Wrap();
  ASSERT_TRUE(f->WriteAt(0, Fill(200000, 1)).ok());
  ASSERT_TRUE(f->PunchHole(1000, 70000).ok());
  ASSERT_TRUE(f->Flush().ok());
  const auto flushed = Contents(*f);
  // Every kind of mutation after the flush is lost.
  ASSERT_TRUE(f->WriteAt(500, Fill(1000, 2)).ok());
  ASSERT_TRUE(f->WriteAt(300000, Fill(10, 3)).ok());
  ASSERT_TRUE(f->PunchHole(100000, 50000).ok());
  ASSERT_TRUE(f->ZeroRange(150000, 10000).ok());
  ASSERT_TRUE(f->Resize(180000).ok());
  EXPECT_EQ(f->unflushed_ops(), 5u);
  auto crashed = *f->SimulatePowerLoss(PowerLossMode::kDropUnflushed, 7);
  EXPECT_EQ(crashed->Contents(), flushed);
  EXPECT_EQ(crashed->name(), "disk");
  // The wrapper still shows the live state.
  EXPECT_EQ(*f->Size(), 180000u);
}

TEST(FaultyStorage, PunchZeroResizeBecomeDurableOnFlush) {
  auto f = Wrap();
  ASSERT_TRUE(f->WriteAt(0, Fill(300000, 9)).ok());
  ASSERT_TRUE(f->Flush().ok());
  ASSERT_TRUE(f->PunchHole(0, 100000).ok());
  ASSERT_TRUE(f->ZeroRange(250000, 100000).ok());  // extends to 350000
  ASSERT_TRUE(f->Resize(340000).ok());
  ASSERT_TRUE(f->Flush().ok());
  const auto live = Contents(*f);
  auto crashed = *f->SimulatePowerLoss(PowerLossMode::kDropUnflushed, 0);
  EXPECT_EQ(crashed->Contents(), live);
  EXPECT_EQ(*crashed->Size(), 340000u);
}

TEST(FaultyStorage, WrapCopiesExistingContentAsDurable) {
  auto base = std::shared_ptr<MemoryStorage>(NewMemoryStorage("b"));
  ASSERT_TRUE(base->Resize(1 << 20).ok());
  ASSERT_TRUE(base->WriteAt(300000, Fill(5000, 4)).ok());
  auto f = Wrap(base);
  ASSERT_TRUE(f->WriteAt(0, Fill(10, 1)).ok());
  auto crashed = *f->SimulatePowerLoss(PowerLossMode::kDropUnflushed, 0);
  auto want = Fill(1 << 20, 0);
  std::fill(want.begin() + 300000, want.begin() + 305000, 4);
  EXPECT_EQ(crashed->Contents(), want);
  EXPECT_NE(base->Contents(), want);  // the base took the unflushed write
}

// N disjoint unflushed writes over a flushed background: each region is
// either all new or all old after a random-subset crash.
TEST(FaultyStorage, KeepRandomSubsetIsAllOrNothingPerWriteAndSeeded) {
  constexpr int kWrites = 16;
  constexpr size_t kLen = 3000;
  auto f = Wrap();
  ASSERT_TRUE(f->WriteAt(0, Fill(kWrites * 4096, 0xAA)).ok());
  ASSERT_TRUE(f->Flush().ok());
  for (int i = 0; i < kWrites; ++i) {
    ASSERT_TRUE(f->WriteAt(i * 4096 + 100, Fill(kLen, static_cast<uint8_t>(i + 1))).ok());
  }
  std::set<std::vector<bool>> patterns;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    auto c = (*f->SimulatePowerLoss(PowerLossMode::kKeepRandomSubset, seed))->Contents();
    ASSERT_EQ(c.size(), size_t{kWrites} * 4096);
    std::vector<bool> kept;
    for (int i = 0; i < kWrites; ++i) {
      const auto region = std::vector<uint8_t>(c.begin() + i * 4096 + 100, c.begin() + i * 4096 + 100 + kLen);
      const bool is_new = region == Fill(kLen, static_cast<uint8_t>(i + 1));
      EXPECT_TRUE(is_new || region == Fill(kLen, 0xAA)) << "seed " << seed << " write " << i;
      kept.push_back(is_new);
    }
    patterns.insert(kept);
    // Same seed, same outcome.
    EXPECT_EQ((*f->SimulatePowerLoss(PowerLossMode::kKeepRandomSubset, seed))->Contents(), c);
  }
  EXPECT_GT(patterns.size(), 1u);  // seeds choose different subsets
  for (const auto& p : patterns) {
    EXPECT_NE(std::count(p.begin(), p.end(), true), 0);
    EXPECT_NE(std::count(p.begin(), p.end(), false), 0);
  }
}

TEST(FaultyStorage, KeepRandomSubsetPreservesOrderOfOverlappingWrites) {
  auto f = Wrap();
  ASSERT_TRUE(f->WriteAt(0, Fill(100, 1)).ok());
  ASSERT_TRUE(f->WriteAt(0, Fill(100, 2)).ok());
  for (uint64_t seed = 0; seed < 16; ++seed) {
    auto c = (*f->SimulatePowerLoss(PowerLossMode::kKeepRandomSubset, seed))->Contents();
    // Possible: nothing, only 1, only 2, 1 then 2 (=2). Never "2 then 1".
    EXPECT_TRUE(c.empty() || c == Fill(100, 1) || c == Fill(100, 2)) << seed;
  }
}

TEST(FaultyStorage, TearOneKeepsAllButOneWhichIsCutAtA512Boundary) {
  constexpr int kWrites = 6;
  constexpr uint64_t kStride = 8192;
  constexpr size_t kLen = 4000;  // unaligned start and end below
  auto f = Wrap();
  ASSERT_TRUE(f->Resize(kWrites * kStride).ok());
  ASSERT_TRUE(f->Flush().ok());
  for (int i = 0; i < kWrites; ++i) {
    ASSERT_TRUE(f->WriteAt(i * kStride + 300, Fill(kLen, static_cast<uint8_t>(i + 1))).ok());
  }
  int tears_seen = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    auto c = (*f->SimulatePowerLoss(PowerLossMode::kTearOne, seed))->Contents();
    ASSERT_EQ(c.size(), kWrites * kStride);
    int torn = 0;
    for (int i = 0; i < kWrites; ++i) {
      const uint64_t start = i * kStride + 300;
      size_t kept = 0;
      while (kept < kLen && c[start + kept] == i + 1) ++kept;
      for (size_t j = kept; j < kLen; ++j) ASSERT_EQ(c[start + j], 0) << "seed " << seed;
      if (kept == kLen) continue;
      ++torn;
      // The kept prefix ends on an absolute 512-byte boundary (or is empty).
      EXPECT_TRUE(kept == 0 || (start + kept) % FaultyStorage::kTearGrain == 0)
          << "seed " << seed << " kept " << kept;
    }
    EXPECT_LE(torn, 1) << "seed " << seed;
    tears_seen += torn;
  }
  EXPECT_GT(tears_seen, 10);  // nearly every seed cuts something
}

TEST(FaultyStorage, TearOneWithoutWritesKeepsEverything) {
  auto f = Wrap();
  ASSERT_TRUE(f->WriteAt(0, Fill(1000, 1)).ok());
  ASSERT_TRUE(f->Flush().ok());
  ASSERT_TRUE(f->PunchHole(0, 500).ok());
  auto c = (*f->SimulatePowerLoss(PowerLossMode::kTearOne, 3))->Contents();
  EXPECT_EQ(c, Contents(*f));
}

TEST(FaultyStorage, ConcurrentWritersAndFlushers) {
  auto f = Wrap();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        EXPECT_TRUE(f->WriteAt((i * 4 + t) * 512, Fill(512, static_cast<uint8_t>(t + 1))).ok());
        if (i % 10 == 0) {
          EXPECT_TRUE(f->Flush().ok());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(f->Flush().ok());
  EXPECT_EQ(f->writes(), 400u);
  EXPECT_EQ((*f->SimulatePowerLoss(PowerLossMode::kDropUnflushed, 0))->Contents(), Contents(*f));
}

TEST(FaultyStorage, FailsTheWriteAfterTheNthEventOnce) {
  auto f = Wrap();
  FaultyStorage::EventFault fault;
  fault.event = Event::kL2Update;
  fault.nth = 2;
  f->FailAtEvent(fault);
  f->Announce(Event::kL2Update);
  EXPECT_TRUE(f->WriteAt(0, Fill(10, 1)).ok());
  f->Announce(Event::kDataWrite);  // other steps do not count
  EXPECT_TRUE(f->WriteAt(0, Fill(10, 1)).ok());
  EXPECT_FALSE(f->event_fault_fired());
  f->Announce(Event::kL2Update);
  const Status s = f->WriteAt(10, Fill(10, 2));
  EXPECT_EQ(s.error_number(), EIO);
  EXPECT_TRUE(f->event_fault_fired());
  EXPECT_EQ(*f->Size(), 10u);
  EXPECT_TRUE(f->WriteAt(10, Fill(10, 3)).ok());  // once only
  EXPECT_EQ(f->event_count(Event::kL2Update), 2u);
  EXPECT_EQ(f->event_count(Event::kDataWrite), 1u);
  EXPECT_EQ(f->event_count(Event::kL1Update), 0u);
}

TEST(FaultyStorage, PersistentEventFaultFailsEveryLaterMutation) {
  auto f = Wrap();
  FaultyStorage::EventFault fault;
  fault.event = Event::kRefblockUpdate;
  fault.error = ENOSPC;
  fault.persistent = true;
  f->FailAtEvent(fault);
  f->Announce(Event::kRefblockUpdate);
  EXPECT_EQ(f->WriteAt(0, Fill(10, 1)).error_number(), ENOSPC);
  EXPECT_EQ(f->WriteAt(0, Fill(10, 1)).error_number(), ENOSPC);
  EXPECT_EQ(f->PunchHole(0, 10).error_number(), ENOSPC);
  EXPECT_EQ(f->ZeroRange(0, 10).error_number(), ENOSPC);
  EXPECT_EQ(f->Resize(100).error_number(), ENOSPC);
  EXPECT_TRUE(f->Flush().ok());  // a full disk still syncs
  f->ClearFaults();
  EXPECT_TRUE(f->WriteAt(0, Fill(10, 1)).ok());
}

TEST(FaultyStorage, FreezeAtEventIsAPowerCutThere) {
  auto f = Wrap();
  EXPECT_TRUE(f->WriteAt(0, Fill(512, 1)).ok());
  EXPECT_TRUE(f->Flush().ok());
  EXPECT_TRUE(f->WriteAt(512, Fill(512, 2)).ok());  // unflushed, before the cut
  FaultyStorage::EventFault fault;
  fault.event = Event::kHeaderUpdate;
  fault.freeze = true;
  f->FailAtEvent(fault);
  f->Announce(Event::kHeaderUpdate);
  EXPECT_TRUE(f->event_fault_fired());  // fired at the step itself
  EXPECT_FALSE(f->WriteAt(1024, Fill(512, 3)).ok());
  EXPECT_FALSE(f->Flush().ok());  // nothing more becomes durable
  auto kept = f->SimulatePowerLoss(PowerLossMode::kTearOne, 1);
  ASSERT_TRUE(kept.has_value());
  EXPECT_LE(*(*kept)->Size(), 1024u);  // the write after the cut never happened
  auto dropped = f->SimulatePowerLoss(PowerLossMode::kDropUnflushed, 1);
  ASSERT_TRUE(dropped.has_value());
  EXPECT_EQ(Contents(**dropped), Fill(512, 1));
}

TEST(FaultyStorage, FreezeAfterTheStepsWriteKeepsItUnflushed) {
  auto f = Wrap();
  FaultyStorage::EventFault fault;
  fault.event = Event::kL1Update;
  fault.freeze = true;
  fault.freeze_after_next = true;
  f->FailAtEvent(fault);
  f->Announce(Event::kL1Update);
  EXPECT_FALSE(f->event_fault_fired());
  EXPECT_TRUE(f->WriteAt(0, Fill(1024, 7)).ok());  // the step's own write
  EXPECT_TRUE(f->event_fault_fired());
  EXPECT_FALSE(f->WriteAt(1024, Fill(10, 8)).ok());
  EXPECT_FALSE(f->Flush().ok());
  EXPECT_EQ(f->unflushed_ops(), 1u);
  auto all = f->SimulatePowerLoss(PowerLossMode::kKeepRandomSubset, 3);
  ASSERT_TRUE(all.has_value());
  EXPECT_LE(*(*all)->Size(), 1024u);
  auto torn = f->SimulatePowerLoss(PowerLossMode::kTearLast, 5);
  ASSERT_TRUE(torn.has_value());
  auto bytes = Contents(**torn);
  EXPECT_EQ(bytes.size() % 512, 0u);  // a prefix of whole sectors, never all of it
  EXPECT_LT(bytes.size(), 1024u);
}

TEST(FaultyStorage, EventNamesAreDistinct) {
  std::set<std::string> names;
  for (int e = 0; e < kEventCount; ++e) names.insert(EventName(Event(e)));
  EXPECT_EQ(names.size(), size_t(kEventCount));
  EXPECT_STREQ(EventName(Event::kL2Update), "l2_update");
}

}  // namespace
}  // namespace thindisk::io
