// thindisk rebase: point an image at another backing file, as qemu-img rebase.
//
// Safe mode keeps the guest view identical: wherever the image itself stores
// nothing and the old chain's content differs from the new backing file's,
// the old content is copied into the image (in chunks; only differing
// 512-byte runs are written). The copies are flushed before the header
// switch (qcow2::SetBackingFile, crash-safe), so a crash at any point shows
// the guest the old chain's content. `-u` only rewrites the header; `-b ""`
// copies everything the old chain provides and removes the backing file.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>

#include "block/open.h"
#include "cli/chain_ops.h"
#include "cli/common.h"
#include "cli/image_opts.h"
#include "cli/image_summary.h"
#include "cli/serve_options.h"
#include "io/qemu_lock.h"
#include "io/storage.h"
#include "qcow2/header_update.h"
#include "qcow2/image.h"

namespace thindisk::cli {
namespace {

// qemu-img rebase compares and writes at sector grain.
constexpr uint64_t kGrain = 512;

class RebaseCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand("rebase", "Change the backing file of an image");
    sub->add_option("-f,--format", format_, "Format of the image (default: probe)");
    sub->add_flag("--image-opts", image_opts_, kImageOptsHelp);
    sub->add_option("-b", backing_, "New backing file (\"\" to remove it)")->required();
    sub->add_option("-F", backing_format_, "Format of the new backing file (default: probe)");
    sub->add_flag("-u", unsafe_, "Unsafe: only rewrite the backing file name");
    sub->add_flag("-p,--progress", progress_, "Show progress");
    sub->add_flag("-q,--quiet", quiet_, "Print nothing on success");
    sub->add_option("-t", cache_,
                    std::string("Cache mode of the image: ") + kCacheModesHelp);
    sub->add_option("-T", src_cache_, "Cache mode of the new backing file (as -t)");
    sub->add_option("filename", filename_, "Image to rebase")->required();
    return sub;
  }

  Result<Outcome> Run() override {
    if (image_opts_) {
      TD_RETURN_IF_ERROR(ApplyImageOpts(&filename_, &format_, "-f", &cache_,
                                        "thindisk rebase", ImageUse::kWrite));
    }
    TD_ASSIGN_OR_RETURN(cache_choice_, ParseCacheMode(cache_, "-t"));
    TD_ASSIGN_OR_RETURN(src_cache_choice_, ParseCacheMode(src_cache_, "-T"));
    // qemu's write lock on the image for the whole rebase: it is opened
    // more than once below, and those opens take none on it (the summary's
    // brief read shares, as a -U read would, with the lock we hold).
    TD_ASSIGN_OR_RETURN(auto lock, block::LockImage(filename_, io::QemuLockMode::kWrite));
    TD_ASSIGN_OR_RETURN(ImageSummary image,
                        ReadImageSummary(filename_, format_, /*force_share=*/true));
    if (image.format != "qcow2") {
      return Status::NotSupported(filename_ + ": format '" + image.format +
                                  "' has no backing file to change");
    }
    const std::string new_path = block::ResolveBackingName(filename_, backing_);
    if (!backing_.empty() && backing_format_.empty()) {
      if (unsafe_) {
        return Status::InvalidArgument("Could not change the backing file to '" + backing_ +
                                       "': backing format must be specified with -F");
      }
      auto probed = block::ProbeFormat(new_path);
      if (!probed) {
        return probed.error().WithContext("Could not open new backing file '" + backing_ + "'");
      }
      backing_format_ = *probed;
    }
    if (!backing_.empty())
      TD_RETURN_IF_ERROR(
          RefuseBackingLoop(filename_, backing_, new_path, backing_format_));
    if (!unsafe_) TD_RETURN_IF_ERROR(CopyDifferences(new_path));

    io::OpenOptions io_options;
    io_options.cache = cache_choice_.mode;
    TD_ASSIGN_OR_RETURN(std::unique_ptr<io::Storage> storage,
                        block::OpenStorage(filename_, io_options));
    Status s = qcow2::SetBackingFile(*storage, backing_, backing_format_);
    if (!s.ok()) return s.WithContext("Could not change the backing file to '" + backing_ + "'");
    return Outcome::kSuccess;
  }

