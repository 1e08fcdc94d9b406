// io::RadosStorage against a real one-node cluster (the ctest fixture), with
// the `rados` CLI as the judge of what is in the pool.
#include "io/rados_storage.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "io/rados_test_util.h"

namespace thindisk::io {
namespace {

using rados_test::AllZero;
using rados_test::ObjectBytes;
using rados_test::ObjectSize;
using rados_test::ObjectsWithPrefix;
using rados_test::Pattern;
using rados_test::PutObject;
using rados_test::Rados;
using rados_test::UniqueImage;
using rados_test::Uri;

constexpr uint64_t kObj = 64 * 1024;  // small objects: boundaries are cheap to cross

class RadosStorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TD_REQUIRE_CEPH();
    image_ = UniqueImage();
    uri_ = Uri(image_);
  }
  void TearDown() override {
    if (rados_test::ClusterAnswersAfterFailure() && !image_.empty())
      (void)RemoveRados(uri_);
  }

  std::unique_ptr<Storage> Create(uint64_t size, uint64_t object_size = kObj) {
    Status s = CreateRados(uri_, size, object_size);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return Open();
  }
  std::unique_ptr<Storage> Open(bool read_only = false,
                                CacheMode cache = CacheMode::kWriteback) {
    OpenOptions o;
    o.read_only = read_only;
    o.cache = cache;
    auto st = OpenRados(uri_, o);
    EXPECT_TRUE(st) << st.status().ToString();
    return st ? std::move(*st) : nullptr;
  }
  std::string Obj(uint64_t index) const {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(index));
    return image_ + "." + hex;
  }
  std::vector<std::string> DataObjects() const {
    std::vector<std::string> all = ObjectsWithPrefix(image_ + ".");
    std::erase(all, image_ + ".header");
    return all;
  }
  static std::vector<uint8_t> Read(Storage& s, uint64_t offset, size_t n) {
    std::vector<uint8_t> v(n, 0xcc);
    Status st = s.ReadAt(offset, v);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return v;
  }

  std::string image_, uri_;
};

TEST_F(RadosStorageTest, RoundTripAcrossObjectBoundaries) {
  auto s = Create(0);
  ASSERT_TRUE(s);
  // 200 KiB from 60 KiB: the tail of object 0, objects 1 to 3 whole, the
  // head of object 4 -- five objects in one call.
  const uint64_t off = 60 * 1024;
  const std::vector<uint8_t> data = Pattern(1, 200 * 1024);
  ASSERT_TRUE(s->WriteAt(off, data).ok());
  EXPECT_EQ(*s->Size(), off + data.size());
  EXPECT_EQ(s->bytes_written(), data.size());
  EXPECT_EQ(Read(*s, off, data.size()), data);
  // Unaligned reads inside and around it.
  EXPECT_EQ(Read(*s, off + 3, 100000),
            std::vector<uint8_t>(data.begin() + 3, data.begin() + 100003));
  std::vector<uint8_t> head = Read(*s, 0, off + 10);
  EXPECT_TRUE(AllZero(std::vector<uint8_t>(head.begin(), head.begin() + off)));
  EXPECT_EQ(std::vector<uint8_t>(head.begin() + off, head.end()),
            std::vector<uint8_t>(data.begin(), data.begin() + 10));

  // What the pool holds once flushed (the write was held: it is under
  // kMaxHeldWrite), by the rados CLI: objects 0..4, each with the bytes of
  // its share (object 0 is 60 KiB of zeros then data: RADOS fills the gap).
  ASSERT_TRUE(s->Flush().ok());
  EXPECT_EQ(DataObjects(),
            (std::vector<std::string>{Obj(0), Obj(1), Obj(2), Obj(3), Obj(4)}));
  EXPECT_EQ(ObjectSize(Obj(0)), int64_t(kObj));
  EXPECT_EQ(ObjectSize(Obj(4)), int64_t(off + data.size() - 4 * kObj));
  EXPECT_EQ(ObjectBytes(Obj(0)).size(), kObj);
  const std::vector<uint8_t> obj1 = ObjectBytes(Obj(1));
  EXPECT_EQ(obj1, std::vector<uint8_t>(data.begin() + (kObj - off),
                                       data.begin() + (2 * kObj - off)));
}

