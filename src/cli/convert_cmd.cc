// thindisk convert: copy an image's guest content into a new image, writing
// only what holds data (zero and unallocated ranges are skipped, and so are
// all-zero buffers; cli/convert_copy.h), optionally compressed. The source
// is opened read-only; a failed conversion removes the destination.
//
// Source and destination may be NBD URIs (block/open.h). An NBD destination
// is an existing export, not a new file: the image is written onto it (as
// qemu-img convert -n does), it must be large enough, and it is not removed
// on failure (it is the server's).
//
// -n writes into an existing destination of any kind, opened in the format
// -O names: every byte of the source is written, zeros included (as write
// zeroes), unless --target-is-zero says it already reads as zeros. It is
// never removed on failure. -t/-T choose the cache modes of destination
// and source as qemu-img's do (none: O_DIRECT); -W and -m are accepted.
// -S sets the zero grain as qemu-img's does; -S 0 writes every byte, so a
// raw output has no holes and a qcow2 one every cluster allocated.
//
// -C asks the kernel to copy what the source stores plainly in its own file
// (a raw or qcow2 source, a raw destination, both local files) with
// copy_file_range, a reflink where the file system shares extents; as
// qemu-img, it is refused with -c, -S and --salvage, and where it cannot
// apply the copy goes through this process (cli/convert_copy.h).
//
// --salvage copies on past source read errors, as qemu-img convert
// --salvage does: what cannot be read (down to 512-byte sectors) is written
// as zeros, each range named in a warning (not with -q); the exit status
// is 0 when everything else succeeded.
//
// -l converts an internal snapshot of a qcow2 source instead of its active
// content, named as qemu-img convert -l names one (snapshot.id=,
// snapshot.name=, or a bare id or name).
//
// Several sources are copied one after another into the one target, as
// qemu-img convert SRC1 SRC2 ... DST concatenates them (each source's size
// rounded up to whole sectors: block/concat_device.h); -B, -l and
// --bitmaps name one source's chain, snapshot or bitmaps, and are refused
// with several.
//
// --bitmaps copies the persistent dirty bitmaps of a qcow2 source's top
// layer into a qcow2 destination, as qemu-img convert --bitmaps does (same
// names, granularities, enabled state and bits, same order); an
// inconsistent one (in_use) fails the conversion before anything is made,
// unless --skip-broken-bitmaps skips it with a warning.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "block/concat_device.h"
#include "block/open.h"
#include "cli/common.h"
#include "cli/convert_copy.h"
#include "cli/image_create.h"
#include "cli/image_opts.h"
#include "cli/image_summary.h"
#include "cli/serve_options.h"
#include "cli/writeback.h"
#include "io/rados_name.h"
#include "nbdclient/nbd_uri.h"
#include "qcow2/bitmaps.h"
#include "qcow2/image.h"