 private:
  // Safe mode's copy: old chain content into the image wherever it differs
  // from what the new backing file would show.
  Status CopyDifferences(const std::string& new_path) {
    std::unique_ptr<block::Device> new_base;
    if (!backing_.empty()) {
      block::OpenOptions nb;
      nb.format = backing_format_;
      nb.read_only = true;
      nb.cache = src_cache_choice_.mode;
      auto opened = block::Open(new_path, nb);
      if (!opened) {
        return opened.error().WithContext("Could not open new backing file '" + backing_ + "'");
      }
      new_base = std::move(*opened);
    }
    block::OpenOptions top_options;
    top_options.format = "qcow2";
    top_options.caller_locks_top = true;
    top_options.cache = cache_choice_.mode;
    TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> top, block::Open(filename_, top_options));
    auto* image = dynamic_cast<qcow2::Image*>(top.get());
    if (image == nullptr) return Status::Internal("qcow2 image did not open as qcow2");
    old_backing_size_ = image->backing() ? image->backing()->size() : 0;

    Progress progress(progress_ && !quiet_);
    const uint64_t size = top->size();
    std::vector<uint8_t> old_bytes, new_bytes;
    for (uint64_t offset = 0; offset < size;) {
      TD_ASSIGN_OR_RETURN(block::Extent e, top->GetStatus(offset, std::min(kChainChunk, size - offset)));
      uint64_t n = std::min(e.length, size - offset);
      if (n == 0) return Status::Internal("block status returned an empty extent");
      if (!(e.present && e.depth == 0)) {  // the image's own data stays as it is
        old_bytes.resize(n);
        new_bytes.assign(n, 0);
        TD_RETURN_IF_ERROR(top->Read(offset, old_bytes));
        if (new_base && offset < new_base->size()) {
          uint64_t m = std::min(n, new_base->size() - offset);
          TD_RETURN_IF_ERROR(new_base->Read(offset, std::span<uint8_t>(new_bytes.data(), m)));
        }
        TD_RETURN_IF_ERROR(WriteDifferences(*top, offset, old_bytes, new_bytes));
      }
      offset += n;
      progress.Update(offset, size);
    }
    // The copies are durable before the header names the new backing file.
    TD_RETURN_IF_ERROR(top->Flush());
    TD_RETURN_IF_ERROR(top->Close());
    if (new_base) TD_RETURN_IF_ERROR(new_base->Close());
    progress.Finish();
    return Status::Ok();
  }

  // Writes the runs of 512-byte sectors where `old_bytes` and `new_bytes`
  // differ, with the old content.
  Status WriteDifferences(block::Device& top, uint64_t offset, const std::vector<uint8_t>& old_bytes,
                          const std::vector<uint8_t>& new_bytes) {
    const uint64_t n = old_bytes.size();
    auto differs = [&](uint64_t at) {
      uint64_t len = std::min(kGrain, n - at);
      return !std::equal(old_bytes.begin() + at, old_bytes.begin() + at + len,
                         new_bytes.begin() + at);
    };
    for (uint64_t at = 0; at < n;) {
      if (!differs(at)) {
        at += kGrain;
        continue;
      }
      uint64_t end = at;
      while (end < n && differs(end)) end += kGrain;
      end = std::min(end, n);
      TD_RETURN_IF_ERROR(WriteRun(top, offset + at, {old_bytes.data() + at, end - at}));
      at = end;
    }
    return Status::Ok();
  }

  // Zero runs become zero clusters where the old backing file covers them
  // (the zero flag then holds whatever is below); elsewhere an unallocated
  // range already reads as zeros to the engine, so zeros are written as data.
  Status WriteRun(block::Device& top, uint64_t offset, std::span<const uint8_t> data) {
    bool zero = IsAllZero(data.data(), data.size());
    if (zero && offset + data.size() <= old_backing_size_) {
      return top.WriteZeroes(offset, data.size(), {});
    }
    return top.Write(offset, data);
  }

  std::string format_;
  bool image_opts_ = false;
  std::string backing_;
  std::string backing_format_;
  bool unsafe_ = false;
  bool progress_ = false;
  bool quiet_ = false;
  std::string cache_ = "writeback";      // -t
  std::string src_cache_ = "writeback";  // -T
  CacheChoice cache_choice_;
  CacheChoice src_cache_choice_;
  std::string filename_;
  uint64_t old_backing_size_ = 0;
};

}  // namespace

std::unique_ptr<Subcommand> NewRebaseCommand() { return std::make_unique<RebaseCommand>(); }

}  // namespace thindisk::cli