TEST_F(RadosStorageTest, UnwrittenRangesReadZeros) {
  auto s = Create(1ull << 40);  // 1 TiB: only the header object exists
  ASSERT_TRUE(s);
  EXPECT_EQ(*s->Size(), 1ull << 40);
  EXPECT_TRUE(DataObjects().empty());
  EXPECT_EQ(ObjectSize(image_ + ".header"), int64_t(RadosHeader::kEncodedSize));
  EXPECT_TRUE(AllZero(Read(*s, 0, 300000)));
  EXPECT_TRUE(AllZero(Read(*s, (1ull << 40) - 5000, 5000)));
  // Past the end: zeros too (storage.h), and no error.
  EXPECT_TRUE(AllZero(Read(*s, (1ull << 40) - 100, 5000)));
  EXPECT_TRUE(AllZero(Read(*s, 1ull << 41, 100)));
  // A short object reads zeros past its end.
  ASSERT_TRUE(s->WriteAt(kObj * 5, Pattern(2, 100)).ok());
  std::vector<uint8_t> v = Read(*s, kObj * 5, kObj);
  EXPECT_EQ(std::vector<uint8_t>(v.begin(), v.begin() + 100), Pattern(2, 100));
  EXPECT_TRUE(AllZero(std::vector<uint8_t>(v.begin() + 100, v.end())));
  ASSERT_TRUE(s->Flush().ok());
  EXPECT_EQ(DataObjects(), std::vector<std::string>{Obj(5)});
  EXPECT_EQ(ObjectSize(Obj(5)), 100);
}

