#include "io/memory_storage.h"

#include <algorithm>
#include <cstring>

namespace thindisk::io {
namespace {

// Validates [offset, offset+length) against kMaxSize without overflowing.
Status CheckRange(const std::string& name, uint64_t offset, uint64_t length) {
  if (offset > MemoryStorage::kMaxSize || length > MemoryStorage::kMaxSize - offset) {
    return Status::OutOfRange(name + ": range beyond the maximum storage size");
  }
  return Status::Ok();
}

}  // namespace

MemoryStorage::MemoryStorage(std::string name) : name_(std::move(name)) {}

std::unique_ptr<MemoryStorage> NewMemoryStorage(std::string name) {
  return std::make_unique<MemoryStorage>(std::move(name));
}

Status MemoryStorage::ReadAt(uint64_t offset, std::span<uint8_t> buf) {
  TD_RETURN_IF_ERROR(CheckRange(name_, offset, buf.size()));
  util::MutexLock lock(mu_);
  uint64_t pos = offset;
  size_t done = 0;
  while (done < buf.size()) {
    const uint64_t index = pos / kChunkSize;
    const uint64_t in_chunk = pos % kChunkSize;
    const size_t n = std::min<uint64_t>(kChunkSize - in_chunk, buf.size() - done);
    auto it = chunks_.find(index);
    // Bytes past size_ inside a chunk are zero (class invariant), so no
    // clipping against size_ is needed here.
    if (it == chunks_.end()) {
      std::memset(buf.data() + done, 0, n);
    } else {
      std::memcpy(buf.data() + done, it->second.get() + in_chunk, n);
    }
    done += n;
    pos += n;
  }
  return Status::Ok();
}

Status MemoryStorage::WriteAt(uint64_t offset, std::span<const uint8_t> buf) {
  TD_RETURN_IF_ERROR(CheckRange(name_, offset, buf.size()));
  util::MutexLock lock(mu_);
  uint64_t pos = offset;
  size_t done = 0;
  while (done < buf.size()) {
    const uint64_t index = pos / kChunkSize;
    const uint64_t in_chunk = pos % kChunkSize;
    const size_t n = std::min<uint64_t>(kChunkSize - in_chunk, buf.size() - done);
    Chunk& chunk = chunks_[index];
    if (!chunk) chunk = Chunk(new uint8_t[kChunkSize]());  // value-initialized: zeros
    std::memcpy(chunk.get() + in_chunk, buf.data() + done, n);
    done += n;
    pos += n;
  }
  size_ = std::max(size_, offset + buf.size());
  bytes_written_ += buf.size();
  return Status::Ok();
}

Status MemoryStorage::Flush() { return Status::Ok(); }

Result<uint64_t> MemoryStorage::Size() {
  util::MutexLock lock(mu_);
  return size_;
}

Status MemoryStorage::Resize(uint64_t size) {
  TD_RETURN_IF_ERROR(CheckRange(name_, size, 0));
  util::MutexLock lock(mu_);
  if (size < size_) ZeroLocked(size, size_ - size);  // keeps the invariant
  size_ = size;
  return Status::Ok();
}

Status MemoryStorage::Allocate(uint64_t offset, uint64_t length) {
  TD_RETURN_IF_ERROR(CheckRange(name_, offset, length));
  util::MutexLock lock(mu_);
  size_ = std::max(size_, offset + length);
  return Status::Ok();
}

Status MemoryStorage::PunchHole(uint64_t offset, uint64_t length) {
  TD_RETURN_IF_ERROR(CheckRange(name_, offset, length));
  util::MutexLock lock(mu_);
  ZeroLocked(offset, length);
  return Status::Ok();
}

Status MemoryStorage::ZeroRange(uint64_t offset, uint64_t length) {
  TD_RETURN_IF_ERROR(CheckRange(name_, offset, length));
  util::MutexLock lock(mu_);
  ZeroLocked(offset, length);
  size_ = std::max(size_, offset + length);
  bytes_written_ += length;
  return Status::Ok();
}

void MemoryStorage::ZeroLocked(uint64_t offset, uint64_t length) {
  const uint64_t end = offset + length;
  auto it = chunks_.lower_bound(offset / kChunkSize);
  while (it != chunks_.end() && it->first * kChunkSize < end) {
    const uint64_t chunk_start = it->first * kChunkSize;
    const uint64_t from = std::max(offset, chunk_start);
    const uint64_t to = std::min(end, chunk_start + kChunkSize);
    if (from == chunk_start && to == chunk_start + kChunkSize) {
      it = chunks_.erase(it);
      continue;
    }
    std::memset(it->second.get() + (from - chunk_start), 0, to - from);
    ++it;
  }
}

Result<uint64_t> MemoryStorage::NextData(uint64_t offset) {
  util::MutexLock lock(mu_);
  if (offset >= size_) return size_;
  auto it = chunks_.lower_bound(offset / kChunkSize);
  if (it == chunks_.end()) return size_;
  return std::min(size_, std::max(offset, it->first * kChunkSize));
}

Result<uint64_t> MemoryStorage::NextHole(uint64_t offset) {
  util::MutexLock lock(mu_);
  if (offset >= size_) return size_;
  uint64_t index = offset / kChunkSize;
  auto it = chunks_.find(index);
  // Walk the run of consecutive held chunks; the first gap is the hole.
  while (it != chunks_.end() && it->first == index) {
    ++index;
    ++it;
  }
  return std::min(size_, std::max(offset, index * kChunkSize));
}

Result<uint64_t> MemoryStorage::AllocatedBytes() { return uint64_t{ChunkCount()} * kChunkSize; }

size_t MemoryStorage::ChunkCount() {
  util::MutexLock lock(mu_);
  return chunks_.size();
}

std::vector<uint8_t> MemoryStorage::Contents() {
  uint64_t size;
  {
    util::MutexLock lock(mu_);
    size = size_;
  }
  std::vector<uint8_t> out(size);
  // A concurrent resize may race, but ReadAt itself is always well-defined.
  (void)ReadAt(0, out);
  return out;
}

std::unique_ptr<MemoryStorage> MemoryStorage::Clone() {
  auto copy = NewMemoryStorage(name_);
  util::MutexLock lock(mu_);
  // No one else has the copy yet: its lock keeps the contract at no cost.
  util::MutexLock copy_lock(copy->mu_);
  copy->size_ = size_;
  for (const auto& [index, chunk] : chunks_) {
    Chunk c(new uint8_t[kChunkSize]);
    std::memcpy(c.get(), chunk.get(), kChunkSize);
    copy->chunks_.emplace(index, std::move(c));
  }
  return copy;
}

}  // namespace thindisk::io