namespace thindisk::cli {
namespace {

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
  ~ConvertCommand() override {
    if (offload_src_fd_ >= 0) ::close(offload_src_fd_);
    if (offload_dst_fd_ >= 0) ::close(offload_dst_fd_);
  }

  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand("convert", "Copy an image into a new one (any format)");
    sub->add_option("-f", src_format_, "Source format (default: probe)");
    sub->add_flag("--image-opts", image_opts_,
                  "The sources are option strings (driver=qcow2,file.filename=F,...), as "
                  "qemu-img --image-opts");
    sub->add_flag(
        "--target-image-opts", target_image_opts_,
        "With -n: the destination is an option string (its driver= is the format)");
    sub->add_option("-O", dst_format_, "Destination format: raw (default) or qcow2")
        ->check(CLI::IsMember({"qcow2", "raw"}));
    sub->add_option("-o", option_strings_, "Destination format options key=value,...")
        ->allow_extra_args(false);
    sub->add_flag("-c", compress_, "Compress the destination (qcow2)");
    sub->add_flag("-p", progress_, "Show progress");
    sub->add_flag("-q", quiet_, "Quiet (no progress)");
    load_snapshot_option_ =
        sub->add_option("-l", load_snapshot_,
                        "Convert this internal snapshot of the (qcow2) source instead of "
                        "its active content: snapshot.id=ID,snapshot.name=NAME or "
                        "ID_OR_NAME");
    sub->add_option("-B", backing_, "Backing file of the destination (data the source's "
                                    "backing chain holds is not copied)");
    sub->add_option("-F", backing_format_, "Format of the -B backing file");
    sub->add_flag("-U,--force-share", force_share_, "Read the source even while another process writes it (ignores its lock)");
    sub->add_flag("--bitmaps", bitmaps_,
                  "Copy the persistent bitmaps of a qcow2 source into the qcow2 destination");
    sub->add_flag("--skip-broken-bitmaps", skip_broken_bitmaps_,
                  "With --bitmaps: skip inconsistent (in_use) bitmaps instead of failing");
    sub->add_flag(
        "-C", copy_offload_,
        "Copy offloading: the kernel copies the source's data file to file "
        "(copy_file_range; a reflink on XFS and btrfs) where it can; not with -c, "
        "-S or --salvage");
    sub->add_flag(
        "--salvage", salvage_,
        "Copy on past source read errors: what cannot be read, down to 512-byte "
        "sectors, is written as zeros and listed as a warning");
    sub->add_flag("-n", no_create_,
                  "Write into the existing destination (opened as -O, raw by default): no "
                  "create, every byte written, zeros included; it must be at least as large");
    sub->add_flag("--target-is-zero", target_is_zero_,
                  "With -n: the destination reads as zeros, so zeros need not be written");
    sub->add_option("-S", sparse_text_,
                    "Zero runs of this many bytes in the source's data are not written "
                    "(a multiple of 512 up to 16M; default 4k); 0 writes every byte, "
                    "zeros included: a fully allocated output");
    sub->add_option("-r", rate_limit_text_,
                    "Read the source's data at most this many bytes per second (k, M, G "
                    "suffixes; holes and zeros cost nothing); 0: no limit");
    sub->add_option("-t", dst_cache_,
                    std::string("Destination cache mode: ") + kCacheModesHelp);
    sub->add_option("-T", src_cache_, "Source cache mode (as -t)");
    sub->add_flag("-W", out_of_order_,
                  "Accepted for qemu-img compatibility: thindisk reads ahead with 8 readers and "
                  "writes in guest order");
    sub->add_option("-m", coroutines_,
                    "Accepted for qemu-img compatibility (1-16): the copy keeps 8 reads in flight")
        ->check(CLI::Range(1, 16));
    sub->add_option(
           "files", files_,
           "SOURCE... DESTINATION: the source image (several are copied one after "
           "another), then the destination image (created unless -n)")
        ->required();
    dst_format_option_ = sub->get_option("-O");
    return sub;
  }

