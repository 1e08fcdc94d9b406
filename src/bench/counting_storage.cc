#include "bench/counting_storage.h"

namespace thindisk::bench {
namespace {

// The step announced last on this thread; kNone once its write is counted.
constexpr int kNone = -1;
thread_local int last_event = kNone;

void CountWrite(HostCounters& c, uint64_t bytes) {
  c.bytes_written += bytes;
  switch (last_event) {
    case int(io::Event::kDataWrite):
    case int(io::Event::kCompressedWrite):
      c.data_bytes += bytes;
      break;
    case int(io::Event::kCowWrite):
      c.fill_bytes += bytes;
      break;
    default:
      c.metadata_bytes += bytes;
      break;
  }
  last_event = kNone;
}

}  // namespace

void CountingStorage::Announce(io::Event e) {
  last_event = int(e);
  inner().Announce(e);
}

Status CountingStorage::WriteAt(uint64_t offset, std::span<const uint8_t> buf) {
  Status s = inner().WriteAt(offset, buf);
  if (s.ok()) CountWrite(*counters_, buf.size());
  return s;
}

Status CountingStorage::Flush() {
  Status s = inner().Flush();
  if (s.ok()) ++counters_->flushes;
  return s;
}

Status CountingStorage::ZeroRange(uint64_t offset, uint64_t length) {
  Status s = inner().ZeroRange(offset, length);
  // Zeroing may be a cheap fallocate; counted as written like
  // io::Storage::bytes_written does, which is the pessimistic reading.
  if (s.ok()) CountWrite(*counters_, length);
  return s;
}

}  // namespace thindisk::bench
