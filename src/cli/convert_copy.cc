// See convert_copy.h.
#include "cli/convert_copy.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "qcow2/image.h"
#include "qcow2/measure.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace thindisk::cli {
namespace {

// Bytes read from the source per step (or -S's grain, when larger). The
// default zero detection grain (CopyOptions::sparse) is what `measure`
// replays (qcow2/measure.h).
constexpr uint64_t kCopyChunk = qcow2::kConvertChunk;
static_assert(CopyOptions{}.sparse == qcow2::kConvertSparseGrain);
// Plain copies read ahead and write in order (CopyPlain): kCopyReaders
// threads fetch runs of run_bytes_ (block status and data) while this
// thread writes finished runs in guest order, as qemu-img convert does
// without -W. So many requests are in flight against a source with latency
// (an NBD export answers each after a round trip), while the target's host
// layout still follows guest order: later sequential reads stay sequential
// and measure's prediction of the file size stays exact.
constexpr size_t kCopyReaders = 8;
// Compression is CPU-bound: runs of kCompressRun clusters over the
// machine's CPUs, at most kMaxCompressThreads (ForEachRun).
constexpr uint64_t kCompressRun = 16;
constexpr size_t kMaxCompressThreads = 8;
// --salvage reads a failed range again down to this many bytes.
constexpr uint64_t kSalvageSector = 512;

class Converter {
 public:
  // `writeback` (optional) is told what each copy step wrote.
  Converter(block::Device& src, block::Device& dst, const CopyOptions& options,
            Progress& progress, BackgroundWriteback* writeback)
      : src_(src),
        dst_(dst),
        target_(options.target),
        sparse_(options.sparse),
        salvage_(options.salvage),
        rate_limit_(options.rate_limit),
        offload_(options.offload),
        run_bytes_(std::max(kCopyChunk, options.sparse)),
        progress_(progress),
        writeback_(writeback) {}

  // The unreadable ranges --salvage met, sorted, touching ones with the
  // same error merged; taken once, after the copy.
  std::vector<UnreadableRange> TakeUnreadable() {
    util::MutexLock lock(unreadable_mu_);
    std::sort(unreadable_.begin(), unreadable_.end(),
              [](const UnreadableRange& a, const UnreadableRange& b) {
                return a.offset < b.offset;
              });
    std::vector<UnreadableRange> merged;
    for (UnreadableRange& r : unreadable_) {
      if (!merged.empty() && merged.back().offset + merged.back().length == r.offset &&
          merged.back().error == r.error) {
        merged.back().length += r.length;
      } else {
        merged.push_back(std::move(r));
      }
    }
    return merged;
  }

