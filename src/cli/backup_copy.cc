#include "cli/backup_copy.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace thindisk::cli {
namespace {

// Zero detection grain: runs of zeros shorter than this are written as data.
constexpr uint64_t kZeroGrain = 4096;

// The chunks of `ranges`, handed out in order to the workers.
class ChunkQueue {
 public:
  explicit ChunkQueue(const std::vector<ByteRange>& ranges) : ranges_(ranges) {}
  bool Next(ByteRange* chunk) {
    util::MutexLock lock(mu_);
    while (index_ < ranges_.size() && done_in_range_ >= ranges_[index_].length) {
      ++index_;
      done_in_range_ = 0;
    }
    if (stop_ || index_ >= ranges_.size()) return false;
    const ByteRange& r = ranges_[index_];
    chunk->offset = r.offset + done_in_range_;
    chunk->length = std::min(kBackupChunk, r.length - done_in_range_);
    done_in_range_ += chunk->length;
    return true;
  }
  void Stop() {
    util::MutexLock lock(mu_);
    stop_ = true;
  }

 private:
  const std::vector<ByteRange>& ranges_;
  util::Mutex mu_;
  size_t index_ TD_GUARDED_BY(mu_) = 0;
  uint64_t done_in_range_ TD_GUARDED_BY(mu_) = 0;
  bool stop_ TD_GUARDED_BY(mu_) = false;
};

bool AllZero(const uint8_t* p, uint64_t n) {
  return n == 0 || (p[0] == 0 && std::equal(p + 1, p + n, p));
}

// Writes one chunk read at `offset`: data runs as data, 4 KiB zero runs
// as zeroes or not at all.
Status WriteChunk(block::Device& dst, uint64_t offset, const std::vector<uint8_t>& buf,
                  bool zeroes_as_writes, CopyRangesStats* stats) {
  uint64_t pos = 0;
  while (pos < buf.size()) {
    const uint64_t grain = std::min(kZeroGrain, buf.size() - pos);
    const bool zero = AllZero(buf.data() + pos, grain);
    uint64_t end = pos + grain;
    while (end < buf.size()) {
      const uint64_t g = std::min(kZeroGrain, buf.size() - end);
      if (AllZero(buf.data() + end, g) != zero) break;
      end += g;
    }
    const uint64_t len = end - pos;
    if (zero) {
      if (zeroes_as_writes) {
        TD_RETURN_IF_ERROR(dst.WriteZeroes(offset + pos, len, {.may_unmap = true}));
      }
      stats->zeroes += len;
    } else {
      TD_RETURN_IF_ERROR(dst.Write(offset + pos, std::span(buf.data() + pos, len), {}));
      stats->data_written += len;
    }
    pos = end;
  }
  return Status::Ok();
}

}  // namespace

Result<CopyRangesStats> CopyRanges(block::Device& src, block::Device& dst,
                                   const std::vector<ByteRange>& ranges,
                                   const CopyRangesOptions& options) {
  uint64_t total = 0;
  for (const ByteRange& r : ranges) total += r.length;
  ChunkQueue queue(ranges);
  std::mutex mu;
  Status first_error;          // guarded by mu
  CopyRangesStats stats;       // guarded by mu
  std::atomic<uint64_t> done{0};
  auto worker = [&] {
    std::vector<uint8_t> buf;
    CopyRangesStats mine;
    ByteRange c;
    while (queue.Next(&c)) {
      buf.resize(c.length);
      const uint64_t written_before = mine.data_written;
      Status s = src.Read(c.offset, buf);
      if (s.ok()) s = WriteChunk(dst, c.offset, buf, options.zeroes_as_writes, &mine);
      if (s.ok() && options.wrote && mine.data_written != written_before) {
        std::lock_guard lock(mu);
        options.wrote(mine.data_written - written_before);
      }
      if (!s.ok()) {
        queue.Stop();
        std::lock_guard lock(mu);
        if (first_error.ok()) first_error = s.WithContext("at offset " + std::to_string(c.offset));
        break;
      }
      done += c.length;
    }
    std::lock_guard lock(mu);
    stats.data_written += mine.data_written;
    stats.zeroes += mine.zeroes;
  };
  std::vector<std::thread> pool;
  const size_t n = std::max<size_t>(1, options.workers);
  for (size_t i = 0; i < n; ++i) pool.emplace_back(worker);
  if (options.progress) {
    // The caller's thread draws the progress while the workers copy.
    while (done.load() < total) {
      {
        std::lock_guard lock(mu);
        if (!first_error.ok()) break;
      }
      options.progress->Update(done.load(), total);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  for (std::thread& t : pool) t.join();
  if (!first_error.ok()) return first_error;
  if (options.progress) {
    options.progress->Update(total, total);
    options.progress->Finish();
  }
  stats.bytes = total;
  return stats;
}

Result<std::vector<ByteRange>> NonZeroRanges(block::Device& dev) {
  std::vector<ByteRange> out;
  const uint64_t size = dev.size();
  for (uint64_t pos = 0; pos < size;) {
    auto e = dev.GetStatus(pos, size - pos);
    if (!e) return e.error().WithContext("block status at " + std::to_string(pos));
    const uint64_t len = std::min(std::max<uint64_t>(e->length, 1), size - pos);
    if (!e->zero) {
      if (!out.empty() && out.back().offset + out.back().length == pos) {
        out.back().length += len;
      } else {
        out.push_back({pos, len});
      }
    }
    pos += len;
  }
  return out;
}

}  // namespace thindisk::cli
