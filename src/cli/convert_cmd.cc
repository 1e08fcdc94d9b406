// thindisk convert: copy an image's guest content into a new image, writing
// only what holds data (zero and unallocated ranges are skipped, and so are
// all-zero buffers), optionally compressed. The source is opened read-only;
// a failed conversion removes the destination.
//
// Source and destination may be NBD URIs (block/open.h). An NBD destination
// is an existing export, not a new file: the image is written onto it (as
// qemu-img convert -n does), it must be large enough, and it is not removed
// on failure (it is the server's).
//
// --bitmaps copies the persistent dirty bitmaps of a qcow2 source's top
// layer into a qcow2 destination, as qemu-img convert --bitmaps does (same
// names, granularities, enabled state and bits, same order); an
// inconsistent one (in_use) fails the conversion before anything is made,
// unless --skip-broken-bitmaps skips it with a warning.
#include <CLI/CLI.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "block/open.h"
#include "cli/common.h"
#include "cli/image_create.h"
#include "cli/writeback.h"
#include "io/rados_name.h"
#include "nbdclient/nbd_uri.h"
#include "qcow2/bitmaps.h"
#include "qcow2/image.h"
#include "qcow2/measure.h"

namespace thindisk::cli {
namespace {

// Bytes read from the source per step, and the zero detection grain inside
// a chunk (a run of zeros this large is not written; qemu-img convert's
// default -S is 4 KiB). `measure` replays the same grain (qcow2/measure.h).
constexpr uint64_t kCopyChunk = qcow2::kConvertChunk;
constexpr uint64_t kSparseGrain = qcow2::kConvertSparseGrain;
// Plain copies read ahead and write in order (CopyPlain): kCopyReaders
// threads fetch runs of kCopyRun bytes (block status and data) while this
// thread writes finished runs in guest order, as qemu-img convert does
// without -W. So many requests are in flight against a source with latency
// (an NBD export answers each after a round trip), while the target's host
// layout still follows guest order: later sequential reads stay sequential
// and measure's prediction of the file size stays exact.
constexpr uint64_t kCopyRun = kCopyChunk;
constexpr size_t kCopyReaders = 8;
// Compression is CPU-bound: runs of kCompressRun clusters over the
// machine's CPUs, at most kMaxCompressThreads (ForEachRun).
constexpr uint64_t kCompressRun = 16;
constexpr size_t kMaxCompressThreads = 8;

class Converter {
 public:
  // `writeback` (optional) is told what each copy step wrote.
  Converter(block::Device& src, block::Device& dst, bool target_has_backing, Progress& progress,
            BackgroundWriteback* writeback)
      : src_(src),
        dst_(dst),
        target_has_backing_(target_has_backing),
        progress_(progress),
        writeback_(writeback) {}

