// thindisk compact: rewrite a qcow2 image so its file holds only live
// clusters (qcow2/compact.h), replacing it atomically.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "block/open.h"
#include "cli/common.h"
#include "qcow2/compact.h"

namespace thindisk::cli {
namespace {

constexpr const char* kCompactHelp =
    "The image must be offline: compact takes the lock qemu takes on image files\n"
    "(fails if a qemu process has the image open; keeps qemu out meanwhile).\n"
    "thindisk serve/io take no lock yet: do not compact an image they serve.\n"
    "The file is rewritten with metadata first and data in guest order, without\n"
    "leaked, freed or zero clusters; header extensions, the backing file name\n"
    "and internal snapshots are kept, and so are persistent dirty bitmaps (names,\n"
    "granularity, enabled or not, bits); an inconsistent bitmap is refused.\n"
    "Crash safe: the new image is built, checked and synced in a temporary file\n"
    "beside FILE, then renamed over it and the directory is synced, so FILE is\n"
    "always either the old or the new image. Needs free space for the copy.";

class CompactCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand("compact", "Rewrite a qcow2 image without unused space");
    sub->footer(kCompactHelp);
    sub->add_flag("-p", progress_, "Show progress");
    sub->add_flag("-q,--quiet", quiet_, "Print nothing on success");
    sub->add_option("filename", filename_, "qcow2 image file (offline)")->required();
    return sub;
  }

  Result<Outcome> Run() override {
    if (block::IsUriName(filename_)) {
      // It renames a new file over the old one: only a local file can.
      return Status::NotSupported(filename_ + ": compact works on local image files (" +
                                  "copy the image with 'thindisk convert -O qcow2' instead)");
    }
    TD_ASSIGN_OR_RETURN(std::string format, block::ProbeFormat(filename_));
    if (format != "qcow2") {
      return Status::NotSupported(filename_ + ": compact works on qcow2 images (this is " +
                                  format + ")");
    }
    Progress progress(progress_ && !quiet_);
    qcow2::CompactFileOptions options;
    options.progress = [&](uint64_t done, uint64_t total) { progress.Update(done, total); };
    auto stats = qcow2::CompactFile(filename_, options);
    progress.Finish();
    if (!stats) return stats.error();
    if (!quiet_) {
      std::printf("Compacted %s: %s -> %s (%llu L2 tables, %llu data clusters, %llu compressed)\n",
                  filename_.c_str(), HumanSize(stats->old_file_size).c_str(),
                  HumanSize(stats->new_file_size).c_str(),
                  static_cast<unsigned long long>(stats->l2_tables),
                  static_cast<unsigned long long>(stats->data_clusters),
                  static_cast<unsigned long long>(stats->compressed_clusters));
    }
    return Outcome::kSuccess;
  }

 private:
  bool progress_ = false;
  bool quiet_ = false;
  std::string filename_;
};

}  // namespace

std::unique_ptr<Subcommand> NewCompactCommand() { return std::make_unique<CompactCommand>(); }

}  // namespace thindisk::cli