  Result<Outcome> Run() override {
    if (files_.size() < 2) {
      return Status::InvalidArgument(
          "give the source image and then the destination: "
          "thindisk convert SOURCE... DESTINATION");
    }
    src_files_.assign(files_.begin(), files_.end() - 1);
    dst_file_ = files_.back();
    if (skip_broken_bitmaps_ && !bitmaps_) {
      return Status::InvalidArgument("Use of --skip-broken-bitmaps requires --bitmaps");
    }
    TD_RETURN_IF_ERROR(CheckNoCreateOptions());
    TD_RETURN_IF_ERROR(ApplyImageOptsStrings());
    TD_RETURN_IF_ERROR(ParseSparse());
    TD_RETURN_IF_ERROR(CheckCopyOffload());
    TD_ASSIGN_OR_RETURN(rate_limit_, ParseRateLimit(rate_limit_text_));
    TD_ASSIGN_OR_RETURN(CacheChoice src_cache, ParseCacheMode(src_cache_, "-T"));
    TD_ASSIGN_OR_RETURN(dst_cache_choice_, ParseCacheMode(dst_cache_, "-t"));
    block::OpenOptions src_options;
    src_options.format = src_format_;
    src_options.read_only = true;
    src_options.force_share = force_share_;
    src_options.cache = src_cache.mode;
    if (load_snapshot_option_->count() > 0) {
      // The bitmaps track writes to the active image, not the snapshot.
      if (bitmaps_)
        return Status::InvalidArgument("--bitmaps cannot be combined with -l");
      TD_ASSIGN_OR_RETURN(src_options.snapshot, ParseLoadSnapshot(load_snapshot_, "-l"));
    }
    TD_RETURN_IF_ERROR(RefuseWithSeveralSources());
    TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> src, OpenSources(src_options));
    for (size_t i = 0; i < src_files_.size(); ++i) {
      TD_RETURN_IF_ERROR(RefuseSameFile(src_files_[i]));
      TD_RETURN_IF_ERROR(RefuseTargetUnderSource(
          src_files_[i], image_opts_ ? src_opts_[i].format : src_format_, dst_file_));
    }
    if (compress_ && dst_format_ != "qcow2") {
      return Status::InvalidArgument("compression (-c) needs -O qcow2");
    }
    if (bitmaps_) TD_RETURN_IF_ERROR(CheckSourceBitmaps(*src));
    if (no_create_) {
      TD_RETURN_IF_ERROR(Copy(*src, target_is_zero_ ? Target::kZero : Target::kExisting));
      (void)src->Close();
      return Outcome::kSuccess;
    }

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
      const std::string backing_path = block::ResolveBackingName(dst_file_, backing_);
      if (plan.backing_format.empty()) {
        TD_ASSIGN_OR_RETURN(plan.backing_format, block::ProbeFormat(backing_path));
      }
      TD_RETURN_IF_ERROR(
          RefuseBackingLoop(dst_file_, backing_, backing_path, plan.backing_format));
    }
    if (!block::IsUriName(dst_file_) && !nbdclient::UriScheme(dst_file_).empty()) {
      // As qemu-img does, "scheme://" names a protocol, never a new file.
      return Status::InvalidArgument(nbdclient::UnknownProtocolMessage(dst_file_));
    }
    TD_RETURN_IF_ERROR(CreateImageFile(dst_file_, plan, src.get()));

    Status s = Copy(*src, plan.backing_file.empty() ? Target::kZero : Target::kBacking);
    if (!s.ok()) {
      RemoveCreatedImage(
          dst_file_);  // a file or a pool's image; never an export or device
      return s;
    }
    (void)src->Close();
    return Outcome::kSuccess;
  }

 private:
  // -B, -l and --bitmaps each name one source's chain, snapshot or bitmaps.
  Status RefuseWithSeveralSources() const {
    if (src_files_.size() < 2) return Status::Ok();
    if (!backing_.empty()) {
      return Status::InvalidArgument(
          "-B: a backing file for the target makes no sense when concatenating several "
          "sources");
    }
    if (load_snapshot_option_->count() > 0) {
      return Status::InvalidArgument(
          "-l: one snapshot of one source; not with several sources");
    }
    if (bitmaps_)
      return Status::InvalidArgument(
          "--bitmaps copies one source's bitmaps; not with several sources");
    return Status::Ok();
  }

  // --image-opts and --target-image-opts: each source string becomes its
  // file name, format, cache mode and window (image_opts.h); the
  // destination's, with -n only (as qemu-img), its name, format and -t.
  Status ApplyImageOptsStrings() {
    src_opts_.assign(src_files_.size(), SourceOpts{});
    if (image_opts_) {
      for (size_t i = 0; i < src_files_.size(); ++i) {
        SourceOpts& o = src_opts_[i];
        o.format = src_format_;
        o.cache = src_cache_;
        TD_RETURN_IF_ERROR(ApplyImageOpts(&src_files_[i], &o.format, "-f", &o.cache,
                                          "thindisk convert", ImageUse::kRead,
                                          &o.window));
      }
    }
    if (!target_image_opts_) return Status::Ok();
    if (!no_create_)
      return Status::InvalidArgument("--target-image-opts requires use of -n flag");
    std::string format = dst_format_option_->count() > 0 ? dst_format_ : "";
    TD_RETURN_IF_ERROR(ApplyImageOpts(&dst_file_, &format, "-O", &dst_cache_,
                                      "thindisk convert", ImageUse::kWrite));
    if (format.empty()) {
      TD_ASSIGN_OR_RETURN(format, block::ProbeFormat(dst_file_));
    }
    if (format != "raw" && format != "qcow2")
      return Status::NotSupported(
          "--target-image-opts: thindisk writes raw and qcow2, not " + format);
    dst_format_ = format;
    dst_format_chosen_ = true;
    return Status::Ok();
  }

  // The source, or the sources one after another (block::ConcatDevice).
  Result<std::unique_ptr<block::Device>> OpenSources(block::OpenOptions options) const {
    std::vector<std::unique_ptr<block::Device>> parts;
    for (size_t i = 0; i < src_files_.size(); ++i) {
      const std::string& source = src_files_[i];
      if (image_opts_) {
        options.format = src_opts_[i].format;
        TD_ASSIGN_OR_RETURN(CacheChoice cache, ParseCacheMode(src_opts_[i].cache, "-T"));
        options.cache = cache.mode;
      }
      TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> part,
                          block::Open(source, options));
      TD_ASSIGN_OR_RETURN(part, OpenWindow(source, std::move(part), src_opts_[i].window));
      parts.push_back(std::move(part));
    }
    if (parts.size() == 1) return std::move(parts.front());
    return std::unique_ptr<block::Device>(
        std::make_unique<block::ConcatDevice>(std::move(parts)));
  }

  Status RefuseSameFile(const std::string& source) const {
    if (const char* same = SameImage(source, dst_file_)) {
      return Status::InvalidArgument(std::string("source and destination are the same ") +
                                     same + ": " + dst_file_);
    }
    return Status::Ok();
  }

  // The source as warnings name it: "a.raw", or "a.raw + b.raw".
  std::string SourceName() const {
    std::string name = src_files_.front();
    for (size_t i = 1; i < src_files_.size(); ++i) name += " + " + src_files_[i];
    return name;
  }

  // --salvage's account: one line per unreadable range, then the total.
  void WarnUnreadable(const CopyReport& report) const {
    uint64_t total = 0;
    for (const UnreadableRange& r : report.unreadable) {
      PrintWarning("could not read bytes " + std::to_string(r.offset) + "-" +
                   std::to_string(r.offset + r.length - 1) + " of " + SourceName() +
                   " (" + r.error + "): written as zeros");
      total += r.length;
    }
    if (total != 0) {
      PrintWarning(std::to_string(total) + " bytes in " +
                   std::to_string(report.unreadable.size()) +
                   " range(s) could not be read and were written as zeros");
    }
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

  // -S, as qemu-img takes it: a multiple of 512 up to 16 MiB, or 0.
  // -C's refusals, as qemu-img's.
  Status CheckCopyOffload() const {
    if (!copy_offload_) return Status::Ok();
    if (compress_)
      return Status::InvalidArgument("Cannot enable copy offloading when -c is used");
    if (!sparse_text_.empty()) {
      return Status::InvalidArgument("Cannot enable copy offloading when -S is used");
    }
    if (salvage_)
      return Status::InvalidArgument("Cannot use copy offloading in salvaging mode");
    return Status::Ok();
  }

  // -C's two files, when the copy can use them: one source, raw or qcow2,
  // and a raw destination, both local files. Otherwise none (the copy goes
  // through this process, as qemu-img's does where offloading fails).
  void OpenOffloadFiles(const block::Device& src) {
    if (!copy_offload_ || src_files_.size() != 1 || dst_format_ != "raw" ||
        !src_opts_.front().window.whole()) {
      return;
    }
    const std::string& source = src_files_.front();
    if (block::IsUriName(source) || block::IsUriName(dst_file_) ||
        (src.info().format != "raw" && src.info().format != "qcow2")) {
      return;
    }
    // A name that is not a plain file here (an rbd: name, say) opens as
    // nothing: no offload, as where the kernel refuses one.
    offload_src_fd_ = ::open(source.c_str(), O_RDONLY | O_CLOEXEC);
    offload_dst_fd_ = ::open(dst_file_.c_str(), O_WRONLY | O_CLOEXEC);
    if (offload_src_fd_ >= 0 && offload_dst_fd_ >= 0) {
      offload_ = CopyOffload{offload_src_fd_, offload_dst_fd_};
    }
  }

  Status ParseSparse() {
    if (sparse_text_.empty()) return Status::Ok();
    Result<uint64_t> v = ParseSize(sparse_text_);
    if (!v || *v % 512 != 0 || *v > kMaxSparse) {
      return Status::InvalidArgument("invalid -S '" + sparse_text_ +
                                     "': a sparse size is a multiple of 512 bytes up to "
                                     "16M, or 0 to write every byte");
    }
    sparse_ = *v;
    return Status::Ok();
  }

  // -n's checks that need no image: what only a new target can take.
  Status CheckNoCreateOptions() const {
    if (target_is_zero_ && !no_create_) {
      return Status::InvalidArgument("--target-is-zero requires use of -n flag");
    }
    if (!no_create_) return Status::Ok();
    if (!option_strings_.empty()) {
      return Status::InvalidArgument("-o has no effect when skipping image creation (-n)");
    }
    if (!backing_.empty()) {
      return Status::InvalidArgument("-B names the backing file of a new target; not with -n");
    }
    if (bitmaps_) return Status::InvalidArgument("--bitmaps needs a new target; not with -n");
    return Status::Ok();
  }

  // -n: the destination as it is, in the format -O names. Without -O an
  // image in another format than raw is refused rather than overwritten
  // byte for byte (qemu-img would); it must hold the source's size.
  Result<std::unique_ptr<block::Device>> OpenExisting(uint64_t source_size,
                                                      block::OpenOptions options) {
    if (dst_format_option_->count() == 0 && !dst_format_chosen_ &&
        !nbdclient::IsNbdUri(dst_file_)) {
      TD_ASSIGN_OR_RETURN(std::string probed, block::ProbeFormat(dst_file_));
      if (probed != "raw") {
        return Status::InvalidArgument(dst_file_ + " is a " + probed + " image: give -O " +
                                       probed + " to write into it, or -O raw to overwrite it "
                                       "byte for byte");
      }
    }
    TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> dst, block::Open(dst_file_, options));
    if (dst->size() < source_size) {
      return Status::InvalidArgument(dst_file_ + ": output file is smaller than input file (" +
                                     std::to_string(dst->size()) + " < " +
                                     std::to_string(source_size) + " bytes)");
    }
    return dst;
  }

  Status Copy(block::Device& src, Target target) {
    block::OpenOptions dst_options;
    dst_options.format = dst_format_;
    dst_options.cache = dst_cache_choice_.mode;
    std::unique_ptr<block::Device> dst;
    if (no_create_) {
      TD_ASSIGN_OR_RETURN(dst, OpenExisting(src.size(), dst_options));
    } else {
      TD_ASSIGN_OR_RETURN(dst, block::Open(dst_file_, dst_options));
    }
    Progress progress(progress_ && !quiet_);
    BackgroundWriteback writeback(dst_file_);
    progress.Update(0, src.size());
    CopyOptions copy{target, sparse_};
    copy.salvage = salvage_;
    copy.rate_limit = rate_limit_.get();
    OpenOffloadFiles(src);
    if (offload_) copy.offload = &*offload_;
    CopyReport report;
    TD_RETURN_IF_ERROR(
        compress_ ? CopyCompressed(src, *dst, copy, progress, &writeback, &report)
                  : CopyPlain(src, *dst, copy, progress, &writeback, &report));
    progress.Update(src.size(), src.size());
    progress.Finish();
    if (!quiet_) WarnUnreadable(report);
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
  bool image_opts_ = false;
  bool target_image_opts_ = false;
  bool dst_format_chosen_ = false;  // by --target-image-opts
  // Per source: what its --image-opts string says (else -f, -T, no window).
  struct SourceOpts {
    std::string format;
    std::string cache = "writeback";
    ImageWindow window;
  };
  std::vector<SourceOpts> src_opts_;
  std::string load_snapshot_;  // -l as given
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
  bool no_create_ = false;
  bool target_is_zero_ = false;
  bool salvage_ = false;
  bool copy_offload_ = false;           // -C
  std::optional<CopyOffload> offload_;  // -C's files, when they apply
  int offload_src_fd_ = -1;
  int offload_dst_fd_ = -1;
  static constexpr uint64_t kMaxSparse = uint64_t(16) << 20;
  std::string sparse_text_;                 // -S as given
  std::string rate_limit_text_;             // -r as given
  std::unique_ptr<RateLimit> rate_limit_;   // -r; nullptr: no limit
  uint64_t sparse_ = CopyOptions{}.sparse;  // -S
  std::string dst_cache_ = "writeback";
  std::string src_cache_ = "writeback";
  CacheChoice dst_cache_choice_;
  bool out_of_order_ = false;  // -W, accepted
  int coroutines_ = 8;         // -m, accepted
  CLI::Option* dst_format_option_ = nullptr;
  CLI::Option* load_snapshot_option_ = nullptr;
  std::vector<qcow2::BitmapInfo> src_bitmaps_;  // --bitmaps: the source's, in order
  std::vector<std::string> files_;              // as given: sources, then the destination
  std::vector<std::string> src_files_;
  std::string dst_file_;
};

}  // namespace

std::unique_ptr<Subcommand> NewConvertCommand() { return std::make_unique<ConvertCommand>(); }

}  // namespace thindisk::cli