  Status CopyPlain() {
    const uint64_t size = src_.size();
    const uint64_t runs = (size + kCopyRun - 1) / kCopyRun;
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
        const uint64_t begin = r * kCopyRun;
        Status s = Fetch(begin, std::min(size, begin + kCopyRun), slot);
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
      progress_.Update(std::min(size, (r + 1) * kCopyRun), size);
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
    enum class Kind { kSkip, kZero, kData };
    uint64_t offset = 0, length = 0;
    Kind kind = Kind::kSkip;
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
  // fresh target reads the same), zero ones only matter over a target
  // backing file, data is read whole.
  Status Fetch(uint64_t begin, uint64_t end, FetchedRun& run) {
    run.begin = begin;
    run.pieces.clear();
    run.data_bytes = 0;
    run.data.resize(end - begin);
    for (uint64_t offset = begin; offset < end;) {
      TD_ASSIGN_OR_RETURN(block::Extent e, src_.GetStatus(offset, end - offset));
      if (e.length == 0) return Status::Internal("block status returned an empty extent");
      const uint64_t n = std::min(e.length, end - offset);
      Piece p{offset, n, Piece::Kind::kData};
      if (SkipExtent(e)) {
        p.kind = Piece::Kind::kSkip;
      } else if (e.zero) {
        p.kind = Piece::Kind::kZero;  // zeros must hide the target's backing file
      } else {
        TD_RETURN_IF_ERROR(src_.Read(offset, std::span(run.data).subspan(offset - begin, n)));
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
      }
    }
    return Status::Ok();
  }

  // Compresses the clusters of [offset, end) (cluster-aligned `offset`).
  Status CompressRange(qcow2::Image& image, uint64_t offset, uint64_t end, uint64_t cluster,
                       std::vector<uint8_t>& buf) {
    while (offset < end) {
      uint64_t n = std::min(cluster, end - offset);
      TD_ASSIGN_OR_RETURN(block::Extent e, src_.GetStatus(offset, end - offset));
      if (e.length >= n && SkipExtent(e)) {
        // Jump over every whole cluster the skippable extent covers.
        uint64_t stop = offset + e.length;
        uint64_t next = stop >= end ? end : stop - stop % cluster;
        offset = std::max(next, offset + n);
        continue;
      }
      std::span<uint8_t> data(buf.data(), n);
      TD_RETURN_IF_ERROR(src_.Read(offset, data));
      if (IsAllZero(data.data(), n)) {
        if (target_has_backing_) TD_RETURN_IF_ERROR(dst_.WriteZeroes(offset, n));
      } else {
        TD_RETURN_IF_ERROR(image.WriteCompressed(offset, data));
      }
      offset += n;
    }
    return Status::Ok();
  }

  // Whether the extent needs no write at all. Without a target backing file
  // the new image reads as zeros, so zero extents are skipped. With one
  // (-B), what the source's own top layer does not hold comes from the
  // backing file the target will share, as qemu-img convert -B assumes.
  bool SkipExtent(const block::Extent& e) const {
    if (target_has_backing_) return e.depth > 0 || !e.present;
    return e.zero;
  }

  // Writes the parts of `data` that are not all zero, in maximal runs.
  Status WriteNonZeroRuns(uint64_t offset, std::span<const uint8_t> data) {
    size_t run_start = 0;
    bool in_run = false;
    for (size_t pos = 0; pos < data.size(); pos += kSparseGrain) {
      size_t len = std::min<size_t>(kSparseGrain, data.size() - pos);
      bool zero = IsAllZero(data.data() + pos, len);
      if (!zero && !in_run) {
        run_start = pos;
        in_run = true;
      } else if (zero && in_run) {
        TD_RETURN_IF_ERROR(dst_.Write(offset + run_start, data.subspan(run_start, pos - run_start)));
        in_run = false;
      }
      if (zero && target_has_backing_) {
        TD_RETURN_IF_ERROR(dst_.WriteZeroes(offset + pos, len));
      }
    }
    if (in_run) TD_RETURN_IF_ERROR(dst_.Write(offset + run_start, data.subspan(run_start)));
    return Status::Ok();
  }

  block::Device& src_;
  block::Device& dst_;
  bool target_has_backing_;
  Progress& progress_;
  BackgroundWriteback* writeback_;
};

// Copies the bitmaps `list` of `src` (its top layer's, directory order)
// into `dst`, whose data is already written: a bitmap that tracked writes
// during the copy would mark them all. Each gets its source's name,
// granularity, enabled state and bits; inconsistent ones are skipped with
// a warning (the caller refused them unless --skip-broken-bitmaps).
Status CopyBitmaps(block::Device& src, qcow2::Image& dst,
                   const std::vector<qcow2::BitmapInfo>& list) {
  // qemu-img walks the bitmaps last-loaded first, so it warns in reverse
  // directory order; it creates them so the directory keeps the source's.
  for (auto it = list.rbegin(); it != list.rend(); ++it) {
    if (!it->consistent()) PrintWarning("Skipping inconsistent bitmap '" + it->name + "'");
  }
  for (const qcow2::BitmapInfo& b : list) {
    if (!b.consistent()) continue;
    qcow2::BitmapAddOptions add;
    add.name = b.name;
    add.granularity_bits = b.granularity_bits;
    add.enabled = b.enabled;  // nothing writes the data any more
    Status s = qcow2::AddBitmap(dst, add);
    if (!s.ok()) return s.WithContext("Failed to create bitmap " + b.name);
    Result<BitVector> bits = qcow2::ReadBitmap(src, b.name);
    if (bits && bits->NextSet(0) < bits->size()) {
      s = qcow2::MergeIntoBitmap(dst, b.name, *bits, b.granularity_bits);
    } else if (!bits) {
      s = bits.error();
    }
    if (!s.ok()) return s.WithContext("Failed to populate bitmap " + b.name);
  }
  return Status::Ok();
}

class ConvertCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand("convert", "Copy an image into a new one (any format)");
    sub->add_option("-f", src_format_, "Source format (default: probe)");
    sub->add_option("-O", dst_format_, "Destination format: raw (default) or qcow2")
        ->check(CLI::IsMember({"qcow2", "raw"}));
    sub->add_option("-o", option_strings_, "Destination format options key=value,...")
        ->allow_extra_args(false);
    sub->add_flag("-c", compress_, "Compress the destination (qcow2)");
    sub->add_flag("-p", progress_, "Show progress");
    sub->add_flag("-q", quiet_, "Quiet (no progress)");
    sub->add_option("-B", backing_, "Backing file of the destination (data the source's "
                                    "backing chain holds is not copied)");
    sub->add_option("-F", backing_format_, "Format of the -B backing file");
    sub->add_flag("-U,--force-share", force_share_, "Read the source even while another process writes it (ignores its lock)");
    sub->add_flag("--bitmaps", bitmaps_,
                  "Copy the persistent bitmaps of a qcow2 source into the qcow2 destination");
    sub->add_flag("--skip-broken-bitmaps", skip_broken_bitmaps_,
                  "With --bitmaps: skip inconsistent (in_use) bitmaps instead of failing");
    sub->add_option("source", src_file_, "Source image")->required();
    sub->add_option("destination", dst_file_, "Destination image (created)")->required();
    return sub;
  }

