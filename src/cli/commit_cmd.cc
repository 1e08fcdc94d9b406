// thindisk commit: fold an overlay's data into an image below it, as
// qemu-img commit does.
//
// Order, for crash safety: (1) every range the layers above BASE store is
// copied into BASE (data, or zeros for zero-allocated ranges) and BASE is
// flushed and closed; (2) only then is the overlay emptied with
// qcow2::Image::Deallocate, which makes its ranges unallocated (reads fall
// through to the updated BASE). A crash during (1) leaves BASE consistent
// with each range old or new and the overlay untouched, so the guest view
// through the overlay is unchanged; a crash during (2) leaves ranges that
// read the same from the overlay or from BASE.
//
// As in qemu-img, -b implies -d: the layers between the top and BASE no
// longer describe a consistent disk, so the top stays as it is.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <optional>
#include <vector>

#include "block/open.h"
#include "cli/chain_ops.h"
#include "cli/common.h"
#include "cli/image_opts.h"
#include "cli/image_summary.h"
#include "cli/serve_options.h"
#include "io/qemu_lock.h"

namespace thindisk::cli {
namespace {

class CommitCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub =
        app.add_subcommand("commit", "Fold an overlay's changes into its backing image");
    sub->add_option("-f,--format", format_, "Format of the overlay (default: probe)");
    sub->add_flag("--image-opts", image_opts_, kImageOptsHelp);
    sub->add_option("-b", base_, "Commit into this image of the chain (implies -d)");
    sub->add_flag("-d", drop_, "Leave the overlay as it is (do not empty it)");
    sub->add_flag("-p,--progress", progress_, "Show progress");
    sub->add_flag("-q,--quiet", quiet_, "Print nothing on success");
    sub->add_option("-r", rate_limit_text_,
                    "Read the overlay's data at most this many bytes per second (k, M, G "
                    "suffixes); 0: no limit");
    sub->add_option(
        "-t", cache_,
        std::string("Cache mode of the overlay and the base: ") + kCacheModesHelp);
    sub->add_option("filename", filename_, "Overlay image")->required();
    return sub;
  }

  Result<Outcome> Run() override {
    if (image_opts_) {
      TD_RETURN_IF_ERROR(ApplyImageOpts(&filename_, &format_, "-f", &cache_,
                                        "thindisk commit", ImageUse::kWrite));
    }
    TD_ASSIGN_OR_RETURN(std::unique_ptr<RateLimit> rate_limit,
                        ParseRateLimit(rate_limit_text_));
    TD_ASSIGN_OR_RETURN(CacheChoice cache, ParseCacheMode(cache_, "-t"));
    // 1. The chain, and which layer receives the data.
    TD_ASSIGN_OR_RETURN(std::vector<ImageSummary> chain, ReadBackingChain(filename_, format_));
    if (chain.size() < 2) {
      return Status::InvalidArgument(filename_ + ": image does not have a backing file");
    }
    size_t base_index = 1;
    if (!base_.empty()) {
      TD_ASSIGN_OR_RETURN(base_index, FindLayer(chain, base_));
      drop_ = true;
    }
    const ImageSummary& base_summary = chain[base_index];

    // 2. Open BASE for writing first, so the read-only view of it inside
    //    the top's chain sees its header as this handle left it. The locks
    //    are qemu's for a commit: BASE and the top (unless -d) as writers,
    //    the layers between them as readers. The top's own chain takes no
    //    locks: they would clash with the write lock this process holds on
    //    BASE.
    block::OpenOptions base_options;
    base_options.format = base_summary.format;
    base_options.cache = cache.mode;
    TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> base,
                        block::Open(base_summary.filename, base_options));
    std::vector<std::optional<io::QemuImageLock>> between;
    for (size_t i = 1; i < base_index; ++i) {
      TD_ASSIGN_OR_RETURN(auto lock, block::LockImage(chain[i].filename, io::QemuLockMode::kRead));
      between.push_back(std::move(lock));
    }
    block::OpenOptions top_options;
    top_options.format = chain.front().format;
    top_options.cache = cache.mode;
    top_options.read_only = drop_;
    top_options.lock_backing = false;
    TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> top, block::Open(filename_, top_options));

    // 3. List what the layers above BASE store, copy it into BASE, make BASE
    //    durable, and only then empty the overlay.
    Progress progress(progress_ && !quiet_);
    TD_RETURN_IF_ERROR(CommitInto(*top, *base, static_cast<uint32_t>(base_index), !drop_,
                                  progress, rate_limit.get()));
    TD_RETURN_IF_ERROR(top->Close());
    progress.Finish();
    if (!quiet_) std::printf("Image committed.\n");
    return Outcome::kSuccess;
  }

 private:
  std::string format_;
  bool image_opts_ = false;
  std::string base_;
  bool drop_ = false;
  bool progress_ = false;
  bool quiet_ = false;
  std::string cache_ = "writeback";  // -t
  std::string rate_limit_text_;
  std::string filename_;
};

}  // namespace

std::unique_ptr<Subcommand> NewCommitCommand() { return std::make_unique<CommitCommand>(); }

}  // namespace thindisk::cli