TEST_F(RadosStorageTest, ConcurrentWritersOnDifferentObjects) {
  auto s = Create(0);
  ASSERT_TRUE(s);
  constexpr int kThreads = 8, kWritesEach = 16;
  constexpr size_t kChunk = kObj / 4;
  // Thread t owns objects 2t and 2t+1 and fills them in 16 KiB writes, in an
  // order that crosses between its two objects; reads run alongside.
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int w = 0; w < kWritesEach / 2; ++w) {
        for (int half = 0; half < 2; ++half) {
          const uint64_t off = (2 * t + half) * kObj + w % 4 * kChunk;
          const std::vector<uint8_t> d = Pattern(100 + t * 64 + half * 8 + w, kChunk);
          if (!s->WriteAt(off, d).ok()) ++failures;
          std::vector<uint8_t> back(kChunk);
          if (!s->ReadAt(off, back).ok() || back != d) ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(*s->Size(), 2 * kThreads * kObj);
  // Last writer of each chunk is w = 4..7 (w % 4 repeats): check those.
  for (int t = 0; t < kThreads; ++t) {
    for (int half = 0; half < 2; ++half) {
      for (int w = 4; w < 8; ++w) {
        const uint64_t off = (2 * t + half) * kObj + w % 4 * kChunk;
        EXPECT_EQ(Read(*s, off, kChunk), Pattern(100 + t * 64 + half * 8 + w, kChunk))
            << "thread " << t << " object " << 2 * t + half << " chunk " << w % 4;
      }
    }
  }
  ASSERT_TRUE(s->Flush().ok());
  EXPECT_EQ(DataObjects().size(), size_t(2 * kThreads));
}

TEST_F(RadosStorageTest, PunchRemovesWholeObjectsAndZeroesPartOnes) {
  auto s = Create(0);
  ASSERT_TRUE(s);
  const std::vector<uint8_t> data = Pattern(3, 4 * kObj);
  ASSERT_TRUE(s->WriteAt(0, data).ok());
  ASSERT_TRUE(s->Flush().ok());
  ASSERT_EQ(DataObjects().size(), 4u);
  // [1000, 3 KiB) inside object 0: zeroed in place.
  ASSERT_TRUE(s->PunchHole(1000, 2072).ok());
  // From 1000 bytes into object 1 to the end of object 2: object 1 cut to
  // 1000 bytes, object 2 removed.
  ASSERT_TRUE(s->PunchHole(kObj + 1000, 2 * kObj - 1000).ok());
  // Never-written objects: punching them creates nothing.
  ASSERT_TRUE(s->PunchHole(10 * kObj + 5, 3 * kObj).ok());
  EXPECT_EQ(*s->Size(), 4 * kObj);  // punching never changes the size

  EXPECT_EQ(DataObjects(), (std::vector<std::string>{Obj(0), Obj(1), Obj(3)}));
  EXPECT_EQ(ObjectSize(Obj(1)), 1000);
  std::vector<uint8_t> want0(data.begin(), data.begin() + kObj);
  std::fill(want0.begin() + 1000, want0.begin() + 3072, 0);
  EXPECT_EQ(ObjectBytes(Obj(0)), want0);
  EXPECT_EQ(ObjectBytes(Obj(1)),
            std::vector<uint8_t>(data.begin() + kObj, data.begin() + kObj + 1000));

  std::vector<uint8_t> want = data;
  std::fill(want.begin() + 1000, want.begin() + 3072, 0);
  std::fill(want.begin() + kObj + 1000, want.begin() + 3 * kObj, 0);
  EXPECT_EQ(Read(*s, 0, 4 * kObj), want);

  // A short object: zeroing past its end leaves it as long as it was;
  // zeroing over its end cuts it back.
  ASSERT_TRUE(s->WriteAt(8 * kObj, Pattern(13, 100)).ok());
  ASSERT_TRUE(s->Flush().ok());
  ASSERT_TRUE(s->PunchHole(8 * kObj + 200, 300).ok());
  EXPECT_EQ(ObjectSize(Obj(8)), 100);
  ASSERT_TRUE(s->PunchHole(8 * kObj + 50, kObj - 50).ok());
  EXPECT_EQ(ObjectSize(Obj(8)), 50);
  EXPECT_EQ(ObjectBytes(Obj(8)), Pattern(13, 50));
}

TEST_F(RadosStorageTest, ZeroRangeCountsAndExtends) {
  auto s = Create(0);
  ASSERT_TRUE(s);
  const std::vector<uint8_t> data = Pattern(4, 2 * kObj);
  ASSERT_TRUE(s->WriteAt(0, data).ok());
  ASSERT_TRUE(s->Flush().ok());
  ASSERT_TRUE(s->ZeroRange(kObj, kObj).ok());            // object 1 whole: removed
  ASSERT_TRUE(s->ZeroRange(2 * kObj - 10, 30000).ok());  // past the end: extends
  EXPECT_EQ(*s->Size(), 2 * kObj - 10 + 30000);
  EXPECT_EQ(s->bytes_written(), 2 * kObj + kObj + 30000);  // writes and zeroes count
  EXPECT_EQ(DataObjects(), std::vector<std::string>{Obj(0)});
  EXPECT_TRUE(AllZero(Read(*s, kObj, kObj + 20000)));
  EXPECT_EQ(Read(*s, 0, kObj), std::vector<uint8_t>(data.begin(), data.begin() + kObj));
}

TEST_F(RadosStorageTest, ResizeShrinkRemovesAndTruncates) {
  auto s = Create(0);
  ASSERT_TRUE(s);
  const std::vector<uint8_t> data = Pattern(5, 3 * kObj);
  ASSERT_TRUE(s->WriteAt(0, data).ok());
  ASSERT_TRUE(s->Flush().ok());
  const uint64_t new_size = kObj + kObj / 2;
  ASSERT_TRUE(s->Resize(new_size).ok());
  EXPECT_EQ(*s->Size(), new_size);
  EXPECT_EQ(DataObjects(), (std::vector<std::string>{Obj(0), Obj(1)}));
  EXPECT_EQ(ObjectSize(Obj(1)), int64_t(kObj / 2));
  // The size is in the header at once: a second open sees it.
  auto other = Open(/*read_only=*/true);
  ASSERT_TRUE(other);
  EXPECT_EQ(*other->Size(), new_size);
  // Growing again shows zeros where the cut data was.
  ASSERT_TRUE(s->Resize(3 * kObj).ok());
  std::vector<uint8_t> want(data.begin(), data.begin() + new_size);
  want.resize(3 * kObj, 0);
  EXPECT_EQ(Read(*s, 0, 3 * kObj), want);
  EXPECT_EQ(DataObjects().size(), 2u);
}

TEST_F(RadosStorageTest, SizeIsDurableAfterFlush) {
  auto s = Create(4096);
  ASSERT_TRUE(s);
  // The first write past the data limit (0 for a new image) raises the
  // limit in the header, with the size of that moment.
  ASSERT_TRUE(s->WriteAt(kObj, Pattern(6, 100)).ok());
  // A second one inside the limit only raises the size in memory.
  ASSERT_TRUE(s->WriteAt(10 * kObj, Pattern(6, 5000)).ok());
  const uint64_t grown = 10 * kObj + 5000;
  EXPECT_EQ(*s->Size(), grown);
  {
    // Another open reads the header: the new size is not there before Flush.
    auto before = Open(true);
    ASSERT_TRUE(before);
    EXPECT_EQ(*before->Size(), kObj + 100);
  }
  ASSERT_TRUE(s->Flush().ok());
  {
    auto after = Open(true);
    ASSERT_TRUE(after);
    EXPECT_EQ(*after->Size(), grown);
    EXPECT_EQ(Read(*after, 10 * kObj, 5000), Pattern(6, 5000));
  }
  s.reset();
  auto reopened = Open();
  ASSERT_TRUE(reopened);
  EXPECT_EQ(*reopened->Size(), grown);
}

// A crash after writes past the durable size, before Flush: the data landed,
// the size did not. The next read-write open must clear it, so growing the
// image never shows it (DESIGN.md P2). The crashed state is made by hand
// with the rados CLI: a header whose data limit is above its size, and a
// stale object past the size.
TEST_F(RadosStorageTest, OpenClearsWhatACrashLeftPastTheSize) {
  RadosHeader h;
  h.object_order = 16;
  h.size = kObj + 100;
  h.data_limit = 64 * kObj;
  PutObject(image_ + ".header", h.Encode());
  PutObject(Obj(1), Pattern(7, kObj));   // 100 bytes inside the size, the rest stale
  PutObject(Obj(20), Pattern(8, 4096));  // wholly stale
  auto s = Open();
  ASSERT_TRUE(s);
  EXPECT_EQ(DataObjects(), std::vector<std::string>{Obj(1)});
  EXPECT_EQ(ObjectSize(Obj(1)), 100);
  ASSERT_TRUE(s->Resize(64 * kObj).ok());
  std::vector<uint8_t> v = Read(*s, kObj, 63 * kObj);
  EXPECT_EQ(std::vector<uint8_t>(v.begin(), v.begin() + 100), Pattern(7, 100));
  EXPECT_TRUE(AllZero(std::vector<uint8_t>(v.begin() + 100, v.end())));
}

TEST_F(RadosStorageTest, RemoveDeletesEveryObject) {
  auto s = Create(0);
  ASSERT_TRUE(s);
  for (uint64_t i : {0, 3, 7})
    ASSERT_TRUE(s->WriteAt(i * kObj + 10, Pattern(i, 100)).ok());
  s.reset();
  ASSERT_EQ(ObjectsWithPrefix(image_ + ".").size(), 4u);
  ASSERT_TRUE(RemoveRados(uri_).ok());
  EXPECT_TRUE(ObjectsWithPrefix(image_ + ".").empty());
  Status again = RemoveRados(uri_);
  EXPECT_EQ(again.code(), Code::kNotFound) << again.ToString();
  image_.clear();
}

// Data spread over more indexes than RemoveRados tries one by one: it lists
// the pool instead, and removes only this image's objects.
TEST_F(RadosStorageTest, RemoveByListingWhenTheDataIsSpreadWide) {
  auto s = Create(0, 4096);
  ASSERT_TRUE(s);
  const uint64_t far = (RadosStorage::kMaxIndexRemove + 100) * 4096;
  ASSERT_TRUE(s->WriteAt(far, Pattern(9, 10)).ok());
  ASSERT_TRUE(s->WriteAt(0, Pattern(10, 10)).ok());
  s.reset();
  const std::string other = UniqueImage("other");
  ASSERT_TRUE(CreateRados(Uri(other), 4096).ok());
  ASSERT_EQ(ObjectsWithPrefix(image_ + ".").size(), 3u);
  ASSERT_TRUE(RemoveRados(uri_).ok());
  EXPECT_TRUE(ObjectsWithPrefix(image_ + ".").empty());
  EXPECT_EQ(ObjectsWithPrefix(other + "."), std::vector<std::string>{other + ".header"});
  EXPECT_TRUE(RemoveRados(Uri(other)).ok());
  image_.clear();
}

TEST_F(RadosStorageTest, DataAndHolesFollowObjects) {
  auto s = Create(10 * kObj);
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->WriteAt(2 * kObj, Pattern(11, kObj)).ok());  // object 2 whole
  ASSERT_TRUE(s->WriteAt(5 * kObj, Pattern(12, 1000)).ok());  // object 5: 1000 bytes
  EXPECT_EQ(*s->NextData(0), 2 * kObj);
  EXPECT_EQ(*s->NextHole(2 * kObj), 3 * kObj);
  EXPECT_EQ(*s->NextData(3 * kObj), 5 * kObj);
  EXPECT_EQ(*s->NextHole(5 * kObj), 5 * kObj + 1000);
  EXPECT_EQ(*s->NextData(5 * kObj + 1000), 10 * kObj);  // none: Size()
  EXPECT_EQ(*s->NextHole(0), 0u);
  EXPECT_EQ(*s->AllocatedBytes(), kObj + 1000);
}

