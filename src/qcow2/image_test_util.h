// Helpers shared by the engine's image tests: in-memory images, a model of
// the expected guest content, a fake backing device, deterministic data.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "io/faulty_storage.h"
#include "io/memory_storage.h"
#include "qcow2/check.h"
#include "qcow2/image.h"
#include "qcow2/table_entry.h"
#include "util/endian.h"

namespace thindisk::qcow2::testing {

// Deterministic bytes: different for every (seed, offset).
inline std::vector<uint8_t> Pattern(uint64_t seed, size_t n) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 1);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t x = rng();
    std::memcpy(&v[i], &x, std::min<size_t>(8, n - i));
  }
  return v;
}

// Holds storage calls on their way to a slow disk, for tests of what goes on
// meanwhile. A test arms the gate; a storage wrapper passes each call that
// matches through Pass(), which holds it (the first one after Arm, or every
// one with `all`) until the test's Release().
class Gate {
 public:
  void Arm(bool all = false) {
    std::lock_guard l(mu_);
    armed_ = true;
    all_ = all;
    held_ = 0;
  }
  void Pass() {
    std::unique_lock l(mu_);
    if (!armed_) return;
    if (!all_) armed_ = false;
    ++held_;
    const uint64_t round = round_;
    changed_.notify_all();
    changed_.wait(l, [&] { return round_ != round; });
  }
  // Waits (at most 10 s) until a call is held.
  bool WaitHeld() {
    std::unique_lock l(mu_);
    return changed_.wait_for(l, std::chrono::seconds(10), [&] { return held_ > 0; });
  }
  // Lets every held call go on, and disarms.
  void Release() {
    std::lock_guard l(mu_);
    armed_ = false;
    ++round_;
    changed_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  bool armed_ = false;
  bool all_ = false;
  int held_ = 0;
  uint64_t round_ = 0;
};

// The host offset of the first L2 table, as the L1 table on disk says.
inline uint64_t FirstL2Table(Image& image) {
  uint8_t raw[8];
  EXPECT_TRUE(image.storage().ReadAt(image.header().l1_table_offset, raw).ok());
  return L1Offset(LoadBe64(raw));
}

// The host offset of refcount block `index`, as the refcount table on disk
// says (0: none).
inline uint64_t RefcountBlock(Image& image, uint64_t index) {
  uint8_t raw[8];
  EXPECT_TRUE(
      image.storage().ReadAt(image.header().refcount_table_offset + index * 8, raw).ok());
  return LoadBe64(raw) & ~uint64_t{511};
}

// Check finds the closed image in `storage` whole: no corruption, no leak,
// nothing it could not read. `context` goes into the failure messages.
inline void ExpectWhole(io::Storage& storage, const std::string& context = "") {
  auto report = Check(storage, RepairMode::kNone);
  ASSERT_TRUE(report.has_value()) << context;
  EXPECT_EQ(report->corruptions, 0u) << context;
  EXPECT_EQ(report->leaks, 0u) << context;
  EXPECT_EQ(report->check_errors, 0u) << context;
}

// A freshly created image on MemoryStorage. `storage` stays valid while the
// image lives (the image owns it).
struct MemImage {
  io::MemoryStorage* storage = nullptr;
  std::unique_ptr<Image> image;
};

inline MemImage CreateMem(const CreateOptions& co, OpenOptions oo = {}) {
  MemImage m;
  auto storage = io::NewMemoryStorage("test.qcow2");
  Status s = Create(*storage, co);
  EXPECT_TRUE(s.ok()) << s.ToString();
  m.storage = storage.get();
  auto img = Image::Open(std::move(storage), oo);
  EXPECT_TRUE(img.has_value()) << img.status().ToString();
  if (img) m.image = std::move(*img);
  return m;
}

// The same on MemoryStorage behind FaultyStorage, whose event counts show
// the engine's named write steps (io::Event). Nothing is armed to fail.
struct CountedImage {
  io::FaultyStorage* storage = nullptr;
  std::unique_ptr<Image> image;
};

inline CountedImage CreateCounted(const CreateOptions& co, OpenOptions oo = {}) {
  CountedImage c;
  auto mem = io::NewMemoryStorage("test.qcow2");
  Status s = Create(*mem, co);
  EXPECT_TRUE(s.ok()) << s.ToString();
  auto faulty = io::NewFaultyStorage(std::move(mem));
  EXPECT_TRUE(faulty.has_value()) << faulty.status().ToString();
  if (!faulty) return c;
  c.storage = faulty->get();
  auto img = Image::Open(std::move(*faulty), oo);
  EXPECT_TRUE(img.has_value()) << img.status().ToString();
  if (img) c.image = std::move(*img);
  return c;
}

// Closes the image and opens the same bytes again.
inline MemImage Reopen(MemImage& m, OpenOptions oo = {}) {
  EXPECT_TRUE(m.image->Close().ok());
  auto copy = m.storage->Clone();
  MemImage r;
  r.storage = copy.get();
  auto img = Image::Open(std::move(copy), oo);
  EXPECT_TRUE(img.has_value()) << img.status().ToString();
  if (img) r.image = std::move(*img);
  m.image.reset();
  return r;
}

// A freshly created image on MemoryStorage seen through a storage wrapper
// `W` (a test's recorder or fault injector, constructed from the inner
// storage). Both pointers stay valid while the image lives.
template <class W>
struct WrappedImage {
  io::MemoryStorage* mem = nullptr;
  W* wrapper = nullptr;
  std::unique_ptr<Image> image;
};

template <class W>
WrappedImage<W> CreateWrapped(const CreateOptions& co, OpenOptions oo = {}) {
  WrappedImage<W> m;
  auto mem = io::NewMemoryStorage("test.qcow2");
  Status s = Create(*mem, co);
  EXPECT_TRUE(s.ok()) << s.ToString();
  m.mem = mem.get();
  auto wrapper = std::make_unique<W>(std::move(mem));
  m.wrapper = wrapper.get();
  auto img = Image::Open(std::move(wrapper), oo);
  EXPECT_TRUE(img.has_value()) << img.status().ToString();
  if (img) m.image = std::move(*img);
  return m;
}

// Immutable bytes shared by the fake backing devices of many opens.
using SharedBytes = std::shared_ptr<const std::vector<uint8_t>>;

// A block::Device over a byte vector: the stand-in for a backing image.
class FakeDevice : public block::Device {
 public:
  explicit FakeDevice(std::vector<uint8_t> bytes)
      : FakeDevice(std::make_shared<const std::vector<uint8_t>>(std::move(bytes))) {}
  // Shares `bytes` (never written) instead of copying them.
  explicit FakeDevice(SharedBytes bytes) : bytes_(std::move(bytes)) { info_.format = "raw"; }
  uint64_t size() const override { return bytes_->size(); }
  const block::DeviceInfo& info() const override { return info_; }
  Status Read(uint64_t offset, std::span<uint8_t> buf) override {
    if (offset + buf.size() > bytes_->size()) return Status::OutOfRange("fake read");
    std::memcpy(buf.data(), bytes_->data() + offset, buf.size());
    return Status::Ok();
  }
  Status Write(uint64_t, std::span<const uint8_t>, block::WriteFlags) override {
    return Status::ReadOnly("fake backing");
  }
  Status WriteZeroes(uint64_t, uint64_t, block::ZeroFlags) override {
    return Status::ReadOnly("fake backing");
  }
  Status Discard(uint64_t, uint64_t) override { return Status::ReadOnly("fake backing"); }
  Status Flush() override { return Status::Ok(); }
  Result<block::Extent> GetStatus(uint64_t offset, uint64_t max_length) override {
    block::Extent e;
    e.offset = offset;
    e.length = std::min<uint64_t>(max_length, bytes_->size() - offset);
    e.data = true;
    e.present = true;
    return e;
  }
  Status Resize(uint64_t, bool) override { return Status::NotSupported("fake"); }
  Status Close() override { return Status::Ok(); }

