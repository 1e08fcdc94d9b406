// thindisk info: what qemu-img info prints, field for field.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/image_opts.h"
#include "cli/image_summary.h"
#include "cli/snapshot_table.h"
#include "nbdclient/nbd_uri.h"

namespace thindisk::cli {
namespace {

using Json = nlohmann::ordered_json;

std::string CompatName(uint32_t version) { return version >= 3 ? "1.1" : "0.10"; }

std::string CompressionName(qcow2::CompressionType t) {
  return t == qcow2::CompressionType::kZstd ? "zstd" : "zlib";
}

// Extra data bytes 16..23 hold the instruction count (spec), when present.
// qemu-img's format-specific block for a vmdk.
Json VmdkJson(const vmdk::Description& d) {
  Json extents = Json::array();
  for (const vmdk::ExtentDescription& e : d.extents) {
    Json x;
    if (e.compressed) x["compressed"] = true;
    x["virtual-size"] = e.virtual_size;
    x["filename"] = e.filename;
    if (e.cluster_size) x["cluster-size"] = e.cluster_size;
    x["format"] = e.format;
    extents.push_back(x);
  }
  Json data{{"cid", d.cid}, {"parent-cid", d.parent_cid}, {"create-type", d.create_type},
            {"extents", extents}};
  return Json{{"type", "vmdk"}, {"data", data}};
}

void PrintVmdkHuman(const vmdk::Description& d) {
  std::cout << "Format specific information:\n"
            << "    cid: " << d.cid << "\n"
            << "    parent cid: " << d.parent_cid << "\n"
            << "    create type: " << d.create_type << "\n"
            << "    extents:\n";
  for (size_t i = 0; i < d.extents.size(); ++i) {
    const vmdk::ExtentDescription& e = d.extents[i];
    std::cout << "        [" << i << "]:\n";
    if (e.compressed) std::cout << "            compressed: true\n";
    std::cout << "            virtual size: " << e.virtual_size << "\n"
              << "            filename: " << e.filename << "\n";
    if (e.cluster_size) std::cout << "            cluster size: " << e.cluster_size << "\n";
    std::cout << "            format: " << e.format << "\n";
  }
}

// qemu's names for a bitmap's flags, in its order.
std::vector<std::string> BitmapFlags(const qcow2::BitmapDirectoryEntry& b) {
  std::vector<std::string> flags;
  if (b.in_use()) flags.push_back("in-use");
  if (b.enabled()) flags.push_back("auto");
  return flags;
}

Json ToJson(const ImageSummary& s) {
  Json j;
  if (!s.snapshots.empty()) {
    Json list = Json::array();
    for (const qcow2::Snapshot& sn : s.snapshots) list.push_back(SnapshotJson(sn));
    j["snapshots"] = list;
  }
  j["virtual-size"] = s.virtual_size;
  j["filename"] = s.filename;
  if (s.header) j["cluster-size"] = s.header->cluster_size();
  if (!s.header && s.cluster_size) j["cluster-size"] = s.cluster_size;  // vmdk, vpc
  j["format"] = s.format;
  // An NBD export's host allocation is unknown: qemu-img leaves it out too.
  if (!nbdclient::IsNbdUri(s.filename)) j["actual-size"] = s.actual_size;
  if (s.header) {
    const qcow2::Header& h = *s.header;
    Json data;
    data["compat"] = CompatName(h.version);
    data["compression-type"] = CompressionName(h.compression_type);
    // qemu reports these only for version 3 images, which can have them.
    if (h.version >= 3) data["lazy-refcounts"] = (h.compatible_features & qcow2::kCompatLazyRefcounts) != 0;
    if (!s.bitmaps.empty()) {
      Json list = Json::array();
      for (const qcow2::BitmapDirectoryEntry& b : s.bitmaps) {
        list.push_back(Json{{"flags", BitmapFlags(b)}, {"name", b.name},
                            {"granularity", b.granularity()}});
      }
      data["bitmaps"] = list;
    }
    data["refcount-bits"] = h.refcount_bits();
    if (h.version >= 3) {
      data["corrupt"] = (h.incompatible_features & qcow2::kIncompatCorrupt) != 0;
      data["extended-l2"] = h.extended_l2();
    }
    j["format-specific"] = Json{{"type", "qcow2"}, {"data", data}};
    if (!s.backing_filename.empty()) {
      j["full-backing-filename"] = s.full_backing_filename;
      j["backing-filename"] = s.backing_filename;
      if (!h.backing_format.empty()) j["backing-filename-format"] = h.backing_format;
    }
  }
  if (s.vmdk) j["format-specific"] = VmdkJson(*s.vmdk);
  j["dirty-flag"] = s.header && (s.header->incompatible_features & qcow2::kIncompatDirty) != 0;
  return j;
}

void PrintHuman(const ImageSummary& s) {
  std::cout << "image: " << s.filename << "\n"
            << "file format: " << s.format << "\n"
            << "virtual size: " << HumanSize(s.virtual_size) << " (" << s.virtual_size
            << " bytes)\n"
            << "disk size: "
            << (nbdclient::IsNbdUri(s.filename) ? "unavailable" : HumanSize(s.actual_size))
            << "\n";
  if (!s.header) {
    if (s.cluster_size) std::cout << "cluster_size: " << s.cluster_size << "\n";  // vmdk, vpc
    if (s.vmdk) PrintVmdkHuman(*s.vmdk);
    return;
  }
  const qcow2::Header& h = *s.header;
  std::cout << "cluster_size: " << h.cluster_size() << "\n";
  if (h.incompatible_features & qcow2::kIncompatDirty) std::cout << "cleanly shut down: no\n";
  if (!s.backing_filename.empty()) {
    std::cout << "backing file: " << s.backing_filename;
    if (s.full_backing_filename != s.backing_filename) {
      std::cout << " (actual path: " << s.full_backing_filename << ")";
    }
    std::cout << "\n";
    if (!h.backing_format.empty()) std::cout << "backing file format: " << h.backing_format << "\n";
  }
  if (!s.snapshots.empty()) {
    std::cout.flush();
    PrintSnapshotTable(s.snapshots);
    std::fflush(stdout);
  }
  std::cout << "Format specific information:\n"
            << "    compat: " << CompatName(h.version) << "\n"
            << "    compression type: " << CompressionName(h.compression_type) << "\n";
  if (h.version >= 3) {
    std::cout << "    lazy refcounts: "
              << ((h.compatible_features & qcow2::kCompatLazyRefcounts) ? "true" : "false")
              << "\n";
  }
  if (!s.bitmaps.empty()) {
    std::cout << "    bitmaps:\n";
    for (size_t i = 0; i < s.bitmaps.size(); ++i) {
      const qcow2::BitmapDirectoryEntry& b = s.bitmaps[i];
      std::cout << "        [" << i << "]:\n            flags:\n";
      std::vector<std::string> flags = BitmapFlags(b);
      for (size_t k = 0; k < flags.size(); ++k) {
        std::cout << "                [" << k << "]: " << flags[k] << "\n";
      }
      std::cout << "            name: " << b.name << "\n"
                << "            granularity: " << b.granularity() << "\n";
    }
  }
  std::cout << "    refcount bits: " << h.refcount_bits() << "\n";
  if (h.version >= 3) {
    std::cout << "    corrupt: "
              << ((h.incompatible_features & qcow2::kIncompatCorrupt) ? "true" : "false") << "\n"
              << "    extended l2: " << (h.extended_l2() ? "true" : "false") << "\n";
  }
}

class InfoCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand("info", "Show what an image is: format, sizes, backing file");
    sub->add_option("-f,--format", format_, "Image format (default: probe)");
    sub->add_flag("--image-opts", image_opts_, kImageOptsHelp);
    sub->add_option("--output", output_, "Output format: human or json")
        ->check(CLI::IsMember({"human", "json"}));
    sub->add_flag("--backing-chain", backing_chain_, "Show every image of the backing chain");
    sub->add_flag("-U,--force-share", force_share_, "Read even while another process writes the image (ignores its lock)");
    sub->add_option("filename", filename_, "Image file")->required();
    return sub;
  }