  Status CopyPlain() {
    const uint64_t size = src_.size();
    const uint64_t runs = (size + run_bytes_ - 1) / run_bytes_;
    // Run r is fetched into slots[r % kCopyReaders] once run r - kCopyReaders
    // has been written.
    std::vector<FetchedRun> slots(kCopyReaders);
    std::mutex mu;
    std::condition_variable cv;
    uint64_t next_fetch = 0;  // guarded by mu
    uint64_t written = 0;     // runs written, in order; guarded by mu
    bool stop = false;        // guarded by mu
    auto reader = [&] {
      std::unique_lock<std::mutex> lock(mu);
      while (!stop && next_fetch < runs) {
        const uint64_t r = next_fetch++;
        FetchedRun& slot = slots[r % kCopyReaders];
        cv.wait(lock, [&] { return stop || r < written + kCopyReaders; });
        if (stop) return;
        lock.unlock();
        const uint64_t begin = r * run_bytes_;
        Status s = Fetch(begin, std::min(size, begin + run_bytes_), slot);
        lock.lock();
        slot.status = s;
        slot.run = r;
        slot.ready = true;
        cv.notify_all();
      }
    };
    std::vector<std::thread> readers;
    for (size_t i = 0; i < kCopyReaders && i < runs; ++i) readers.emplace_back(reader);
    Status result;
    for (uint64_t r = 0; r < runs; ++r) {
      FetchedRun& slot = slots[r % kCopyReaders];
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return slot.ready && slot.run == r; });
      }
      Status s = slot.status.ok() ? WriteFetched(slot) : slot.status;
      // Read before the slot goes back: a reader refills it at once.
      const uint64_t data_bytes = slot.data_bytes;
      {
        std::lock_guard<std::mutex> lock(mu);
        slot.ready = false;
        ++written;
        if (!s.ok()) stop = true;
      }
      cv.notify_all();
      if (!s.ok()) {
        result = s;
        break;
      }
      progress_.Update(std::min(size, (r + 1) * run_bytes_), size);
      if (writeback_ != nullptr) writeback_->Wrote(data_bytes);
    }
    for (std::thread& t : readers) t.join();
    return result;
  }

  // Compressed clusters land in the file in roughly guest order (runs are
  // handed out in order); WriteCompressed is safe for concurrent use on
  // different clusters.
  Status CopyCompressed() {
    auto* image = dynamic_cast<qcow2::Image*>(&dst_);
    if (image == nullptr) return Status::InvalidArgument("compression (-c) needs a qcow2 target");
    const uint64_t cluster = image->header().cluster_size();
    const size_t threads =
        std::clamp<size_t>(std::thread::hardware_concurrency(), 1, kMaxCompressThreads);
    return ForEachRun(cluster * kCompressRun, threads, cluster,
                      [&](uint64_t begin, uint64_t end, std::vector<uint8_t>& buf) {
                        return CompressRange(*image, begin, end, cluster, buf);
                      });
  }

 private:
  using RunFn = std::function<Status(uint64_t begin, uint64_t end, std::vector<uint8_t>& buf)>;

  // Cuts the source into runs of `run_bytes`; `threads` threads (this one
  // included, which also draws the progress) take runs in order from a
  // shared counter and call `fn` on each with a buffer of `buf_bytes`. The
  // first error stops every thread after its current run and is returned.
  Status ForEachRun(uint64_t run_bytes, size_t threads, size_t buf_bytes, const RunFn& fn) {
    const uint64_t size = src_.size();
    const uint64_t runs = (size + run_bytes - 1) / run_bytes;
    std::atomic<uint64_t> next_run{0};
    std::atomic<uint64_t> done_bytes{0};
    std::atomic<bool> failed{false};
    std::mutex error_mu;
    Status first_error;
    uint64_t reported = 0;  // source bytes told to the write-back (this thread's)
    auto work = [&](bool report) {
      std::vector<uint8_t> buf(buf_bytes);
      for (uint64_t r; !failed.load() && (r = next_run.fetch_add(1)) < runs;) {
        const uint64_t begin = r * run_bytes;
        const uint64_t end = std::min(size, begin + run_bytes);
        Status s = fn(begin, end, buf);
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (first_error.ok()) first_error = s;
          failed = true;
        }
        done_bytes += end - begin;
        if (report) Report(done_bytes.load(), size, reported);
      }
    };
    std::vector<std::thread> helpers;
    for (size_t i = 1; i < threads && i < runs; ++i) helpers.emplace_back(work, false);
    work(true);
    for (std::thread& t : helpers) t.join();
    return first_error;
  }

  // Draws the progress and tells the write-back how many source bytes were
  // done since the last call, standing in for the bytes written: compressed
  // output is smaller (and skipped holes write nothing), so its syncs come
  // more often than every 4 MiB of file.
  void Report(uint64_t done, uint64_t size, uint64_t& reported) {
    progress_.Update(done, size);
    if (writeback_ != nullptr) writeback_->Wrote(done - reported);
    reported = done;
  }

  // One run of the source as CopyPlain's readers fetch it: its extents in
  // order, the data ones read into `data` (at their offset in the run).
  struct Piece {
    // kOffload: data copied file to file (-C), from host_offset.
    enum class Kind { kSkip, kZero, kData, kOffload };
    uint64_t offset = 0, length = 0;
    Kind kind = Kind::kSkip;
    uint64_t host_offset = 0;
  };
  struct FetchedRun {
    uint64_t begin = 0;
    std::vector<uint8_t> data;
    std::vector<Piece> pieces;
    uint64_t data_bytes = 0;  // in kData pieces
    Status status;
    uint64_t run = 0;    // guarded by CopyPlain's mutex, with ready
    bool ready = false;  // fetched and not yet written
  };

  // Reads [begin, end) into `run`: skippable extents are not read (the
  // target reads the same), zero ones are written as zeroes (over a backing
  // file or into an existing target), data is read whole.
  Status Fetch(uint64_t begin, uint64_t end, FetchedRun& run) {
    run.begin = begin;
    run.pieces.clear();
    run.data_bytes = 0;
    run.data.resize(end - begin);
    for (uint64_t offset = begin; offset < end;) {
      TD_ASSIGN_OR_RETURN(block::Extent e, BlockStatus(offset, end - offset));
      if (e.length == 0) return Status::Internal("block status returned an empty extent");
      const uint64_t n = std::min(e.length, end - offset);
      Piece p{offset, n, Piece::Kind::kData};
      if (SkipExtent(e)) {
        p.kind = Piece::Kind::kSkip;
      } else if (ZeroWithoutData(e)) {
        p.kind = Piece::Kind::kZero;  // hides the target's backing file or old data
      } else if (offload_ != nullptr && e.depth == 0 && e.data && e.has_host_offset) {
        // Not read here: the writer has the kernel copy it.
        p.kind = Piece::Kind::kOffload;
        p.host_offset = e.host_offset;
        if (rate_limit_ != nullptr) rate_limit_->Take(n);
        run.data_bytes += n;
      } else {
        TD_RETURN_IF_ERROR(Read(offset, std::span(run.data).subspan(offset - begin, n)));
        run.data_bytes += n;
      }
      run.pieces.push_back(p);
      offset += n;
    }
    return Status::Ok();
  }

  Status WriteFetched(const FetchedRun& run) {
    for (const Piece& p : run.pieces) {
      if (p.kind == Piece::Kind::kZero) {
        TD_RETURN_IF_ERROR(dst_.WriteZeroes(p.offset, p.length));
      } else if (p.kind == Piece::Kind::kData) {
        TD_RETURN_IF_ERROR(WriteNonZeroRuns(
            p.offset, std::span<const uint8_t>(run.data).subspan(p.offset - run.begin, p.length)));
      } else if (p.kind == Piece::Kind::kOffload) {
        TD_RETURN_IF_ERROR(CopyFileToFile(p));
      }
    }
    return Status::Ok();
  }

  // -C: the kernel copies the piece from the source's file into the
  // destination file. What it will not copy is read and written here.
  Status CopyFileToFile(const Piece& p) {
    loff_t in = static_cast<loff_t>(p.host_offset);
    loff_t out = static_cast<loff_t>(p.offset);
    uint64_t left = p.length;
    while (left > 0) {
      const ssize_t n = ::copy_file_range(offload_->src_fd, &in, offload_->dst_fd, &out,
                                          static_cast<size_t>(left), 0);
      if (n > 0) {
        left -= static_cast<uint64_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EXDEV && errno != EOPNOTSUPP && errno != ENOSYS &&
          errno != EINVAL) {
        return Status::FromErrno(
            errno, "copy_file_range into the destination at byte " + std::to_string(out));
      }
      // Refused, or nothing copied: the rest through this process.
      return CopyThrough(p.offset + (p.length - left), left);
    }
    return Status::Ok();
  }

  Status CopyThrough(uint64_t offset, uint64_t length) {
    std::vector<uint8_t> buf(std::min<uint64_t>(length, run_bytes_));
    while (length > 0) {
      const uint64_t n = std::min<uint64_t>(length, buf.size());
      std::span<uint8_t> chunk(buf.data(), n);
      TD_RETURN_IF_ERROR(src_.Read(offset, chunk));
      TD_RETURN_IF_ERROR(WriteNonZeroRuns(offset, chunk));
      offset += n;
      length -= n;
    }
    return Status::Ok();
  }

  // Compresses the clusters of [offset, end) (cluster-aligned `offset`).
  Status CompressRange(qcow2::Image& image, uint64_t offset, uint64_t end, uint64_t cluster,
                       std::vector<uint8_t>& buf) {
    while (offset < end) {
      uint64_t n = std::min(cluster, end - offset);
      TD_ASSIGN_OR_RETURN(block::Extent e, BlockStatus(offset, end - offset));
      const bool skip = SkipExtent(e);
      if (e.length >= n && (skip || ZeroWithoutData(e))) {
        // Every whole cluster the extent covers at once: skipped, or zeroed
        // where the target would not read zeros.
        uint64_t stop = offset + e.length;
        uint64_t next = std::max(stop >= end ? end : stop - stop % cluster, offset + n);
        if (!skip) TD_RETURN_IF_ERROR(dst_.WriteZeroes(offset, next - offset));
        offset = next;
        continue;
      }
      std::span<uint8_t> data(buf.data(), n);
      TD_RETURN_IF_ERROR(Read(offset, data));
      if (sparse_ != 0 && IsAllZero(data.data(), n)) {
        if (target_ != Target::kZero) TD_RETURN_IF_ERROR(dst_.WriteZeroes(offset, n));
      } else {
        TD_RETURN_IF_ERROR(image.WriteCompressed(offset, data));
      }
      offset += n;
    }
    return Status::Ok();
  }

  // The source's block status at `offset`. With --salvage a failure is
  // not the end: the rest of the request is taken for data, which Read
  // then salvages what it can of.
  Result<block::Extent> BlockStatus(uint64_t offset, uint64_t length) {
    Result<block::Extent> e = src_.GetStatus(offset, length);
    if (e || !salvage_) return e;
    block::Extent data;
    data.offset = offset;
    data.length = length;
    data.present = true;
    return data;
  }

  // Reads `buf` at `offset` from the source, once -r's rate allows.
  Status Read(uint64_t offset, std::span<uint8_t> buf) {
    if (rate_limit_ != nullptr) rate_limit_->Take(buf.size());
    return ReadSalvaging(offset, buf);
  }

  // With --salvage a failed read is tried again in halves (on 512-byte
  // boundaries) down to single sectors, so one bad sector costs about two
  // reads per halving; a sector that still fails reads as zeros and is
  // recorded.
  Status ReadSalvaging(uint64_t offset, std::span<uint8_t> buf) {
    Status s = src_.Read(offset, buf);
    if (s.ok() || !salvage_ || buf.empty()) return s;
    const uint64_t end = offset + buf.size();
    const uint64_t first_boundary = (offset / kSalvageSector + 1) * kSalvageSector;
    if (first_boundary >= end) {  // within one sector: lost
      std::fill(buf.begin(), buf.end(), uint8_t{0});
      util::MutexLock lock(unreadable_mu_);
      // The errno's text when there is one, so neighbours merge: the
      // message names each request's offset.
      unreadable_.push_back(
          {offset, buf.size(),
           s.error_number() != 0 ? std::strerror(s.error_number()) : s.message()});
      return Status::Ok();
    }
    // The sector boundary nearest the middle, strictly inside the range.
    const uint64_t mid =
        std::clamp((offset + buf.size() / 2) / kSalvageSector * kSalvageSector,
                   first_boundary, (end - 1) / kSalvageSector * kSalvageSector);
    TD_RETURN_IF_ERROR(ReadSalvaging(offset, buf.first(mid - offset)));
    return ReadSalvaging(mid, buf.subspan(mid - offset));
  }

  // Whether the extent needs no write at all. A target that reads as zeros
  // needs no zero extents (unless -S 0 allocates them). Over a backing file
  // (-B), what the source's own top layer does not hold comes from the
  // backing file the target will share, as qemu-img convert -B assumes. An
  // existing target (-n) needs every extent, zeros included.
  bool SkipExtent(const block::Extent& e) const {
    switch (target_) {
      case Target::kZero:
        return ZeroWithoutData(e);
      case Target::kBacking:
        return e.depth > 0 || !e.present;
      case Target::kExisting:
        return false;
    }
    return false;
  }

  // Whether a zero extent of the source is zeroed (or skipped) rather than
  // written as data: always, unless -S 0 allocates every byte.
  bool ZeroWithoutData(const block::Extent& e) const { return e.zero && sparse_ != 0; }

  // Writes the parts of `data` that are not all-zero grains, in maximal
  // runs; with -S 0, all of it.
  Status WriteNonZeroRuns(uint64_t offset, std::span<const uint8_t> data) {
    if (sparse_ == 0) return dst_.Write(offset, data);
    size_t run_start = 0;
    bool in_run = false;
    for (size_t pos = 0; pos < data.size(); pos += sparse_) {
      size_t len = std::min<size_t>(sparse_, data.size() - pos);
      bool zero = IsAllZero(data.data() + pos, len);
      if (!zero && !in_run) {
        run_start = pos;
        in_run = true;
      } else if (zero && in_run) {
        TD_RETURN_IF_ERROR(dst_.Write(offset + run_start, data.subspan(run_start, pos - run_start)));
        in_run = false;
      }
      if (zero && target_ != Target::kZero) {
        TD_RETURN_IF_ERROR(dst_.WriteZeroes(offset + pos, len));
      }
    }
    if (in_run) TD_RETURN_IF_ERROR(dst_.Write(offset + run_start, data.subspan(run_start)));
    return Status::Ok();
  }

  block::Device& src_;
  block::Device& dst_;
  const Target target_;
  const uint64_t sparse_;     // -S: the zero grain; 0 writes every byte
  const bool salvage_;        // --salvage
  RateLimit* rate_limit_;     // -r, or nullptr
  const CopyOffload* offload_;  // -C, or nullptr
  const uint64_t run_bytes_;  // what one reader fetches: a chunk, or a grain if larger
  Progress& progress_;
  BackgroundWriteback* writeback_;
  util::Mutex unreadable_mu_;
  std::vector<UnreadableRange> unreadable_ TD_GUARDED_BY(unreadable_mu_);
};

// Runs one of the Converter's copies and fills `report` (optional).
Status RunCopy(Status (Converter::*copy)(), block::Device& src, block::Device& dst,
               const CopyOptions& options, Progress& progress,
               BackgroundWriteback* writeback, CopyReport* report) {
  Converter converter(src, dst, options, progress, writeback);
  Status s = (converter.*copy)();
  if (report != nullptr) report->unreadable = converter.TakeUnreadable();
  return s;
}

}  // namespace

Status CopyPlain(block::Device& src, block::Device& dst, const CopyOptions& options,
                 Progress& progress, BackgroundWriteback* writeback, CopyReport* report) {
  return RunCopy(&Converter::CopyPlain, src, dst, options, progress, writeback, report);
}

Status CopyCompressed(block::Device& src, block::Device& dst, const CopyOptions& options,
                      Progress& progress, BackgroundWriteback* writeback,
                      CopyReport* report) {
  return RunCopy(&Converter::CopyCompressed, src, dst, options, progress, writeback,
                 report);
}

}  // namespace thindisk::cli