TEST_F(RadosStorageTest, AllocateIsNotSupported) {
  auto s = Create(kObj);
  ASSERT_TRUE(s);
  Status st = s->Allocate(0, kObj);
  EXPECT_EQ(st.code(), Code::kNotSupported);
  EXPECT_NE(st.message().find(uri_ + ": RADOS cannot reserve space"), std::string::npos)
      << st.message();
  EXPECT_TRUE(DataObjects().empty());
}

TEST_F(RadosStorageTest, ReadOnlyRefusesWrites) {
  ASSERT_TRUE(Create(kObj));
  auto ro = Open(true);
  ASSERT_TRUE(ro);
  for (Status st : {ro->WriteAt(0, Pattern(1, 10)), ro->Resize(0), ro->PunchHole(0, 10),
                    ro->ZeroRange(0, 10)}) {
    EXPECT_EQ(st.code(), Code::kReadOnly) << st.ToString();
    EXPECT_NE(st.message().find(uri_), std::string::npos);
  }
  EXPECT_TRUE(ro->Flush().ok());
  EXPECT_TRUE(DataObjects().empty());
}

TEST_F(RadosStorageTest, ClearErrors) {
  // Missing pool.
  auto s = OpenRados("rados://no-such-pool-td/x", {});
  ASSERT_FALSE(s);
  EXPECT_EQ(s.status().code(), Code::kNotFound);
  EXPECT_NE(s.status().message().find(
                "rados://no-such-pool-td/x: pool 'no-such-pool-td' does not exist"),
            std::string::npos)
      << s.status().message();
  // Missing image.
  s = OpenRados(uri_, {});
  ASSERT_FALSE(s);
  EXPECT_EQ(s.status().code(), Code::kNotFound);
  EXPECT_NE(s.status().message().find(uri_ + ": no such image"), std::string::npos)
      << s.status().message();
  EXPECT_EQ(RemoveRados(uri_).code(), Code::kNotFound);
  // Bad name: nothing is contacted.
  s = OpenRados("rados://pool", {});
  ASSERT_FALSE(s);
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
  EXPECT_NE(s.status().message().find("no image name"), std::string::npos);
  // Bad object size.
  Status c = CreateRados(uri_, 0, 3000);
  EXPECT_EQ(c.code(), Code::kInvalidArgument) << c.ToString();
  // Exists already.
  ASSERT_TRUE(CreateRados(uri_, 0).ok());
  c = CreateRados(uri_, 0);
  EXPECT_EQ(c.code(), Code::kBusy);
  EXPECT_NE(c.message().find(uri_ + ": image already exists"), std::string::npos)
      << c.message();
  // A conf file that is not there.
  s = OpenRados(uri_ + "?conf=/nonexistent/ceph.conf", {});
  ASSERT_FALSE(s);
  EXPECT_NE(s.status().message().find("/nonexistent/ceph.conf"), std::string::npos)
      << s.status().message();
}

