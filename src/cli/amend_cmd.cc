// thindisk amend: change what can be changed in an existing qcow2 image, as
// qemu-img amend: compat (0.10 <-> 1.1), lazy_refcounts, refcount_bits,
// backing_file, backing_fmt, and size (grow).
//
// Each change is a crash-safe step of its own (header rewrites in
// qcow2/header_update.h, refcount width in qcow2/refcount_rebuild.h), in an
// order where every intermediate image is valid: upgrade to 1.1 before a
// refcount width change, convert zero clusters before a downgrade to 0.10.
// Options only creation can set (cluster_size, extended_l2, ...) and
// downgrades that would lose a feature in use are refused, naming it.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <set>

#include "block/open.h"
#include "cli/common.h"
#include "cli/image_opts.h"
#include "cli/image_summary.h"
#include "cli/serve_options.h"
#include "io/qemu_lock.h"
#include "io/storage.h"
#include "qcow2/header_update.h"
#include "qcow2/image.h"
#include "qcow2/refcount_rebuild.h"

namespace thindisk::cli {
namespace {

const std::set<std::string>& AmendableOptions() {
  static const std::set<std::string> kOptions = {
      "compat", "lazy_refcounts", "refcount_bits", "backing_file", "backing_fmt", "size"};
  return kOptions;
}

bool CreationOnly(const std::string& key) {
  static const std::set<std::string> kKeys = {
      "cluster_size", "extended_l2",   "preallocation", "compression_type",
      "encryption",   "data_file",     "data_file_raw", "nocow"};
  return kKeys.count(key) > 0 || key.rfind("encrypt", 0) == 0;
}

Result<uint32_t> ParseCompat(const std::string& value) {
  if (value == "0.10") return 2u;
  if (value == "1.1" || value == "v3") return 3u;
  return Status::InvalidArgument("Invalid compat version '" + value + "' (use 0.10 or 1.1)");
}

// What the options ask for, resolved against the current header.
struct Plan {
  uint32_t version = 3;
  bool lazy_refcounts = false;
  uint32_t refcount_bits = 16;
  std::string backing_file;
  std::string backing_format;
  uint64_t size = 0;
};

class AmendCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand("amend", "Change options of an existing qcow2 image");
    sub->add_option("-o", option_texts_, "Options to change: key=value[,key=value...]")
        ->required();
    sub->add_option("-f,--format", format_, "Image format (default: probe)");
    sub->add_flag("--image-opts", image_opts_, kImageOptsHelp);
    sub->add_flag("-p,--progress", progress_, "Show progress");
    sub->add_flag("-q,--quiet", quiet_, "Print nothing on success");
    sub->add_flag("--force", force_, "Accepted for qemu-img compatibility");
    sub->add_option("-t", cache_, std::string("Cache mode: ") + kCacheModesHelp);
    sub->add_option("filename", filename_, "Image file")->required();
    return sub;
  }

  Result<Outcome> Run() override {
    if (image_opts_) {
      TD_RETURN_IF_ERROR(ApplyImageOpts(&filename_, &format_, "-f", &cache_,
                                        "thindisk amend", ImageUse::kWrite));
    }
    TD_ASSIGN_OR_RETURN(CacheChoice cache, ParseCacheMode(cache_, "-t"));
    // 1. The options: every one must be something amend can change.
    OptionMap options;
    for (const std::string& text : option_texts_) {
      TD_ASSIGN_OR_RETURN(OptionMap more, ParseOptionString(text));
      for (auto& [k, v] : more) options[k] = v;
    }
    for (const auto& [key, value] : options) {
      if (CreationOnly(key)) {
        return Status::InvalidArgument("Invalid parameter '" + key +
                                       "': this option can only be set when the image is created");
      }
      if (!AmendableOptions().count(key)) {
        return Status::InvalidArgument("Invalid parameter '" + key + "'");
      }
    }
    std::string format = format_;
    if (format.empty()) {
      TD_ASSIGN_OR_RETURN(format, block::ProbeFormat(filename_));
    }
    if (format != "qcow2") {
      return Status::NotSupported("Format driver '" + format +
                                  "' does not support option amendment");
    }

    // 2. Hold qemu's write lock for the whole amend (it reopens the file
    //    between steps; those opens take no lock of their own). A dirty
    //    image (lazy refcounts) is repaired by a read-write open.
    TD_ASSIGN_OR_RETURN(auto lock, block::LockImage(filename_, io::QemuLockMode::kWrite));
    io::OpenOptions io_options;
    io_options.cache = cache.mode;
    TD_ASSIGN_OR_RETURN(auto storage, block::OpenStorage(filename_, io_options));
    TD_ASSIGN_OR_RETURN(qcow2::HeaderCluster hc, qcow2::ReadHeaderCluster(*storage));
    if (hc.header.incompatible_features & qcow2::kIncompatDirty) {
      TD_RETURN_IF_ERROR(ReopenToRepair(std::move(storage)));
      TD_ASSIGN_OR_RETURN(storage, block::OpenStorage(filename_, io_options));
      TD_ASSIGN_OR_RETURN(hc, qcow2::ReadHeaderCluster(*storage));
    }
    const qcow2::Header& cur = hc.header;
    TD_ASSIGN_OR_RETURN(Plan plan, MakePlan(cur, options));

    // 3. The steps, each leaving a valid image.
    if (plan.size != cur.size) {
      TD_RETURN_IF_ERROR(Grow(std::move(storage), cur, plan.size));
      TD_ASSIGN_OR_RETURN(storage, block::OpenStorage(filename_, io_options));
    }
    if (cur.version < 3 && plan.version == 3) {
      TD_RETURN_IF_ERROR(qcow2::UpdateHeader(*storage, [](qcow2::Header& h) {
        UpgradeToV3(h);
        return Status::Ok();
      }));
    }
    TD_RETURN_IF_ERROR(qcow2::ChangeRefcountWidth(*storage, plan.refcount_bits));
    if (cur.version == 3 && plan.version == 2) {
      TD_RETURN_IF_ERROR(ConvertZeroClusters(std::move(storage), cur));
      TD_ASSIGN_OR_RETURN(storage, block::OpenStorage(filename_, io_options));
    }
    TD_RETURN_IF_ERROR(Finish(*storage, plan));
    return Outcome::kSuccess;
  }