 private:
  SharedBytes bytes_;
  block::DeviceInfo info_;
};

// Open options whose backing file, whatever its name, is `bytes` (shared by
// every device the options open).
inline OpenOptions BackedBy(SharedBytes bytes, bool read_only = false) {
  OpenOptions oo;
  oo.read_only = read_only;
  oo.open_backing = [bytes = std::move(bytes)](const std::string&, const std::string&)
      -> Result<std::unique_ptr<block::Device>> {
    return std::unique_ptr<block::Device>(std::make_unique<FakeDevice>(bytes));
  };
  return oo;
}

inline OpenOptions BackedBy(std::vector<uint8_t> bytes, bool read_only = false) {
  return BackedBy(std::make_shared<const std::vector<uint8_t>>(std::move(bytes)), read_only);
}

// Reads the whole range and compares it with the model.
inline void ExpectContent(Image& img, const std::vector<uint8_t>& model, uint64_t offset,
                          uint64_t len) {
  std::vector<uint8_t> got(len);
  Status s = img.Read(offset, got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (uint64_t i = 0; i < len; ++i) {
    if (got[i] != model[offset + i]) {
      FAIL() << "byte at guest offset " << offset + i << " is " << int(got[i]) << ", expected "
             << int(model[offset + i]);
    }
  }
}

}  // namespace thindisk::qcow2::testing