// No monitor answers: one clear error after a bounded wait (here the conf's
// own 2 s, which RadosCluster keeps), not librados' 300 s default.
TEST_F(RadosStorageTest, NoClusterReachable) {
  char tmpl[] = "/tmp/td_rados_dead_XXXXXX";
  const int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  const std::string conf =
      "[global]\nmon host = 127.0.0.1:1\nauth client required = none\n"
      "client mount timeout = 2\n";
  ASSERT_EQ(write(fd, conf.data(), conf.size()), ssize_t(conf.size()));
  close(fd);
  const auto t0 = std::chrono::steady_clock::now();
  auto s = OpenRados(uri_ + "?conf=" + tmpl, {});
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  unlink(tmpl);
  ASSERT_FALSE(s);
  EXPECT_NE(s.status().message().find(uri_ + ": connect to the cluster of " + tmpl),
            std::string::npos)
      << s.status().message();
  EXPECT_NE(s.status().message().find("client_mount_timeout, 2 s"), std::string::npos)
      << s.status().message();
  EXPECT_LT(waited, 30.0);
}

TEST_F(RadosStorageTest, NotAThindiskImage) {
  // Something else's object under the header's name: refused, left alone.
  PutObject(image_ + ".header", std::vector<uint8_t>(64, 'x'));
  auto s = OpenRados(uri_, {});
  ASSERT_FALSE(s);
  EXPECT_EQ(s.status().code(), Code::kCorrupt);
  EXPECT_NE(s.status().message().find(uri_ + ": not a thindisk image"), std::string::npos)
      << s.status().message();
  EXPECT_EQ(RemoveRados(uri_).code(), Code::kCorrupt);
  EXPECT_EQ(ObjectBytes(image_ + ".header"), std::vector<uint8_t>(64, 'x'));
  // A newer version's header: refused as such.
  std::vector<uint8_t> newer = RadosHeader{}.Encode();
  newer[11] = 2;
  PutObject(image_ + ".header", newer);
  s = OpenRados(uri_, {});
  ASSERT_FALSE(s);
  EXPECT_EQ(s.status().code(), Code::kNotSupported);
  EXPECT_NE(s.status().message().find("newer thindisk"), std::string::npos);
  EXPECT_TRUE(Rados("rm " + image_ + ".header").exit_code == 0);
  image_.clear();
}