 private:
  static void UpgradeToV3(qcow2::Header& h) {
    if (h.version >= 3) return;
    h.version = 3;
    h.header_length = 112;
    h.compression_type = qcow2::CompressionType::kZlib;
    h.feature_names = qcow2::DefaultFeatureNames();
  }

  Result<Plan> MakePlan(const qcow2::Header& cur, const OptionMap& options) {
    Plan p;
    p.version = cur.version;
    p.lazy_refcounts = (cur.compatible_features & qcow2::kCompatLazyRefcounts) != 0;
    p.refcount_bits = cur.refcount_bits();
    p.backing_file = cur.backing_file;
    p.backing_format = cur.backing_format;
    p.size = cur.size;
    auto get = [&](const char* key) -> const std::string* {
      auto it = options.find(key);
      return it == options.end() ? nullptr : &it->second;
    };
    if (auto* v = get("compat")) {
      TD_ASSIGN_OR_RETURN(p.version, ParseCompat(*v));
    }
    if (auto* v = get("lazy_refcounts")) {
      TD_ASSIGN_OR_RETURN(p.lazy_refcounts, ParseOnOff("lazy_refcounts", *v));
    }
    if (auto* v = get("refcount_bits")) {
      TD_ASSIGN_OR_RETURN(uint64_t bits, ParseSize(*v));
      if (bits == 0 || bits > 64 || (bits & (bits - 1)) != 0) {
        return Status::InvalidArgument("refcount_bits must be a power of two from 1 to 64");
      }
      p.refcount_bits = uint32_t(bits);
    }
    if (auto* v = get("backing_file")) {
      p.backing_file = *v;
      if (v->empty()) p.backing_format.clear();
    }
    if (auto* v = get("backing_fmt")) p.backing_format = *v;
    if (!p.backing_format.empty() && p.backing_file.empty()) {
      return Status::InvalidArgument("backing_fmt needs a backing file");
    }
    if (get("backing_file") && !p.backing_file.empty()) {
      TD_RETURN_IF_ERROR(RefuseBackingLoop(
          filename_, p.backing_file, block::ResolveBackingName(filename_, p.backing_file),
          p.backing_format));
    }
    if (auto* v = get("size")) {
      TD_ASSIGN_OR_RETURN(p.size, ParseSize(*v));
      if (p.size < cur.size) {
        return Status::NotSupported("amend only grows an image; shrinking it loses data");
      }
    }
    // Compat 0.10 has 16-bit refcounts only and no feature bits.
    if (p.version == 2) {
      if (get("lazy_refcounts") && p.lazy_refcounts) {
        return Status::InvalidArgument(
            "Lazy refcounts only supported with compatibility level 1.1 and above");
      }
      p.lazy_refcounts = false;
      if (p.refcount_bits != 16) {
        return Status::InvalidArgument("compat=0.10 requires refcount_bits=16");
      }
    }
    if (cur.version == 3 && p.version == 2) TD_RETURN_IF_ERROR(CanDowngrade(cur));
    return p;
  }