  Result<Outcome> Run() override {
    if (image_opts_) {
      TD_RETURN_IF_ERROR(ApplyImageOpts(&filename_, &format_, "-f", nullptr,
                                        "thindisk info", ImageUse::kRead));
    }
    std::vector<ImageSummary> chain;
    if (backing_chain_) {
      TD_ASSIGN_OR_RETURN(chain, ReadBackingChain(filename_, format_, force_share_));
    } else {
      TD_ASSIGN_OR_RETURN(ImageSummary s, ReadImageSummary(filename_, format_, force_share_));
      chain.push_back(std::move(s));
    }
    for (const ImageSummary& s : chain) {
      if (!s.bitmaps_problem.empty()) PrintWarning(s.filename + ": bitmaps: " + s.bitmaps_problem);
    }
    if (output_ == "json") {
      if (backing_chain_) {
        Json all = Json::array();
        for (const ImageSummary& s : chain) all.push_back(ToJson(s));
        std::cout << all.dump(4) << "\n";
      } else {
        std::cout << ToJson(chain.front()).dump(4) << "\n";
      }
      return Outcome::kSuccess;
    }
    for (size_t i = 0; i < chain.size(); ++i) {
      if (i > 0) std::cout << "\n";
      PrintHuman(chain[i]);
    }
    return Outcome::kSuccess;
  }

 private:
  std::string format_;
  bool image_opts_ = false;
  std::string output_ = "human";
  bool backing_chain_ = false;
  bool force_share_ = false;
  std::string filename_;
};

}  // namespace

std::unique_ptr<Subcommand> NewInfoCommand() { return std::make_unique<InfoCommand>(); }

}  // namespace thindisk::cli
