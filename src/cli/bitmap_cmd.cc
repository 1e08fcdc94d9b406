// thindisk bitmap: qemu-img bitmap on the persistent dirty bitmaps of a
// qcow2 image (qcow2/bitmaps.h): --add, --remove, --clear, --enable,
// --disable and --merge SOURCE, any number of them, run in the order given
// (as qemu-img does: "--add --disable" adds, then disables); -g GRANULARITY
// with --add, -b SOURCE_IMAGE [-F FMT] with --merge.
#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "block/open.h"
#include "cli/common.h"
#include "cli/image_opts.h"
#include "io/qemu_lock.h"
#include "io/storage.h"
#include "qcow2/bitmaps.h"
#include "qcow2/image.h"

namespace thindisk::cli {
namespace {

enum class Op { kAdd, kRemove, kClear, kEnable, kDisable, kMerge };

const char* OpName(Op op) {
  switch (op) {
    case Op::kAdd: return "add";
    case Op::kRemove: return "remove";
    case Op::kClear: return "clear";
    case Op::kEnable: return "enable";
    case Op::kDisable: return "disable";
    case Op::kMerge: return "merge";
  }
  return "?";
}

struct Action {
  Op op;
  std::string source;  // --merge: the source bitmap's name
};

// Opens a qcow2 image for the bitmap operations: read-write under qemu's
// lock (no qemu process may use it meanwhile), or read-only under the
// shared read lock (a merge's source in another image).
Result<std::unique_ptr<qcow2::Image>> OpenQcow2(const std::string& name, const std::string& format,
                                                bool write) {
  std::string fmt = format;
  if (fmt.empty()) {
    TD_ASSIGN_OR_RETURN(fmt, block::ProbeFormat(name));
  }
  if (fmt != "qcow2") {
    return Status::NotSupported(name + ": this image format (" + fmt +
                                ") cannot hold persistent bitmaps");
  }
  io::OpenOptions io_options;
  io_options.read_only = !write;
  io_options.lock = write ? io::QemuLockMode::kWrite : io::QemuLockMode::kRead;
  TD_ASSIGN_OR_RETURN(std::unique_ptr<io::Storage> storage, block::OpenStorage(name, io_options));
  qcow2::OpenOptions options;
  options.read_only = !write;
  options.no_backing = true;  // bitmaps never read guest data
  TD_ASSIGN_OR_RETURN(std::unique_ptr<qcow2::Image> image,
                      qcow2::Image::Open(std::move(storage), options));
  if (write && image->info().read_only) {
    return Status::ReadOnly(name + ": the image is marked corrupt; repair it first");
  }
  return image;
}

class BitmapCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand(
        "bitmap", "Add, remove, clear, enable, disable or merge persistent dirty bitmaps");
    auto queue = [this](Op op) {
      return [this, op](std::int64_t) { actions_.push_back({op, ""}); };
    };
    // Each action is queued as it is parsed, so they run in command-line order.
    sub->add_flag("--add", queue(Op::kAdd), "Add BITMAP (enabled unless --disable follows)")
        ->trigger_on_parse();
    sub->add_flag("--remove", queue(Op::kRemove), "Remove BITMAP")->trigger_on_parse();
    sub->add_flag("--clear", queue(Op::kClear), "Clear every bit of BITMAP")->trigger_on_parse();
    sub->add_flag("--enable", queue(Op::kEnable), "Track every write in BITMAP")
        ->trigger_on_parse();
    sub->add_flag("--disable", queue(Op::kDisable), "Stop tracking writes in BITMAP")
        ->trigger_on_parse();
    sub->add_option_function<std::vector<std::string>>(
           "--merge",
           [this](const std::vector<std::string>& sources) {
             for (const std::string& s : sources) actions_.push_back({Op::kMerge, s});
           },
           "Set in BITMAP every bit set in bitmap SOURCE (of this image, or of -b's)")
        ->trigger_on_parse()
        ->allow_extra_args(false);
    sub->add_option("-g,--granularity", granularity_,
                    "Bytes per bit of a new bitmap (with --add; default: the cluster size "
                    "within 4k..64k)");
    sub->add_option("-b,--source-file", source_file_, "The image --merge's SOURCE is in");
    sub->add_option("-F,--source-format", source_format_, "Format of -b's image");
    sub->add_option("-f,--format", format_, "Image format (default: probe)");
    sub->add_flag("--image-opts", image_opts_, kImageOptsHelp);
    sub->add_option("filename", filename_, "Image file")->required();
    sub->add_option("bitmap", bitmap_, "Bitmap name")->required();
    sub->footer(
        "Examples:\n"
        "  thindisk bitmap --add disk.qcow2 backup0          (64 KiB granularity)\n"
        "  thindisk bitmap --add -g 4k --disable disk.qcow2 frozen\n"
        "  thindisk bitmap --merge backup0 --clear disk.qcow2 all\n"
        "  thindisk bitmap --merge bm0 -b other.qcow2 disk.qcow2 backup0\n"
        "  thindisk info disk.qcow2                          (lists the bitmaps)");
    return sub;
  }

