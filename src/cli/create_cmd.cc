// thindisk create: a new, empty qcow2 or raw image (qemu-img create).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "block/open.h"
#include "cli/common.h"
#include "cli/image_create.h"
#include "cli/image_summary.h"
#include "io/ceph_module.h"
#include "io/rados_name.h"
#include "nbdclient/nbd_module.h"
#include "nbdclient/nbd_uri.h"
#include "qcow2/image.h"
#include "raw/raw_image.h"

namespace thindisk::cli {
namespace {

constexpr const char* kCreateHelp =
    "Create a new image. Defaults for qcow2: compat=1.1 (v3), extended_l2=on\n"
    "(off for clusters under 16k, as in qemu-img), cluster_size=128k (4 KiB\n"
    "subclusters), compression_type=zstd, preallocation=off, lazy_refcounts=off,\n"
    "refcount_bits=16.\n"
    "qcow2 options (-o): cluster_size, extended_l2, preallocation\n"
    "(off|metadata|falloc|full), compression_type (zlib|zstd), lazy_refcounts,\n"
    "refcount_bits, compat (0.10|1.1|v2|v3), backing_file, backing_fmt, size.\n"
    "raw options (-o): preallocation (off|falloc|full), size.";

class CreateCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand("create", "Create a new image");
    sub->footer(kCreateHelp);
    sub->add_option("-f,--format", format_, "Image format: qcow2 (default) or raw")
        ->check(CLI::IsMember({"qcow2", "raw"}));
    sub->add_option("-o,--options", option_strings_, "Format options key=value,...")
        ->allow_extra_args(false);
    sub->add_option("-b,--backing", backing_, "Backing file (qcow2 only)");
    sub->add_option("-F,--backing-format", backing_format_, "Backing file format");
    sub->add_flag("-u,--unsafe", unsafe_, "Do not open the backing file (then SIZE is needed)");
    sub->add_flag("-q,--quiet", quiet_, "Do not print the 'Formatting' line");
    sub->add_option("filename", filename_, "Image file to create")->required();
    sub->add_option("size", size_text_, "Virtual size (k, M, G, T suffixes); default: the backing file's");
    return sub;
  }

  Result<Outcome> Run() override {
    for (const std::string& o : option_strings_) {
      if (o == "help" || o == "?") {  // qemu-img create -o help
        std::printf("%s\n", kCreateHelp);
        return Outcome::kSuccess;
      }
    }
    TD_ASSIGN_OR_RETURN(CreatePlan plan, Plan());
    // Without Ceph or NBD client support a pool's name or an export's URI
    // fails here, before the line that says the image is being made.
    if (io::IsRadosName(filename_)) {
      TD_RETURN_IF_ERROR(io::ceph_module::Load().WithContext(filename_));
    }
    if (nbdclient::IsNbdUri(filename_)) {
      TD_RETURN_IF_ERROR(nbdclient::nbd_module::Load().WithContext(filename_));
    }
    if (!quiet_) std::cout << FormattingLine(filename_, plan) << std::endl;
    TD_RETURN_IF_ERROR(CreateImageFile(filename_, plan));
    return Outcome::kSuccess;
  }

 private:
  Result<CreatePlan> Plan() {
    CreatePlan plan;
    plan.format = format_;
    TD_RETURN_IF_ERROR(ApplyCreateOptions(plan, option_strings_));
    if (!backing_.empty()) plan.backing_file = backing_;
    if (!backing_format_.empty()) plan.backing_format = backing_format_;
    if (!size_text_.empty()) {
      TD_ASSIGN_OR_RETURN(plan.size, ParseSize(size_text_));
      plan.have_size = true;
    }
    if (plan.backing_file.empty()) {
      if (!plan.backing_format.empty()) {
        return Status::InvalidArgument("a backing format (-F) needs a backing file (-b)");
      }
    } else {
      if (plan.format == "raw") return Status::InvalidArgument("raw images have no backing file");
      // Probing a backing file is the hole qemu closed: a format must be named.
      if (plan.backing_format.empty()) {
        return Status::InvalidArgument(filename_ +
                                       ": backing file specified without backing format (-F)");
      }
      const std::string path = block::ResolveBackingName(filename_, plan.backing_file);
      // Creating truncates the file: an image over itself, or under a chain
      // that reads it, would lose its data (qemu-img refuses the same name
      // too), with -u as well.
      TD_RETURN_IF_ERROR(RefuseBackingLoop(filename_, plan.backing_file, path,
                                           unsafe_ ? "" : plan.backing_format));
      if (!unsafe_) {
        auto backing = ReadImageSummary(path, plan.backing_format);
        if (!backing.has_value()) {
          return backing.error().WithContext("could not open backing image '" + path + "'");
        }
        if (!plan.have_size) {
          plan.size = backing->virtual_size;
          plan.have_size = true;
        }
      }
    }
    if (!plan.have_size) return Status::InvalidArgument("image creation needs a size");
    return plan;
  }

  std::string format_ = "qcow2";
  std::vector<std::string> option_strings_;
  std::string backing_;
  std::string backing_format_;
  bool unsafe_ = false;
  bool quiet_ = false;
  std::string filename_;
  std::string size_text_;
};

}  // namespace

std::unique_ptr<Subcommand> NewCreateCommand() { return std::make_unique<CreateCommand>(); }

}  // namespace thindisk::cli
