// thindisk measure: the file size a conversion (or creation) produces, as
// `qemu-img measure` reports it ("required size", "fully allocated size").
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "block/open.h"
#include "cli/common.h"
#include "cli/image_create.h"
#include "cli/image_opts.h"
#include "cli/serve_options.h"
#include "qcow2/bitmaps.h"
#include "qcow2/image.h"
#include "qcow2/measure.h"

namespace thindisk::cli {
namespace {

constexpr const char* kMeasureHelp =
    "For -O qcow2 the required size is exact for what `thindisk convert -O qcow2`\n"
    "(with the same -o options) writes: the conversion is replayed through the\n"
    "engine without storing data, so the source's allocated data is read.\n"
    "qemu-img measure counts metadata for the whole virtual size and so reports\n"
    "more. With preallocation or a backing_file option every cluster is counted.\n"
    "For -O raw (the default, as in qemu-img) both sizes are the virtual size.\n"
    "With -O qcow2 (compat 1.1) and a qcow2 source, \"bitmaps\" is what the\n"
    "source's persistent bitmaps take (`convert --bitmaps`), counted as qemu-img\n"
    "does: every bitmap whole, its table and the directory; not part of required.";

class MeasureCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand("measure", "Size a conversion or new image would take");
    sub->footer(kMeasureHelp);
    sub->add_option("-O", dst_format_, "Output format: raw (default) or qcow2")
        ->check(CLI::IsMember({"qcow2", "raw"}));
    sub->add_option("-o", option_strings_, "Output format options key=value,...")
        ->allow_extra_args(false);
    sub->add_option("-f", src_format_, "Source format (default: probe)");
    sub->add_flag("--image-opts", image_opts_, kImageOptsHelp);
    sub->add_option("--size", size_text_, "Measure a new image of this size instead of a file");
    load_snapshot_option_ = sub->add_option(
        "-l", load_snapshot_,
        "Measure this internal snapshot of the (qcow2) source instead of its "
        "active content: snapshot.id=ID,snapshot.name=NAME or ID_OR_NAME (its "
        "bitmaps are not counted: convert -l copies none)");
    sub->add_option("--output", output_, "Output format: human or json")
        ->check(CLI::IsMember({"human", "json"}));
    sub->add_flag("-U,--force-share", force_share_, "Read even while another process writes the image (ignores its lock)");
    sub->add_option("filename", filename_, "Source image");
    return sub;
  }

  Result<Outcome> Run() override {
    if (load_snapshot_option_->count() > 0 && filename_.empty()) {
      return Status::InvalidArgument(
          "-l names a snapshot of a source image: give its filename");
    }
    if (filename_.empty() == size_text_.empty()) {
      return Status::InvalidArgument(filename_.empty()
                                         ? "either --size N or one filename must be given"
                                         : "--size N cannot be used together with a filename");
    }
    CreatePlan plan;
    plan.format = dst_format_;
    TD_RETURN_IF_ERROR(ApplyCreateOptions(plan, option_strings_));
    std::unique_ptr<block::Device> src;
    uint64_t size = 0;
    if (!filename_.empty()) {
      ImageWindow window;
      if (image_opts_) {
        TD_RETURN_IF_ERROR(ApplyImageOpts(&filename_, &src_format_, "-f", nullptr,
                                          "thindisk measure", ImageUse::kRead, &window));
      }
      block::OpenOptions options;
      options.format = src_format_;
      options.read_only = true;
      options.force_share = force_share_;
      if (load_snapshot_option_->count() > 0) {
        TD_ASSIGN_OR_RETURN(options.snapshot, ParseLoadSnapshot(load_snapshot_, "-l"));
      }
      TD_ASSIGN_OR_RETURN(src, block::Open(filename_, options));
      TD_ASSIGN_OR_RETURN(src, OpenWindow(filename_, std::move(src), window));
      size = src->size();
    } else {
      TD_ASSIGN_OR_RETURN(size, ParseSize(size_text_));
    }

    qcow2::MeasureResult r;
    std::optional<uint64_t> bitmaps;
    if (dst_format_ == "raw") {
      // A raw file's size is its virtual size, allocated or not.
      r.required = r.fully_allocated = src ? size : (size + 511) / 512 * 512;
    } else {
      qcow2::CreateOptions o = plan.qcow2;
      o.size = (size + 511) / 512 * 512;
      o.backing_file = plan.backing_file;
      o.backing_format = plan.backing_format;
      auto measured = qcow2::Measure(src.get(), o);
      if (!measured) return measured.error().WithContext(filename_.empty() ? "measure" : filename_);
      r = *measured;
      // As qemu-img: the source's bitmaps are counted when both it and the
      // target can hold persistent ones (what `convert --bitmaps` copies);
      // "bitmaps" is then reported even when there are none. Not for a
      // snapshot (-l): convert -l copies no bitmaps (qemu-img counts the
      // active image's).
      auto* image = dynamic_cast<qcow2::Image*>(src.get());
      if (o.version >= 3 && image != nullptr && image->header().version >= 3 &&
          load_snapshot_option_->count() == 0) {
        auto list = qcow2::ListBitmaps(*image);
        if (!list) return list.error().WithContext(filename_);
        bitmaps = qcow2::MeasureBitmaps(*list, size, o.cluster_size);
      }
    }
    if (src) (void)src->Close();
    Print(r, bitmaps);
    return Outcome::kSuccess;
  }

 private:
  void Print(const qcow2::MeasureResult& r, std::optional<uint64_t> bitmaps) const {
    if (output_ == "json") {
      // qemu-img's key order: "bitmaps" first.
      nlohmann::ordered_json j;
      if (bitmaps) j["bitmaps"] = *bitmaps;
      j["required"] = r.required;
      j["fully-allocated"] = r.fully_allocated;
      std::cout << j.dump(4) << "\n";
      return;
    }
    std::printf("required size: %llu\nfully allocated size: %llu\n",
                static_cast<unsigned long long>(r.required),
                static_cast<unsigned long long>(r.fully_allocated));
    if (bitmaps) std::printf("bitmaps size: %llu\n", static_cast<unsigned long long>(*bitmaps));
  }

  std::string dst_format_ = "raw";
  std::vector<std::string> option_strings_;
  std::string src_format_;
  bool image_opts_ = false;
  std::string size_text_;
  std::string load_snapshot_;  // -l as given
  CLI::Option* load_snapshot_option_ = nullptr;
  std::string output_ = "human";
  bool force_share_ = false;
  std::string filename_;
};

}  // namespace

std::unique_ptr<Subcommand> NewMeasureCommand() { return std::make_unique<MeasureCommand>(); }

}  // namespace thindisk::cli