  Result<Outcome> Run() override {
    if (image_opts_) {
      TD_RETURN_IF_ERROR(ApplyImageOpts(&filename_, &format_, "-f", nullptr,
                                        "thindisk bitmap", ImageUse::kWrite));
    }
    TD_RETURN_IF_ERROR(Validate());
    // A merge from another image reads its source bitmaps first.
    std::vector<std::pair<qcow2::BitmapInfo, BitVector>> sources(actions_.size());
    if (!source_file_.empty()) {
      TD_ASSIGN_OR_RETURN(auto src, OpenQcow2(source_file_, source_format_, false));
      for (size_t i = 0; i < actions_.size(); ++i) {
        if (actions_[i].op != Op::kMerge) continue;
        Status s = ReadSource(*src, actions_[i].source, &sources[i]);
        if (!s.ok()) {
          (void)src->Close();
          return Failed(actions_[i], s);
        }
      }
      TD_RETURN_IF_ERROR(src->Close());
    }
    TD_ASSIGN_OR_RETURN(auto image, OpenQcow2(filename_, format_, true));
    Status s = Status::Ok();
    for (size_t i = 0; i < actions_.size() && s.ok(); ++i) {
      if (actions_[i].op == Op::kMerge && source_file_.empty()) {
        s = ReadSource(*image, actions_[i].source, &sources[i]);
      }
      if (s.ok()) s = RunOne(*image, actions_[i], sources[i]);
      if (!s.ok()) s = Failed(actions_[i], s);
    }
    Status closed = image->Close();
    if (!s.ok()) return s;
    if (!closed.ok()) return closed;
    return Outcome::kSuccess;
  }

 private:
  Status Validate() {
    if (actions_.empty()) {
      return Status::InvalidArgument(
          "need at least one of --add, --remove, --clear, --enable, --disable, or --merge");
    }
    if (bitmap_.empty()) return Status::InvalidArgument("the bitmap name cannot be empty");
    const bool add = std::any_of(actions_.begin(), actions_.end(),
                                 [](const Action& a) { return a.op == Op::kAdd; });
    const bool merge = std::any_of(actions_.begin(), actions_.end(),
                                   [](const Action& a) { return a.op == Op::kMerge; });
    if (!granularity_.empty() && !add) {
      return Status::InvalidArgument("-g (granularity) only goes with --add");
    }
    if (!source_file_.empty() && !merge) {
      return Status::InvalidArgument("-b (the merge source's image) only goes with --merge");
    }
    if (!source_format_.empty() && source_file_.empty()) {
      return Status::InvalidArgument("-F only goes with -b");
    }
    if (!granularity_.empty()) {
      TD_ASSIGN_OR_RETURN(uint64_t g, ParseSize(granularity_));
      if (g != 0 && ((g & (g - 1)) != 0 || g < 512 || g > (uint64_t{1} << 31))) {
        return Status::InvalidArgument("granularity must be a power of two from 512 bytes to 2G");
      }
      if (g != 0) granularity_bits_ = uint32_t(__builtin_ctzll(g));
    }
    return Status::Ok();
  }

  static Status ReadSource(qcow2::Image& image, const std::string& name,
                           std::pair<qcow2::BitmapInfo, BitVector>* out) {
    TD_ASSIGN_OR_RETURN(auto list, qcow2::ListBitmaps(image));
    auto it = std::find_if(list.begin(), list.end(),
                           [&](const qcow2::BitmapInfo& b) { return b.name == name; });
    if (it == list.end()) {
      return Status::NotFound("no bitmap '" + name + "' in " + image.info().filename);
    }
    TD_ASSIGN_OR_RETURN(BitVector bits, qcow2::ReadBitmap(image, name));
    *out = {*it, std::move(bits)};
    return Status::Ok();
  }

  Status RunOne(qcow2::Image& image, const Action& a,
                const std::pair<qcow2::BitmapInfo, BitVector>& source) {
    switch (a.op) {
      case Op::kAdd: {
        qcow2::BitmapAddOptions o;
        o.name = bitmap_;
        o.granularity_bits =
            granularity_bits_ ? granularity_bits_ : qcow2::DefaultBitmapGranularityBits(image);
        return qcow2::AddBitmap(image, o);
      }
      case Op::kRemove: return qcow2::RemoveBitmap(image, bitmap_);
      case Op::kClear: return qcow2::ClearBitmap(image, bitmap_);
      case Op::kEnable: return qcow2::SetBitmapEnabled(image, bitmap_, true);
      case Op::kDisable: return qcow2::SetBitmapEnabled(image, bitmap_, false);
      case Op::kMerge:
        if (source.second.size() != qcow2::BitmapBits(image.size(),
                                                      source.first.granularity_bits)) {
          return Status::InvalidArgument("the source bitmap covers a disk of another size");
        }
        return qcow2::MergeIntoBitmap(image, bitmap_, source.second,
                                      source.first.granularity_bits);
    }
    return Status::Internal("unknown bitmap operation");
  }

  Status Failed(const Action& a, const Status& s) const {
    return s.WithContext(std::string("operation ") + OpName(a.op) + " on bitmap '" + bitmap_ +
                         "' failed");
  }

  std::vector<Action> actions_;
  std::string granularity_;
  uint32_t granularity_bits_ = 0;
  std::string source_file_, source_format_, format_;
  std::string filename_, bitmap_;
  bool image_opts_ = false;
};

}  // namespace

std::unique_ptr<Subcommand> NewBitmapCommand() { return std::make_unique<BitmapCommand>(); }

}  // namespace thindisk::cli
