// thindisk resize: grow or shrink an image's virtual size (qemu-img resize).
//
// Growing is instant (unless --preallocation asks for host space); the new
// space reads as zeros (never backing data or bytes cut off by an earlier
// shrink). Shrinking needs --shrink and, unlike
// qemu-img, refuses while the cut-off range holds data in this image: the
// error names the range. --force drops that data, after a warning naming it.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <vector>

#include "block/open.h"
#include "cli/common.h"
#include "cli/image_create.h"
#include "cli/image_opts.h"
#include "qcow2/image.h"
#include "raw/raw_image.h"

namespace thindisk::cli {
namespace {

constexpr const char* kResizeHelp =
    "SIZE is absolute, or relative with a leading + or - (use '--' before a\n"
    "negative size: resize FILE -- -1G). Growing is instant and the new space\n"
    "reads as zeros. Shrinking needs --shrink, and is refused while the range\n"
    "past the new end holds data in this image (the error names it); --force\n"
    "discards that data, with a warning naming it. Shrinking frees the clusters\n"
    "past the new end and truncates the host file. qcow2 sizes must be a\n"
    "multiple of 512. --preallocation applies to the grown part: raw images\n"
    "take off, falloc and full; qcow2 images take off, metadata (host clusters\n"
    "mapped for the grown range), falloc (also reserved) and full (also written\n"
    "with zeros). The grown part reads as zeros in every mode; shrinking with\n"
    "a preallocation mode other than off is refused.";

// Reads at most this much at a time while looking for non-zero bytes.
constexpr uint64_t kScanChunk = 1ull << 20;

std::string Hex(uint64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

bool IsOwnData(const block::Extent& e) { return e.depth == 0 && e.data && !e.zero; }

// The range [first non-zero byte, end of the last extent holding one) of
// data this image itself stores in [from, to); {0, 0} when there is none.
Result<std::pair<uint64_t, uint64_t>> FindOwnData(block::Device& dev, uint64_t from,
                                                  uint64_t to) {
  std::pair<uint64_t, uint64_t> found{0, 0};
  std::vector<uint8_t> buf;
  for (uint64_t pos = from; pos < to;) {
    TD_ASSIGN_OR_RETURN(block::Extent e, dev.GetStatus(pos, to - pos));
    if (e.length == 0) return Status::Internal("block status returned an empty extent");
    uint64_t end = std::min(to, pos + e.length);
    for (uint64_t p = pos; IsOwnData(e) && p < end;) {
      uint64_t n = std::min(kScanChunk, end - p);
      buf.resize(n);
      TD_RETURN_IF_ERROR(dev.Read(p, buf));
      auto nz = std::find_if(buf.begin(), buf.end(), [](uint8_t b) { return b != 0; });
      if (nz != buf.end()) {
        if (found.second == 0) found.first = p + uint64_t(nz - buf.begin());
        found.second = end;
        break;
      }
      p += n;
    }
    pos = end;
  }
  return found;
}

// Discards what this image itself maps in [from, to) (not what shows
// through from a backing file), so the engine frees it.
Status DiscardOwn(block::Device& dev, uint64_t from, uint64_t to) {
  for (uint64_t pos = from; pos < to;) {
    TD_ASSIGN_OR_RETURN(block::Extent e, dev.GetStatus(pos, to - pos));
    if (e.length == 0) return Status::Internal("block status returned an empty extent");
    uint64_t end = std::min(to, pos + e.length);
    if (e.depth == 0 && e.present) TD_RETURN_IF_ERROR(dev.Discard(pos, end - pos));
    pos = end;
  }
  return Status::Ok();
}

Status WriteZeroBytes(block::Device& dev, uint64_t from, uint64_t to) {
  std::vector<uint8_t> zeros(std::min(kScanChunk, to - from), 0);
  for (uint64_t pos = from; pos < to;) {
    uint64_t n = std::min<uint64_t>(zeros.size(), to - pos);
    TD_RETURN_IF_ERROR(dev.Write(pos, std::span<const uint8_t>(zeros.data(), n)));
    pos += n;
  }
  return Status::Ok();
}

class ResizeCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand("resize", "Grow or shrink an image's virtual size");
    sub->footer(kResizeHelp);
    sub->add_option("-f,--format", format_, "Image format (default: probe)")
        ->check(CLI::IsMember({"qcow2", "raw"}));
    sub->add_flag("--image-opts", image_opts_, kImageOptsHelp);
    sub->add_flag("--shrink", shrink_, "Allow shrinking");
    sub->add_flag("--force", force_, "With --shrink: discard data past the new end");
    sub->add_option("--preallocation", preallocation_, "Preallocation of the grown part")
        ->check(CLI::IsMember({"off", "metadata", "falloc", "full"}));
    sub->add_flag("-q,--quiet", quiet_, "Do not print 'Image resized.'");
    sub->add_option("filename", filename_, "Image file")->required();
    sub->add_option("size", size_text_, "[+|-]SIZE (k, M, G, T suffixes)")->required();
    return sub;
  }

