// thindisk compare: do two images show the guest the same bytes?
// qemu-img compare's rules: exit 0 identical, 1 different, 2 error; a size
// difference is a difference only if the larger image's tail holds non-zero
// bytes (or with -s).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <vector>

#include "block/open.h"
#include "cli/common.h"
#include "cli/image_opts.h"
#include "cli/serve_options.h"

namespace thindisk::cli {
namespace {

// Bytes compared per step: large enough to stream, small enough to hold two.
constexpr uint64_t kChunk = 1ull << 20;
// qemu-img reports mismatches at 512-byte sector granularity.
constexpr uint64_t kReportGrain = 512;

uint64_t ReportOffset(uint64_t chunk_start, uint64_t index) {
  uint64_t at = chunk_start + index;
  return std::max(chunk_start, at - at % kReportGrain);
}

// Index of the first byte that differs, or size if none.
size_t FirstDifference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, size_t size) {
  auto [pa, pb] = std::mismatch(a.begin(), a.begin() + static_cast<ptrdiff_t>(size), b.begin());
  return static_cast<size_t>(pa - a.begin());
}

class CompareCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand("compare", "Compare the guest-visible content of two images");
    sub->footer("Exit status: 0 identical, 1 different, 2 error.");
    sub->add_option("-f", format1_, "Format of the first image (default: probe)");
    sub->add_option("-F", format2_, "Format of the second image (default: probe)");
    sub->add_flag("--image-opts", image_opts_, kImageOptsHelp);
    sub->add_flag("-s,--strict", strict_, "Different sizes or allocation count as different");
    sub->add_flag("-q,--quiet", quiet_, "Print nothing, only set the exit status");
    sub->add_flag("-p,--progress", progress_, "Show progress");
    sub->add_flag("-U,--force-share", force_share_, "Read even while another process writes the image (ignores its lock)");
    sub->add_option("-T", cache_,
                    std::string("Cache mode of both images: ") + kCacheModesHelp);
    sub->add_option("image1", file1_, "First image")->required();
    sub->add_option("image2", file2_, "Second image")->required();
    return sub;
  }

  ErrorExit error_exit() const override { return ErrorExit::kTwo; }

  Result<Outcome> Run() override {
    ImageWindow window1, window2;
    std::string cache1 = cache_, cache2 = cache_;  // -T, unless a string's cache.* says
    if (image_opts_) {
      TD_RETURN_IF_ERROR(ApplyImageOpts(&file1_, &format1_, "-f", &cache1,
                                        "thindisk compare", ImageUse::kRead, &window1));
      TD_RETURN_IF_ERROR(ApplyImageOpts(&file2_, &format2_, "-F", &cache2,
                                        "thindisk compare", ImageUse::kRead, &window2));
    }
    TD_ASSIGN_OR_RETURN(CacheChoice c1, ParseCacheMode(cache1, "-T"));
    TD_ASSIGN_OR_RETURN(CacheChoice c2, ParseCacheMode(cache2, "-T"));
    block::OpenOptions o1;
    o1.format = format1_;
    o1.read_only = true;
    o1.force_share = force_share_;
    o1.cache = c1.mode;
    block::OpenOptions o2 = o1;
    o2.format = format2_;
    o2.cache = c2.mode;
    TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> a, block::Open(file1_, o1));
    TD_ASSIGN_OR_RETURN(a, OpenWindow(file1_, std::move(a), window1));
    TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> b, block::Open(file2_, o2));
    TD_ASSIGN_OR_RETURN(b, OpenWindow(file2_, std::move(b), window2));
    uint64_t common = std::min(a->size(), b->size());
    uint64_t total = std::max(a->size(), b->size());
    if (a->size() != b->size()) {
      if (strict_) return Differ("Strict mode: Image size mismatch!");
      Say("Warning: Image size mismatch!");
    }
    Progress progress(progress_);
    buf1_.resize(kChunk);
    buf2_.resize(kChunk);
    for (uint64_t offset = 0; offset < common;) {
      TD_ASSIGN_OR_RETURN(block::Extent e1, a->GetStatus(offset, common - offset));
      TD_ASSIGN_OR_RETURN(block::Extent e2, b->GetStatus(offset, e1.length));
      uint64_t n = std::min(e1.length, e2.length);
      if (n == 0) return Status::Internal("block status returned an empty extent");
      if (!(e1.zero && e2.zero)) n = std::min(n, kChunk);  // what one read can hold
      if (strict_ && (e1.data != e2.data || e1.zero != e2.zero)) {
        return Differ("Strict mode: Offset " + std::to_string(offset) + " block status mismatch!");
      }
      if (!(e1.zero && e2.zero)) {
        TD_RETURN_IF_ERROR(a->Read(offset, std::span<uint8_t>(buf1_.data(), n)));
        TD_RETURN_IF_ERROR(b->Read(offset, std::span<uint8_t>(buf2_.data(), n)));
        size_t diff = FirstDifference(buf1_, buf2_, n);
        if (diff != n) return Mismatch(ReportOffset(offset, diff));
      }
      offset += n;
      progress.Update(offset, total);
    }
    if (total > common) {
      block::Device* larger = a->size() > b->size() ? a.get() : b.get();
      TD_ASSIGN_OR_RETURN(bool zero_tail, CheckZeroTail(*larger, common, total, progress));
      if (!zero_tail) return Outcome::kImagesDiffer;
    }
    progress.Finish();
    Say("Images are identical.");
    return Outcome::kSuccess;
  }

 private:
  // Reads [from, to) of `dev`; on the first non-zero byte prints the
  // mismatch and returns false.
  Result<bool> CheckZeroTail(block::Device& dev, uint64_t from, uint64_t to, Progress& progress) {
    for (uint64_t offset = from; offset < to;) {
      TD_ASSIGN_OR_RETURN(block::Extent e, dev.GetStatus(offset, to - offset));
      if (e.length == 0) return Status::Internal("block status returned an empty extent");
      if (!e.zero) {
        e.length = std::min(e.length, kChunk);
        TD_RETURN_IF_ERROR(dev.Read(offset, std::span<uint8_t>(buf1_.data(), e.length)));
        for (uint64_t i = 0; i < e.length; ++i) {
          if (buf1_[i] != 0) {
            (void)Mismatch(ReportOffset(offset, i));
            return false;
          }
        }
      }
      offset += e.length;
      progress.Update(offset, to);
    }
    return true;
  }

  void Say(const std::string& line) {
    if (!quiet_) std::printf("%s\n", line.c_str());
  }
  Outcome Differ(const std::string& line) {
    Say(line);
    return Outcome::kImagesDiffer;
  }
  Outcome Mismatch(uint64_t offset) {
    return Differ("Content mismatch at offset " + std::to_string(offset) + "!");
  }

  std::string format1_;
  bool image_opts_ = false;
  std::string format2_;
  bool strict_ = false;
  bool quiet_ = false;
  bool progress_ = false;
  bool force_share_ = false;
  std::string cache_ = "writeback";  // -T
  std::string file1_;
  std::string file2_;
  std::vector<uint8_t> buf1_;
  std::vector<uint8_t> buf2_;
};

}  // namespace

std::unique_ptr<Subcommand> NewCompareCommand() { return std::make_unique<CompareCommand>(); }

}  // namespace thindisk::cli
