// io::ForwardingStorage: a Storage that passes every call to an inner one.
//
// The base of wrappers that change or watch a few calls and leave the rest
// alone (the bench's write counter, the slow-on-purpose LatencyStorage,
// tests' recorders): each overrides what it changes and reaches the
// wrapped storage through inner().
//
// Thread safety: as the inner storage (it keeps no state of its own).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>

#include "io/storage.h"

namespace thindisk::io {

class ForwardingStorage : public Storage {
 public:
  explicit ForwardingStorage(std::unique_ptr<Storage> inner) : inner_(std::move(inner)) {}

  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override {
    return inner_->ReadAt(offset, buf);
  }
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override {
    return inner_->WriteAt(offset, buf);
  }
  Status Flush() override { return inner_->Flush(); }
  Result<uint64_t> Size() override { return inner_->Size(); }
  Status Resize(uint64_t size) override { return inner_->Resize(size); }
  Status Allocate(uint64_t offset, uint64_t length) override {
    return inner_->Allocate(offset, length);
  }
  Status PunchHole(uint64_t offset, uint64_t length) override {
    return inner_->PunchHole(offset, length);
  }
  Status ZeroRange(uint64_t offset, uint64_t length) override {
    return inner_->ZeroRange(offset, length);
  }
  Result<uint64_t> NextData(uint64_t offset) override { return inner_->NextData(offset); }
  Result<uint64_t> NextHole(uint64_t offset) override { return inner_->NextHole(offset); }
  Result<uint64_t> AllocatedBytes() override { return inner_->AllocatedBytes(); }
  uint64_t bytes_written() const override { return inner_->bytes_written(); }
  const std::string& name() const override { return inner_->name(); }
  void Announce(Event e) override { inner_->Announce(e); }

 protected:
  Storage& inner() const { return *inner_; }

 private:
  std::unique_ptr<Storage> inner_;
};

}  // namespace thindisk::io