  Result<Outcome> Run() override {
    if (image_opts_) {
      TD_RETURN_IF_ERROR(ApplyImageOpts(&filename_, &format_, "-f", nullptr,
                                        "thindisk resize", ImageUse::kWrite));
    }
    block::OpenOptions options;
    options.format = format_;
    TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> dev, block::Open(filename_, options));
    const uint64_t old_size = dev->size();
    TD_ASSIGN_OR_RETURN(uint64_t new_size, NewSize(old_size));
    const bool is_qcow2 = dev->info().format == "qcow2";
    if (is_qcow2 && new_size % 512 != 0) {
      return Status::InvalidArgument("the new size must be a multiple of 512 for qcow2 (got " +
                                     std::to_string(new_size) + ")");
    }
    if (new_size < old_size) {
      TD_RETURN_IF_ERROR(Shrink(*dev, old_size, new_size));
    } else if (new_size > old_size) {
      TD_RETURN_IF_ERROR(Grow(*dev, old_size, new_size));
    }
    TD_RETURN_IF_ERROR(dev->Close());
    if (!quiet_) std::printf("Image resized.\n");
    return Outcome::kSuccess;
  }

 private:
  Result<uint64_t> NewSize(uint64_t old_size) const {
    std::string_view text = size_text_;
    char sign = 0;
    if (!text.empty() && (text[0] == '+' || text[0] == '-')) {
      sign = text[0];
      text.remove_prefix(1);
    }
    TD_ASSIGN_OR_RETURN(uint64_t n, ParseSize(text));
    if (sign == '-') {
      if (n > old_size) {
        return Status::InvalidArgument("cannot shrink by " + std::to_string(n) +
                                       " bytes: the image has only " + std::to_string(old_size));
      }
      return old_size - n;
    }
    if (sign == '+') {
      if (n > UINT64_MAX - old_size) return Status::InvalidArgument("new size overflows");
      return old_size + n;
    }
    return n;
  }

  Status Shrink(block::Device& dev, uint64_t old_size, uint64_t new_size) {
    if (!shrink_) {
      return Status::InvalidArgument(
          "shrinking " + filename_ + " from " + std::to_string(old_size) + " to " +
          std::to_string(new_size) + " bytes needs --shrink");
    }
    if (preallocation_ != "off" && !preallocation_.empty()) {
      return Status::InvalidArgument("preallocation cannot be used when shrinking an image");
    }
    TD_ASSIGN_OR_RETURN(auto data, FindOwnData(dev, new_size, old_size));
    if (data.second != 0) {
      std::string range = "guest range [" + Hex(data.first) + ", " + Hex(data.second) + ")";
      if (!force_) {
        return Status::InvalidArgument("cannot shrink " + filename_ + " to " +
                                       std::to_string(new_size) + " bytes: " + range +
                                       " past the new end holds data; discard it first, or add "
                                       "--force to drop it");
      }
      PrintWarning("--force: dropping the data in " + range + " of " + filename_);
    }
    if (dev.info().format == "qcow2") TD_RETURN_IF_ERROR(DiscardOwn(dev, new_size, old_size));
    return dev.Resize(new_size, true);
  }

  Status Grow(block::Device& dev, uint64_t old_size, uint64_t new_size) {
    const std::string mode = preallocation_.empty() ? "off" : preallocation_;
    if (auto* image = dynamic_cast<qcow2::Image*>(&dev)) {
      TD_ASSIGN_OR_RETURN(qcow2::Preallocation qcow2_mode, ParseQcow2Prealloc(mode));
      std::string warning;
      TD_RETURN_IF_ERROR(image->GrowPreallocated(new_size, qcow2_mode, &warning));
      if (!warning.empty()) PrintWarning(warning);
      return Status::Ok();
    }
    auto* raw = dynamic_cast<raw::RawImage*>(&dev);
    if (mode != "off" && (raw == nullptr || mode == "metadata")) {
      return Status::NotSupported("preallocation=" + mode + " is not supported when growing " +
                                  dev.info().format + " images (use off" +
                                  (raw ? ", falloc or full)" : ")"));
    }
    TD_RETURN_IF_ERROR(dev.Resize(new_size));
    if (mode == "falloc") {
      Status s = raw->storage().Allocate(old_size, new_size - old_size);
      if (s.ok()) return s;
      if (s.code() != Code::kNotSupported) return s;
      PrintWarning(filename_ + ": the host cannot reserve space (" + s.message() +
                   "); writing zeros instead (preallocation=full)");
    }
    if (mode == "falloc" || mode == "full") return WriteZeroBytes(dev, old_size, new_size);
    return Status::Ok();
  }

  std::string format_;
  bool image_opts_ = false;
  bool shrink_ = false;
  bool force_ = false;
  std::string preallocation_;
  bool quiet_ = false;
  std::string filename_;
  std::string size_text_;
};

}  // namespace

std::unique_ptr<Subcommand> NewResizeCommand() { return std::make_unique<ResizeCommand>(); }

}  // namespace thindisk::cli
