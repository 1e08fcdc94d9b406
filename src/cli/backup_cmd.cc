// thindisk backup: a full or incremental backup of a disk into a qcow2
// image, driven by a persistent dirty bitmap (docs/backup.md).
//
//   thindisk backup --bitmap NAME SOURCE FULL.qcow2
//   thindisk backup --bitmap NAME --incremental PREVIOUS SOURCE NEXT.qcow2
//
// A full backup copies everything SOURCE holds; an incremental one copies
// exactly the ranges the bitmap marks (whole granules) into a new qcow2
// whose backing file is PREVIOUS, writing zeros where the disk reads as
// zeros now. Either way the target is made durable first, and only then is
// the bitmap cleared (made, enabled, by a first full backup), so a crash at
// any point leaves a chain that restores, and a bitmap that still marks
// whatever the last finished backup lacks. Restore: thindisk convert (or
// qemu-img convert) of the newest backup.
//
// SOURCE is a local image (qcow2, opened exclusively) or the NBD export of
// a running `thindisk serve -B NAME --control SOCKET`: the dirty ranges come
// from its qemu:dirty-bitmap:NAME context, and the bitmap is cleared
// through the control socket only if no write touched the disk during the
// backup (the generation it reported before the copy has not moved);
// otherwise the backup is removed and the command fails, leaving the
// bitmap as it was. Pause the writers (fsfreeze) for a backup of a live
// disk.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "block/open.h"
#include "cli/backup_copy.h"
#include "cli/common.h"
#include "cli/image_create.h"
#include "cli/serve_control.h"
#include "cli/writeback.h"
#include "nbdclient/dirty_map.h"
#include "nbdclient/nbd_module.h"
#include "nbdclient/nbd_uri.h"
#include "qcow2/bitmaps.h"
#include "qcow2/image.h"

namespace thindisk::cli {
namespace {

using Json = nlohmann::ordered_json;

// The ranges a bitmap marks, in bytes, cut at the disk's end.
std::vector<ByteRange> RangesOf(const BitVector& bits, uint32_t granularity_bits, uint64_t size) {
  std::vector<ByteRange> out;
  for (uint64_t a = bits.NextSet(0); a < bits.size();) {
    const uint64_t b = bits.NextClear(a);
    const uint64_t from = a << granularity_bits;
    const uint64_t to = std::min(size, b << granularity_bits);
    if (from < to) out.push_back({from, to - from});
    a = bits.NextSet(b);
  }
  return out;
}

// PREVIOUS as the target's backing name: relative to the target's
// directory when both are local files (what block::Open resolves it
// against), else as given.
std::string BackingNameFor(const std::string& previous, const std::string& target) {
  if (block::IsUriName(previous) || block::IsUriName(target)) return previous;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path rel = fs::relative(fs::absolute(previous, ec),
                              fs::absolute(target, ec).parent_path(), ec);
  return ec || rel.empty() ? fs::absolute(previous).string() : rel.string();
}

class BackupCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand(
        "backup", "Back up a disk, fully or incrementally, driven by a persistent dirty bitmap");
    sub->add_option("--bitmap", bitmap_, "The bitmap that tracks changes since the last backup")
        ->required();
    sub->add_option("--incremental", previous_,
                    "The previous backup: the new one holds what changed since, over it");
    sub->add_option("--control", control_,
                    "The control socket of the thindisk serve exporting SOURCE (NBD sources)");
    sub->add_option("-g,--granularity", granularity_text_,
                    "Granularity of the bitmap a first full backup adds (default: qemu-img's)");
    sub->add_option("-o", option_strings_, "Options of the new qcow2 image (as create -o)");
    sub->add_flag("-p", progress_, "Show progress");
    sub->add_option("--output", output_, "Report format: human or json")
        ->check(CLI::IsMember({"human", "json"}));
    sub->add_option("source", source_, "The disk: an image, or an NBD URI of a thindisk serve")
        ->required();
    sub->add_option("target", target_, "The backup to make (a new qcow2 image)")->required();
    sub->footer(
        "Examples:\n"
        "  thindisk backup --bitmap daily disk.qcow2 b/0.qcow2\n"
        "  thindisk backup --bitmap daily --incremental b/0.qcow2 disk.qcow2 b/1.qcow2\n"
        "  thindisk serve -k /run/vm.sock -B daily --control /run/vm.ctl disk.qcow2 &\n"
        "  thindisk backup --bitmap daily --incremental b/1.qcow2 --control /run/vm.ctl \\\n"
        "      'nbd+unix:///?socket=/run/vm.sock' b/2.qcow2\n"
        "  thindisk convert -O raw b/2.qcow2 restored.raw      (the disk at backup 2)");
    return sub;
  }

