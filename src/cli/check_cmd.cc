// thindisk check: qemu-img check, same report, same exit codes.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "block/open.h"
#include "cli/common.h"
#include "cli/image_opts.h"
#include "cli/serve_options.h"
#include "qcow2/check.h"

namespace thindisk::cli {
namespace {

using Json = nlohmann::ordered_json;

Json ToJson(const qcow2::CheckReport& r, const std::string& filename) {
  // qemu omits the counters that are zero, except check-errors.
  Json j;
  if (r.image_end_offset) j["image-end-offset"] = r.image_end_offset;
  if (r.total_clusters) j["total-clusters"] = r.total_clusters;
  j["check-errors"] = r.check_errors;
  if (r.leaks) j["leaks"] = r.leaks;
  if (r.corruptions) j["corruptions"] = r.corruptions;
  if (r.leaks_fixed) j["leaks-fixed"] = r.leaks_fixed;
  if (r.corruptions_fixed) j["corruptions-fixed"] = r.corruptions_fixed;
  if (r.allocated_clusters) j["allocated-clusters"] = r.allocated_clusters;
  j["filename"] = filename;
  j["format"] = "qcow2";
  if (r.fragmented_clusters) j["fragmented-clusters"] = r.fragmented_clusters;
  if (r.compressed_clusters) j["compressed-clusters"] = r.compressed_clusters;
  return j;
}

void PrintHuman(const qcow2::CheckReport& r, bool quiet) {
  if (r.leaks_fixed || r.corruptions_fixed) {
    std::printf(
        "The following inconsistencies were found and repaired:\n\n"
        "    %llu leaked clusters\n    %llu corruptions\n\n"
        "Double checking the fixed image now...\n",
        static_cast<unsigned long long>(r.leaks_fixed),
        static_cast<unsigned long long>(r.corruptions_fixed));
  }
  if (!(r.corruptions || r.leaks || r.check_errors)) {
    if (!quiet) std::printf("No errors were found on the image.\n");
  } else if (!quiet) {
    if (r.corruptions) {
      std::printf(
          "\n%llu errors were found on the image.\n"
          "Data may be corrupted, or further writes to the image may corrupt it.\n",
          static_cast<unsigned long long>(r.corruptions));
    }
    if (r.leaks) {
      std::printf(
          "\n%llu leaked clusters were found on the image.\n"
          "This means waste of disk space, but no harm to data.\n",
          static_cast<unsigned long long>(r.leaks));
    }
    if (r.check_errors) {
      std::printf("\n%llu internal errors have occurred during the check.\n",
                  static_cast<unsigned long long>(r.check_errors));
    }
  }
  if (quiet) return;
  if (r.total_clusters != 0 && r.allocated_clusters != 0) {
    double allocated = static_cast<double>(r.allocated_clusters);
    std::printf("%llu/%llu = %0.2f%% allocated, %0.2f%% fragmented, %0.2f%% compressed clusters\n",
                static_cast<unsigned long long>(r.allocated_clusters),
                static_cast<unsigned long long>(r.total_clusters),
                allocated * 100.0 / static_cast<double>(r.total_clusters),
                static_cast<double>(r.fragmented_clusters) * 100.0 / allocated,
                static_cast<double>(r.compressed_clusters) * 100.0 / allocated);
  }
  if (r.image_end_offset) {
    std::printf("Image end offset: %llu\n", static_cast<unsigned long long>(r.image_end_offset));
  }
}

class CheckCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand("check", "Check (and repair) a qcow2 image's metadata");
    sub->footer(
        "Exit status: 0 no errors, 1 the check could not run, 2 corruptions found,\n"
        "3 only leaked clusters found.");
    sub->add_option("-f,--format", format_, "Image format (default: probe)");
    sub->add_flag("--image-opts", image_opts_, kImageOptsHelp);
    sub->add_option("-r,--repair", repair_, "Repair leaks, or all errors")
        ->check(CLI::IsMember({"leaks", "all"}));
    sub->add_option("--output", output_, "Output format: human or json")
        ->check(CLI::IsMember({"human", "json"}));
    sub->add_flag("-q,--quiet", quiet_, "Print nothing when the image is clean");
    sub->add_flag("-U,--force-share", force_share_, "Read even while another process writes the image (ignores its lock)");
    sub->add_option("-T", cache_, std::string("Cache mode: ") + kCacheModesHelp);
    sub->add_option("filename", filename_, "Image file")->required();
    return sub;
  }

  Result<Outcome> Run() override {
    if (image_opts_) {
      TD_RETURN_IF_ERROR(
          ApplyImageOpts(&filename_, &format_, "-f", &cache_, "thindisk check",
                         repair_.empty() ? ImageUse::kRead : ImageUse::kWrite));
    }
    std::string format = format_;
    if (format.empty()) {
      TD_ASSIGN_OR_RETURN(format, block::ProbeFormat(filename_));
    }
    if (format != "qcow2") {
      return Status::NotSupported(filename_ + ": this image format (" + format +
                                  ") does not support checks");
    }
    qcow2::RepairMode mode = repair_ == "all"     ? qcow2::RepairMode::kAll
                             : repair_ == "leaks" ? qcow2::RepairMode::kLeaks
                                                  : qcow2::RepairMode::kNone;
    if (force_share_ && mode != qcow2::RepairMode::kNone) {
      return Status::InvalidArgument("--force-share (-U) cannot be used with -r: repairs write");
    }
    TD_ASSIGN_OR_RETURN(CacheChoice cache, ParseCacheMode(cache_, "-T"));
    io::OpenOptions io_options;
    io_options.cache = cache.mode;
    io_options.read_only = mode == qcow2::RepairMode::kNone;
    io_options.lock = !io_options.read_only ? io::QemuLockMode::kWrite
                      : force_share_        ? io::QemuLockMode::kForceShare
                                            : io::QemuLockMode::kRead;
    TD_ASSIGN_OR_RETURN(std::unique_ptr<io::Storage> storage,
                        block::OpenStorage(filename_, io_options));
    auto report = qcow2::Check(*storage, mode);
    if (!report.has_value()) return report.error().WithContext(filename_);
    // One line per problem on stderr, in both output modes, as qemu-img does.
    for (const std::string& m : report->messages) std::fprintf(stderr, "%s\n", m.c_str());
    if (output_ == "json") {
      std::cout << ToJson(*report, filename_).dump(4) << "\n";
    } else {
      PrintHuman(*report, quiet_);
    }
    std::fflush(stdout);
    if (report->check_errors) {
      return Status(Code::kIoError, filename_ + ": check failed (" +
                                        std::to_string(report->check_errors) +
                                        " errors reading the image)");
    }
    if (report->corruptions) return Outcome::kCheckFoundCorruption;
    if (report->leaks) return Outcome::kCheckFoundLeaks;
    return Outcome::kSuccess;
  }

 private:
  std::string format_;
  bool image_opts_ = false;
  std::string repair_;
  std::string output_ = "human";
  bool quiet_ = false;
  bool force_share_ = false;
  std::string cache_ = "writeback";  // -T
  std::string filename_;
};

}  // namespace

std::unique_ptr<Subcommand> NewCheckCommand() { return std::make_unique<CheckCommand>(); }

}  // namespace thindisk::cli