  Result<Outcome> Run() override {
    if (skip_broken_bitmaps_ && !bitmaps_) {
      return Status::InvalidArgument("Use of --skip-broken-bitmaps requires --bitmaps");
    }
    block::OpenOptions src_options;
    src_options.format = src_format_;
    src_options.read_only = true;
    src_options.force_share = force_share_;
    TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> src, block::Open(src_file_, src_options));
    TD_RETURN_IF_ERROR(RefuseSameFile());
    if (compress_ && dst_format_ != "qcow2") {
      return Status::InvalidArgument("compression (-c) needs -O qcow2");
    }
    if (bitmaps_) TD_RETURN_IF_ERROR(CheckSourceBitmaps(*src));

    CreatePlan plan;
    plan.format = dst_format_;
    TD_RETURN_IF_ERROR(ApplyCreateOptions(plan, option_strings_));
    // Refused before the destination exists (qemu-img leaves it behind).
    if (bitmaps_ && (plan.format != "qcow2" || plan.qcow2.version < 3)) {
      return Status::NotSupported("Format driver '" + plan.format +
                                  "' does not support bitmaps");
    }
    plan.size = src->size();
    plan.have_size = true;
    if (!backing_.empty()) {
      if (dst_format_ != "qcow2") return Status::InvalidArgument("-B needs -O qcow2");
      plan.backing_file = backing_;
      plan.backing_format = backing_format_;
      if (plan.backing_format.empty()) {
        TD_ASSIGN_OR_RETURN(plan.backing_format,
                            block::ProbeFormat(block::ResolveBackingName(dst_file_, backing_)));
      }
    }
    const bool dst_export = nbdclient::IsNbdUri(dst_file_);
    if (!block::IsUriName(dst_file_) && !nbdclient::UriScheme(dst_file_).empty()) {
      // As qemu-img does, "scheme://" names a protocol, never a new file.
      return Status::InvalidArgument(nbdclient::UnknownProtocolMessage(dst_file_));
    }
    TD_RETURN_IF_ERROR(dst_export ? CreateOnExport(dst_file_, plan, src.get())
                                   : CreateImageFile(dst_file_, plan));