  Result<Outcome> Run() override {
    nbd_ = nbdclient::IsNbdUri(source_);
    if (nbd_ && control_.empty()) {
      return Status::InvalidArgument(
          "an NBD source needs --control SOCKET (thindisk serve --control): the bitmap is "
          "cleared there once the backup is safe");
    }
    if (!nbd_ && !control_.empty()) {
      return Status::InvalidArgument("--control goes with an NBD source only");
    }
    if (!granularity_text_.empty() && !previous_.empty()) {
      return Status::InvalidArgument("-g sets the bitmap a full backup adds: not with --incremental");
    }
    // 1. The source, and what to copy.
    TD_RETURN_IF_ERROR(OpenSource());
    Result<Outcome> r = Backup();
    Status closed = source_dev_->Close();
    if (r.has_value() && !closed.ok()) return closed;
    return r;
  }

 private:
  Status OpenSource() {
    block::OpenOptions o;
    if (nbd_) {
      o.format = "raw";  // the export is the guest's disk, whatever it holds
      o.read_only = true;
    }
    TD_ASSIGN_OR_RETURN(auto dev, block::Open(source_, o));
    source_dev_ = std::move(dev);
    if (!nbd_ && dynamic_cast<qcow2::Image*>(source_dev_.get()) == nullptr) {
      (void)source_dev_->Close();
      return Status::NotSupported(source_ + ": a backup is driven by a persistent bitmap, which "
                                  "only a qcow2 image holds");
    }
    return Status::Ok();
  }

  // The bitmap's state before the copy, and the ranges to copy.
  Status Plan() {
    const uint64_t size = source_dev_->size();
    const bool incremental = !previous_.empty();
    if (nbd_) {
      // The export (also what the control socket calls it) and its map.
      TD_ASSIGN_OR_RETURN(auto map, nbdclient::nbd_module::ReadDirtyMap(source_, bitmap_));
      export_name_ = map.export_name;
      TD_ASSIGN_OR_RETURN(Json before,
                          ControlCall(control_, {{"execute", "query-bitmaps"},
                                                 {"arguments", {{"export", export_name_}}}}));
      for (const auto& b : before) {
        if (b.value("name", "") != bitmap_) continue;
        if (!b.value("tracked", false)) {
          return Status::InvalidArgument("bitmap '" + bitmap_ +
                                         "' is not tracked by the server (disabled, inconsistent "
                                         "or a read-only export)");
        }
        generation_ = b["generation"].get<uint64_t>();
      }
      if (!generation_) {
        return Status::NotFound("the server's image has no bitmap '" + bitmap_ +
                                "' (add it before serving: thindisk bitmap --add)");
      }
      // Read after the generation: a change between the two moves it.
      if (incremental) {
        TD_ASSIGN_OR_RETURN(map, nbdclient::nbd_module::ReadDirtyMap(source_, bitmap_));
        if (!map.offered) {
          return Status::NotSupported(nbdclient::NotExportedMessage(source_, bitmap_));
        }
        for (const auto& d : map.dirty) ranges_.push_back({d.offset, d.length});
      }
    } else {
      auto& image = static_cast<qcow2::Image&>(*source_dev_);
      TD_ASSIGN_OR_RETURN(auto list, qcow2::ListBitmaps(image));
      auto it = std::find_if(list.begin(), list.end(),
                             [&](const qcow2::BitmapInfo& b) { return b.name == bitmap_; });
      if (it != list.end() && !it->consistent()) {
        return Status::Corrupt("bitmap '" + bitmap_ + "' is inconsistent (" + it->problem +
                               "): remove it (thindisk bitmap --remove) and take a full backup");
      }
      if (it != list.end() && !it->enabled) {
        return Status::InvalidArgument("bitmap '" + bitmap_ + "' is disabled: it does not "
                                       "track changes (thindisk bitmap --enable)");
      }
      have_bitmap_ = it != list.end();
      if (incremental) {
        if (!have_bitmap_) {
          return Status::NotFound("no bitmap '" + bitmap_ + "' in " + source_ +
                                  ": take a full backup first (it adds the bitmap)");
        }
        TD_ASSIGN_OR_RETURN(BitVector bits, qcow2::ReadBitmap(image, bitmap_));
        ranges_ = RangesOf(bits, it->granularity_bits, size);
      }
    }
    if (!incremental) {
      TD_ASSIGN_OR_RETURN(ranges_, NonZeroRanges(*source_dev_));
    }
    return Status::Ok();
  }

