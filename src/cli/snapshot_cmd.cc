// thindisk snapshot: qemu-img snapshot (-c create, -l list, -a apply,
// -d delete) on internal qcow2 snapshots; same list table, plus
// --output=json shaped like the "snapshots" array of qemu-img info.
#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "block/open.h"
#include "cli/common.h"
#include "cli/image_opts.h"
#include "cli/snapshot_table.h"
#include "io/qemu_lock.h"
#include "io/storage.h"
#include "qcow2/image.h"
#include "qcow2/snapshot.h"

namespace thindisk::cli {
namespace {

using Json = nlohmann::ordered_json;

class SnapshotCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand(
        "snapshot", "Create, list, apply or delete internal snapshots of a qcow2 image");
    auto* c = sub->add_option("-c", create_, "Create a snapshot with this name");
    auto* l = sub->add_flag("-l", list_, "List the snapshots");
    auto* a =
        sub->add_option("-a", apply_, "Revert the image to this snapshot (id or name)");
    auto* d = sub->add_option("-d", delete_, "Delete this snapshot (id or name)");
    c->excludes(l, a, d);
    l->excludes(a, d);
    a->excludes(d);
    sub->add_option("-f,--format", format_, "Image format (default: probe)");
    sub->add_flag("--image-opts", image_opts_, kImageOptsHelp);
    sub->add_option("--output", output_, "List format: human or json")
        ->check(CLI::IsMember({"human", "json"}));
    sub->add_flag("-q,--quiet", quiet_, "Print no progress or notes");
    sub->add_flag("-U,--force-share", force_share_,
                  "List even while another process uses it");
    sub->add_option("filename", filename_, "Image file")->required();
    return sub;
  }

  Result<Outcome> Run() override {
    bool write = !create_.empty() || !apply_.empty() || !delete_.empty();
    if (image_opts_) {
      TD_RETURN_IF_ERROR(ApplyImageOpts(&filename_, &format_, "-f", nullptr,
                                        "thindisk snapshot",
                                        write ? ImageUse::kWrite : ImageUse::kRead));
    }
    if (!write && !list_) {
      return Status::InvalidArgument(
          "snapshot: give one of -c NAME, -l, -a NAME, -d NAME");
    }
    if (write && force_share_) {
      return Status::InvalidArgument(
          "--force-share (-U) only lists snapshots; -c, -a and -d change the image");
    }
    std::string format = format_;
    if (format.empty()) {
      TD_ASSIGN_OR_RETURN(format, block::ProbeFormat(filename_));
    }
    if (format != "qcow2") {
      return Status::NotSupported(filename_ + ": this image format (" + format +
                                  ") does not support internal snapshots");
    }
    // Changing the image: hold qemu's image lock so that no qemu process
    // (qemu-nbd, a VM) uses it meanwhile, and refuse if one does now.
    std::optional<io::QemuImageLock> lock;
    if (write) {
      TD_ASSIGN_OR_RETURN(lock, block::LockImage(filename_, io::QemuLockMode::kShared));
    }
    io::OpenOptions io_options;
    io_options.read_only = !write;
    // Listing reads like qemu-img snapshot -l: under the read lock, or -U.
    if (!write) {
      io_options.lock = force_share_ ? io::QemuLockMode::kForceShare : io::QemuLockMode::kRead;
    }
    TD_ASSIGN_OR_RETURN(std::unique_ptr<io::Storage> storage,
                        block::OpenStorage(filename_, io_options));
    qcow2::OpenOptions options;
    options.read_only = !write;
    options.no_backing = true;  // snapshots never read guest data
    TD_ASSIGN_OR_RETURN(std::unique_ptr<qcow2::Image> image,
                        qcow2::Image::Open(std::move(storage), options));
    if (write && image->info().read_only) {
      return Status::ReadOnly(filename_ +
                              ": the image is marked corrupt; repair it first");
    }
    Status s = RunOn(*image);
    Status closed = image->Close();
    if (!s.ok()) return s;
    if (!closed.ok()) return closed;
    return Outcome::kSuccess;
  }

 private:
  Status RunOn(qcow2::Image& image) {
    if (list_) {
      TD_ASSIGN_OR_RETURN(auto snapshots, qcow2::ListSnapshots(image));
      if (output_ == "json") {
        Json list = Json::array();
        for (const qcow2::Snapshot& sn : snapshots) list.push_back(SnapshotJson(sn));
        std::cout << list.dump(4) << "\n";
      } else if (!snapshots.empty()) {  // as qemu-img: no table, not even its header
        PrintSnapshotTable(snapshots);
      }
      return Status::Ok();
    }
    if (!create_.empty()) {
      qcow2::SnapshotCreateOptions o;
      o.name = create_;
      return qcow2::CreateSnapshot(image, o).WithContext("could not create snapshot '" +
                                                         create_ + "'");
    }
    if (!apply_.empty()) {
      return qcow2::ApplySnapshot(image, apply_)
          .WithContext("could not apply snapshot '" + apply_ + "'");
    }
    return qcow2::DeleteSnapshot(image, delete_)
        .WithContext("could not delete snapshot '" + delete_ + "'");
  }

  std::string create_, apply_, delete_, format_, output_ = "human";
  bool list_ = false;
  bool quiet_ = false;
  bool force_share_ = false;
  std::string filename_;
  bool image_opts_ = false;
};

}  // namespace

std::unique_ptr<Subcommand> NewSnapshotCommand() {
  return std::make_unique<SnapshotCommand>();
}

}  // namespace thindisk::cli