  // What compat=0.10 cannot express; qemu-img refuses the same.
  static Status CanDowngrade(const qcow2::Header& h) {
    auto refuse = [](const std::string& what) {
      return Status::NotSupported("Cannot downgrade to compat=0.10: the image uses " + what);
    };
    if (h.extended_l2()) return refuse("extended L2 entries (extended_l2=on)");
    if (h.compression_type != qcow2::CompressionType::kZlib) {
      return refuse("compression_type=zstd");
    }
    if (h.nb_snapshots > 0) {
      return refuse("internal snapshots (their zero clusters cannot be converted here)");
    }
    // A version 2 header has no autoclear bits: its bitmaps could never be
    // consistent again (qemu-img downgrades and loses them silently).
    bool bitmaps = h.bitmaps.has_value();
    for (const qcow2::RawExtension& e : h.unknown_extensions) bitmaps |= e.type == qcow2::kExtBitmaps;
    if (bitmaps) {
      return refuse("persistent bitmaps (remove them first: thindisk bitmap --remove IMAGE NAME)");
    }
    uint64_t other = h.incompatible_features & ~qcow2::kIncompatDirty;
    if (other != 0) return refuse("incompatible feature bits " + std::to_string(other));
    return Status::Ok();
  }

  Status ReopenToRepair(std::unique_ptr<io::Storage> storage) {
    qcow2::OpenOptions o;
    o.no_backing = true;
    TD_ASSIGN_OR_RETURN(auto image, qcow2::Image::Open(std::move(storage), o));
    return image->Close();
  }

  Status Grow(std::unique_ptr<io::Storage> storage, const qcow2::Header&, uint64_t size) {
    qcow2::OpenOptions o;
    o.no_backing = true;
    TD_ASSIGN_OR_RETURN(auto image, qcow2::Image::Open(std::move(storage), o));
    TD_RETURN_IF_ERROR(image->Resize(size));
    return image->Close();
  }

  // Compat 0.10 has no zero flag: a zero cluster becomes unallocated where
  // nothing lies below it (it reads as zeros anyway), else a cluster of
  // zeros written as data.
  Status ConvertZeroClusters(std::unique_ptr<io::Storage> storage, const qcow2::Header& cur) {
    uint64_t backing_size = 0;
    if (!cur.backing_file.empty()) {
      auto below = ReadImageSummary(block::ResolveBackingName(filename_, cur.backing_file),
                                    cur.backing_format);
      // Unknown size: zeros written as data are right whatever lies below.
      backing_size = below ? below->virtual_size : ~uint64_t{0};
    }
    qcow2::OpenOptions o;
    o.no_backing = true;
    TD_ASSIGN_OR_RETURN(auto image, qcow2::Image::Open(std::move(storage), o));
    const uint64_t size = image->size();
    const uint64_t cs = cur.cluster_size();
    Progress progress(progress_ && !quiet_);
    std::vector<uint8_t> zeros;
    for (uint64_t offset = 0; offset < size;) {
      TD_ASSIGN_OR_RETURN(block::Extent e, image->GetStatus(offset, size - offset));
      uint64_t end = offset + std::min(e.length, size - offset);
      if (e.present && e.zero && !e.data) {
        uint64_t covered = backing_size >= size ? end : (backing_size + cs - 1) / cs * cs;
        uint64_t split = std::clamp(covered, offset, end);
        for (uint64_t pos = offset; pos < split;) {
          uint64_t n = std::min<uint64_t>(split - pos, 1 << 20);
          zeros.assign(n, 0);
          TD_RETURN_IF_ERROR(image->Write(pos, zeros));
          pos += n;
        }
        if (split < end) TD_RETURN_IF_ERROR(image->Deallocate(split, end - split));
      }
      offset = end;
      progress.Update(offset, size);
    }
    return image->Close();
  }

  Status Finish(io::Storage& storage, const Plan& plan) {
    return qcow2::UpdateHeader(storage, [&](qcow2::Header& h) {
      if (plan.version == 3) {
        UpgradeToV3(h);
      } else if (h.version == 3) {
        h.version = 2;
        h.header_length = qcow2::kV2HeaderLength;
        h.incompatible_features = 0;
        h.compatible_features = 0;
        h.autoclear_features = 0;
        h.feature_names.clear();
      }
      if (h.version == 3) {
        if (plan.lazy_refcounts) {
          h.compatible_features |= qcow2::kCompatLazyRefcounts;
        } else {
          h.compatible_features &= ~qcow2::kCompatLazyRefcounts;
        }
      }
      h.backing_file = plan.backing_file;
      h.backing_format = plan.backing_file.empty() ? "" : plan.backing_format;
      return Status::Ok();
    });
  }

  std::vector<std::string> option_texts_;
  std::string format_;
  bool image_opts_ = false;
  bool progress_ = false;
  bool quiet_ = false;
  bool force_ = false;
  std::string cache_ = "writeback";  // -t
  std::string filename_;
};

}  // namespace

std::unique_ptr<Subcommand> NewAmendCommand() { return std::make_unique<AmendCommand>(); }

}  // namespace thindisk::cli