TEST_F(RadosStorageTest, OpenWithCreate) {
  OpenOptions o;
  o.create = true;
  auto s = OpenRados(uri_, o);
  ASSERT_TRUE(s) << s.status().ToString();
  EXPECT_EQ(*(*s)->Size(), 0u);
  o.exclusive = true;
  auto again = OpenRados(uri_, o);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.status().code(), Code::kBusy);
}

// Write-back (rados_storage.h): small writes are held, read back at once,
// and reach the objects at Flush, each object's runs in one operation.
TEST_F(RadosStorageTest, HeldWritesReachTheObjectsAtFlush) {
  auto s = Create(0);
  ASSERT_TRUE(s);
  std::vector<uint8_t> model(2 * kObj, 0);
  // 64 writes of 512 bytes, 1 KiB apart, over two objects, and one over
  // the boundary between them.
  for (uint64_t i = 0; i < 64; ++i) {
    const std::vector<uint8_t> d = Pattern(int(i) + 20, 512);
    ASSERT_TRUE(s->WriteAt(i * 2048, d).ok());
    std::copy(d.begin(), d.end(), model.begin() + std::ptrdiff_t(i * 2048));
  }
  const std::vector<uint8_t> edge = Pattern(90, 3000);
  ASSERT_TRUE(s->WriteAt(kObj - 1000, edge).ok());
  std::copy(edge.begin(), edge.end(), model.begin() + std::ptrdiff_t(kObj - 1000));
  EXPECT_EQ(Read(*s, 0, 2 * kObj), model);
  EXPECT_TRUE(DataObjects().empty());  // held, not yet stored
  {
    auto reader = Open(/*read_only=*/true);
    ASSERT_TRUE(reader);
    EXPECT_TRUE(AllZero(Read(*reader, 0, 2 * kObj)));
  }
  ASSERT_TRUE(s->Flush().ok());
  EXPECT_EQ(DataObjects(), (std::vector<std::string>{Obj(0), Obj(1)}));
  std::vector<uint8_t> stored = ObjectBytes(Obj(0));
  const std::vector<uint8_t> obj1 = ObjectBytes(Obj(1));
  stored.insert(stored.end(), obj1.begin(), obj1.end());
  stored.resize(2 * kObj, 0);  // object 1 ends at its last written byte
  EXPECT_EQ(stored, model);
  auto reader = Open(/*read_only=*/true);
  ASSERT_TRUE(reader);
  EXPECT_EQ(Read(*reader, 0, 2 * kObj), model);
}