    Status s = Copy(*src, !plan.backing_file.empty());
    if (!s.ok()) {
      if (!dst_export) RemoveCreatedImage(dst_file_);
      return s;
    }
    (void)src->Close();
    return Outcome::kSuccess;
  }

 private:
  Status RefuseSameFile() const {
    if (nbdclient::IsNbdUri(src_file_) && src_file_ == dst_file_) {
      return Status::InvalidArgument("source and destination are the same export: " + dst_file_);
    }
    // One pool and image is one image, whatever the query says.
    auto src_rados = io::ParseRadosName(src_file_);
    auto dst_rados = io::ParseRadosName(dst_file_);
    if (src_rados && dst_rados && src_rados->ToString() == dst_rados->ToString()) {
      return Status::InvalidArgument("source and destination are the same image: " + dst_file_);
    }
    struct stat a {}, b {};
    if (::stat(src_file_.c_str(), &a) == 0 && ::stat(dst_file_.c_str(), &b) == 0 &&
        a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
      return Status::InvalidArgument("source and destination are the same file: " + dst_file_);
    }
    return Status::Ok();
  }

  // --bitmaps on the source: it must be able to hold bitmaps, and each must
  // be consistent unless --skip-broken-bitmaps; keeps the list for Copy.
  Status CheckSourceBitmaps(block::Device& src) {
    auto* image = dynamic_cast<qcow2::Image*>(&src);
    if (image == nullptr || image->header().version < 3) {
      return Status::NotSupported("Source lacks bitmap support");
    }
    TD_ASSIGN_OR_RETURN(src_bitmaps_, qcow2::ListBitmaps(src));
    if (skip_broken_bitmaps_) return Status::Ok();
    // Reported in qemu-img's order (see CopyBitmaps).
    for (auto it = src_bitmaps_.rbegin(); it != src_bitmaps_.rend(); ++it) {
      if (!it->consistent()) {
        return Status::Corrupt("Cannot copy inconsistent bitmap '" + it->name +
                               "'\nTry --skip-broken-bitmaps, or use 'thindisk bitmap --remove' "
                               "to delete it");
      }
    }
    return Status::Ok();
  }

  Status Copy(block::Device& src, bool target_has_backing) {
    block::OpenOptions dst_options;
    dst_options.format = dst_format_;
    TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> dst, block::Open(dst_file_, dst_options));
    Progress progress(progress_ && !quiet_);
    BackgroundWriteback writeback(dst_file_);
    Converter converter(src, *dst, target_has_backing, progress, &writeback);
    progress.Update(0, src.size());
    TD_RETURN_IF_ERROR(compress_ ? converter.CopyCompressed() : converter.CopyPlain());
    progress.Update(src.size(), src.size());
    progress.Finish();
    Status written_back = writeback.Finish();
    if (bitmaps_ && written_back.ok()) {
      auto* image = dynamic_cast<qcow2::Image*>(dst.get());
      if (image == nullptr) return Status::Internal("--bitmaps: the destination is not qcow2");
      TD_RETURN_IF_ERROR(CopyBitmaps(src, *image, src_bitmaps_));
    }
    TD_RETURN_IF_ERROR(dst->Close());
    return written_back;
  }

  std::string src_format_;
  std::string dst_format_ = "raw";
  std::vector<std::string> option_strings_;
  bool compress_ = false;
  bool progress_ = false;
  bool quiet_ = false;
  std::string backing_;
  std::string backing_format_;
  bool force_share_ = false;
  bool bitmaps_ = false;
  bool skip_broken_bitmaps_ = false;
  std::vector<qcow2::BitmapInfo> src_bitmaps_;  // --bitmaps: the source's, in order
  std::string src_file_;
  std::string dst_file_;
};

}  // namespace

std::unique_ptr<Subcommand> NewConvertCommand() { return std::make_unique<ConvertCommand>(); }

}  // namespace thindisk::cli
