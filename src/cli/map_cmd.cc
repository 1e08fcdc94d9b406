// thindisk map: where a guest's bytes live, as qemu-img map prints it.
#include <CLI/CLI.hpp>
#include <cinttypes>
#include <cstdio>

#include "block/open.h"
#include "cli/common.h"
#include "cli/image_opts.h"
#include "qcow2/image.h"

namespace thindisk::cli {
namespace {

// qemu-img map's rule for joining neighbours into one line.
bool Mergeable(const block::Extent& a, const block::Extent& b) {
  if (a.length == 0) return false;
  if (a.zero != b.zero || a.data != b.data || a.depth != b.depth || a.present != b.present ||
      a.has_host_offset != b.has_host_offset) {
    return false;
  }
  return !a.has_host_offset || a.host_offset + a.length == b.host_offset;
}

// The file name of the layer `depth` steps down the chain from `top`.
std::string LayerFilename(block::Device* top, uint32_t depth) {
  block::Device* dev = top;
  for (uint32_t d = 0; d < depth && dev != nullptr; ++d) {
    auto* image = dynamic_cast<qcow2::Image*>(dev);
    dev = image ? image->backing() : nullptr;
  }
  return dev ? dev->info().filename : top->info().filename;
}

class MapPrinter {
 public:
  MapPrinter(bool json, block::Device* top) : json_(json), top_(top) {}

  Status Begin() {
    if (json_) {
      std::printf("[");
    } else {
      std::printf("%-16s%-16s%-16s%s\n", "Offset", "Length", "Mapped to", "File");
    }
    return Status::Ok();
  }

  // Adds the next extent; prints the previous run when it can't be joined.
  Status Add(const block::Extent& e) {
    if (have_ && Mergeable(pending_, e)) {
      pending_.length += e.length;
      return Status::Ok();
    }
    if (have_) TD_RETURN_IF_ERROR(Print(pending_, /*more=*/true));
    pending_ = e;
    have_ = true;
    return Status::Ok();
  }

  Status End() {
    if (have_) TD_RETURN_IF_ERROR(Print(pending_, /*more=*/false));
    if (json_) std::printf("]\n");
    return Status::Ok();
  }

 private:
  Status Print(const block::Extent& e, bool more) {
    if (json_) {
      std::printf("{ \"start\": %" PRIu64 ", \"length\": %" PRIu64 ", \"depth\": %" PRIu32
                  ", \"present\": %s, \"zero\": %s, \"data\": %s",
                  e.offset, e.length, e.depth, e.present ? "true" : "false",
                  e.zero ? "true" : "false", e.data ? "true" : "false");
      if (e.has_host_offset) std::printf(", \"offset\": %" PRIu64, e.host_offset);
      std::printf("}");
      if (more) std::printf(",\n");
      return Status::Ok();
    }
    if (!e.data) return Status::Ok();
    if (!e.has_host_offset) {
      return Status::NotSupported("file contains compressed clusters; use --output=json");
    }
    std::printf("%#-16" PRIx64 "%#-16" PRIx64 "%#-16" PRIx64 "%s\n", e.offset, e.length,
                e.host_offset, LayerFilename(top_, e.depth).c_str());
    return Status::Ok();
  }

  bool json_;
  block::Device* top_;
  bool have_ = false;
  block::Extent pending_;
};

class MapCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand("map", "Show where the guest's data is stored");
    sub->add_option("-f,--format", format_, "Image format (default: probe)");
    sub->add_flag("--image-opts", image_opts_, kImageOptsHelp);
    sub->add_option("--output", output_, "Output format: human or json")
        ->check(CLI::IsMember({"human", "json"}));
    sub->add_option("-s,--start-offset", start_text_, "First guest offset to map");
    sub->add_option("-l,--max-length", length_text_, "Bytes to map");
    sub->add_flag("-U,--force-share", force_share_, "Read even while another process writes the image (ignores its lock)");
    sub->add_option("filename", filename_, "Image file")->required();
    return sub;
  }

  Result<Outcome> Run() override {
    if (image_opts_) {
      TD_RETURN_IF_ERROR(ApplyImageOpts(&filename_, &format_, "-f", nullptr,
                                        "thindisk map", ImageUse::kRead));
    }
    block::OpenOptions options;
    options.format = format_;
    options.read_only = true;
    options.force_share = force_share_;
    TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> dev, block::Open(filename_, options));
    uint64_t size = dev->size();
    uint64_t start = 0;
    uint64_t end = size;
    if (!start_text_.empty()) {
      TD_ASSIGN_OR_RETURN(start, ParseSize(start_text_));
    }
    if (!length_text_.empty()) {
      TD_ASSIGN_OR_RETURN(uint64_t length, ParseSize(length_text_));
      end = length > size - std::min(start, size) ? size : start + length;
    }
    MapPrinter printer(output_ == "json", dev.get());
    TD_RETURN_IF_ERROR(printer.Begin());
    for (uint64_t offset = start; offset < end;) {
      TD_ASSIGN_OR_RETURN(block::Extent e, dev->GetStatus(offset, end - offset));
      if (e.length == 0) return Status::Internal("block status returned an empty extent");
      e.length = std::min(e.length, end - offset);
      TD_RETURN_IF_ERROR(printer.Add(e));
      offset += e.length;
    }
    TD_RETURN_IF_ERROR(printer.End());
    return Outcome::kSuccess;
  }

 private:
  std::string format_;
  bool image_opts_ = false;
  std::string output_ = "human";
  std::string start_text_;
  std::string length_text_;
  bool force_share_ = false;
  std::string filename_;
};

}  // namespace

std::unique_ptr<Subcommand> NewMapCommand() { return std::make_unique<MapCommand>(); }

}  // namespace thindisk::cli