  Status CheckPrevious() {
    if (previous_.empty()) return Status::Ok();
    block::OpenOptions o;
    o.read_only = true;
    TD_ASSIGN_OR_RETURN(auto prev, block::Open(previous_, o));
    const uint64_t size = prev->size();
    const std::string format = prev->info().format;
    TD_RETURN_IF_ERROR(prev->Close());
    if (size != source_dev_->size()) {
      return Status::InvalidArgument(previous_ + " is a backup of a disk of " +
                                     std::to_string(size) + " bytes; " + source_ + " has " +
                                     std::to_string(source_dev_->size()));
    }
    previous_format_ = format;
    return Status::Ok();
  }

  Result<Outcome> Backup() {
    TD_RETURN_IF_ERROR(CheckPrevious());
    TD_RETURN_IF_ERROR(Plan());
    // 2. The target: a new qcow2, over the previous backup when incremental.
    CreatePlan plan;
    plan.format = "qcow2";
    TD_RETURN_IF_ERROR(ApplyCreateOptions(plan, option_strings_));
    plan.size = source_dev_->size();
    plan.have_size = true;
    if (!previous_.empty()) {
      plan.backing_file = BackingNameFor(previous_, target_);
      plan.backing_format = previous_format_;
      plan.qcow2.backing_file = plan.backing_file;
      plan.qcow2.backing_format = plan.backing_format;
    }
    TD_RETURN_IF_ERROR(EnsureTargetIsNew());
    TD_RETURN_IF_ERROR(CreateImageFile(target_, plan));
    auto copied = CopyInto();
    if (copied.has_value()) {
      Status named = SyncTargetName();
      if (!named.ok()) copied = named;
    }
    if (!copied) {
      RemoveCreatedImage(target_);
      return copied.error();
    }
    // 3. Only now that the backup is durable does the bitmap start over.
    Status reset = ResetBitmap();
    if (!reset.ok()) {
      if (reset.code() == Code::kBusy) {
        RemoveCreatedImage(target_);
        return Status::Busy("the disk changed while it was backed up (" + reset.message() +
                            "); the backup was removed and the bitmap kept: pause the writers "
                            "(fsfreeze) and run it again");
      }
      return reset.WithContext(target_ + " is complete, but the bitmap was not reset");
    }
    Report(*copied);
    return Outcome::kSuccess;
  }

  Status EnsureTargetIsNew() {
    if (block::IsUriName(target_)) return Status::Ok();  // CreateImageFile refuses an existing one
    std::error_code ec;
    if (std::filesystem::exists(target_, ec)) {
      return Status::InvalidArgument(target_ + " exists: a backup is always a new image");
    }
    return Status::Ok();
  }