TEST_F(RadosStorageTest, CacheNoneWritesThrough) {
  ASSERT_TRUE(CreateRados(uri_, 0, kObj).ok());
  auto s = Open(/*read_only=*/false, CacheMode::kNone);
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->WriteAt(3 * kObj + 10, Pattern(7, 100)).ok());
  EXPECT_EQ(DataObjects(), std::vector<std::string>{Obj(3)});
  EXPECT_EQ(ObjectSize(Obj(3)), 110);
}

// Bytes held before a write that goes through (a large one), a punch, a
// zero or a shrink never land after it.
TEST_F(RadosStorageTest, HeldBytesNeverLandOverNewerOnes) {
  auto s = Create(0);
  ASSERT_TRUE(s);
  const uint64_t big = RadosStorage::kMaxHeldWrite;
  ASSERT_TRUE(s->WriteAt(100, Pattern(30, 4096)).ok());        // held
  ASSERT_TRUE(s->WriteAt(20 * kObj, Pattern(31, 4096)).ok());  // held
  ASSERT_TRUE(s->WriteAt(40 * kObj, Pattern(32, 4096)).ok());  // held
  ASSERT_TRUE(s->WriteAt(60 * kObj, Pattern(33, 4096)).ok());  // held
  const std::vector<uint8_t> large = Pattern(34, big);
  ASSERT_TRUE(s->WriteAt(0, large).ok());        // through
  EXPECT_EQ(ObjectSize(Obj(0)), int64_t(kObj));  // stored at once
  ASSERT_TRUE(s->PunchHole(20 * kObj, 4096).ok());
  ASSERT_TRUE(s->ZeroRange(40 * kObj, 4096).ok());
  ASSERT_TRUE(s->Resize(50 * kObj).ok());
  const auto check = [&](Storage& st) {
    EXPECT_EQ(Read(st, 0, big), large);
    EXPECT_TRUE(AllZero(Read(st, 20 * kObj, 4096)));
    EXPECT_TRUE(AllZero(Read(st, 40 * kObj, 4096)));
    ASSERT_TRUE(st.Resize(61 * kObj).ok());
    EXPECT_TRUE(AllZero(Read(st, 60 * kObj, 4096)));
  };
  check(*s);
  ASSERT_TRUE(s->Flush().ok());
  check(*s);
  s.reset();
  auto again = Open();
  ASSERT_TRUE(again);
  check(*again);
}

// Without a flush, held bytes are written back once they are a second old.
TEST_F(RadosStorageTest, HeldBytesAreStoredWithinSeconds) {
  auto s = Create(0);
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->WriteAt(kObj, Pattern(40, 512)).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (DataObjects().empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(ObjectBytes(Obj(1)), Pattern(40, 512));
}

}  // namespace
}  // namespace thindisk::io