  Result<CopyRangesStats> CopyInto() {
    block::OpenOptions o;
    o.format = "qcow2";
    TD_ASSIGN_OR_RETURN(auto dst, block::Open(target_, o));
    Progress progress(progress_);
    // The copy's output goes back to the disk as it is written, so the
    // final sync has little left (as convert's, cli/writeback.h).
    BackgroundWriteback writeback(target_);
    CopyRangesOptions co;
    co.zeroes_as_writes = !previous_.empty();
    co.progress = &progress;
    co.wrote = [&writeback](uint64_t bytes) { writeback.Wrote(bytes); };
    const auto t0 = std::chrono::steady_clock::now();
    auto stats = CopyRanges(*source_dev_, *dst, ranges_, co);
    const auto t1 = std::chrono::steady_clock::now();
    Status written_back = writeback.Finish();
    if (stats.has_value() && !written_back.ok()) stats = written_back;
    Status flushed = stats ? dst->Flush() : stats.status();
    Status closed = dst->Close();
    if (!flushed.ok()) return flushed;
    if (!closed.ok()) return closed;
    copy_seconds_ = std::chrono::duration<double>(t1 - t0).count();
    sync_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    return stats;
  }

  // The new file's name is durable too (its directory synced), before the
  // bitmap that it now stands for is reset: a power cut must not leave the
  // chain without it.
  Status SyncTargetName() const {
    if (block::IsUriName(target_)) return Status::Ok();  // a pool's objects: no directory
    std::filesystem::path dir = std::filesystem::absolute(target_).parent_path();
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, dir.string());
    Status s = ::fsync(fd) == 0 ? Status::Ok() : Status::FromErrno(errno, dir.string() + ": fsync");
    ::close(fd);
    return s;
  }

  Status ResetBitmap() {
    if (nbd_) {
      return ControlCall(control_, {{"execute", "clear-bitmap"},
                                    {"arguments", {{"export", export_name_},
                                                   {"name", bitmap_},
                                                   {"generation", *generation_}}}})
          .status();
    }
    auto& image = static_cast<qcow2::Image&>(*source_dev_);
    if (have_bitmap_) return qcow2::ClearBitmap(image, bitmap_);
    qcow2::BitmapAddOptions add;
    add.name = bitmap_;
    add.granularity_bits = qcow2::DefaultBitmapGranularityBits(image);
    if (!granularity_text_.empty()) {
      TD_ASSIGN_OR_RETURN(uint64_t g, ParseSize(granularity_text_));
      if (g < 512 || (g & (g - 1)) != 0) {
        return Status::InvalidArgument("-g must be a power of two of at least 512");
      }
      add.granularity_bits = uint32_t(__builtin_ctzll(g));
    }
    return qcow2::AddBitmap(image, add);
  }

  void Report(const CopyRangesStats& s) const {
    const bool incremental = !previous_.empty();
    if (output_ == "json") {
      Json j{{"source", source_},     {"target", target_},
             {"mode", incremental ? "incremental" : "full"},
             {"bitmap", bitmap_},     {"bytes", s.bytes},
             {"data-written", s.data_written}, {"zeroes", s.zeroes},
             {"copy-seconds", copy_seconds_}, {"sync-seconds", sync_seconds_}};
      if (incremental) j["backing"] = previous_;
      std::cout << j.dump(4) << "\n";
      return;
    }
    std::cout << (incremental ? "Incremental" : "Full") << " backup of " << source_ << " into "
              << target_ << (incremental ? " (over " + previous_ + ")" : "") << ": "
              << HumanSize(s.bytes) << " copied (" << HumanSize(s.data_written) << " data, "
              << HumanSize(s.zeroes) << " zeros); bitmap '" << bitmap_ << "' reset\n";
  }

  std::string bitmap_, previous_, control_, granularity_text_, output_ = "human";
  std::vector<std::string> option_strings_;
  bool progress_ = false;
  std::string source_, target_;
  bool nbd_ = false;
  std::unique_ptr<block::Device> source_dev_;
  std::vector<ByteRange> ranges_;
  std::optional<uint64_t> generation_;  // NBD: the bitmap's before the copy
  std::string export_name_;             // NBD: the export SOURCE names
  double copy_seconds_ = 0;             // the copy, and the target's sync and close
  double sync_seconds_ = 0;
  bool have_bitmap_ = false;            // local: the bitmap exists already
  std::string previous_format_;
};

}  // namespace

std::unique_ptr<Subcommand> NewBackupCommand() { return std::make_unique<BackupCommand>(); }

}  // namespace thindisk::cli
