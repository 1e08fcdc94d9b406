// thindisk ls: the thindisk images in a RADOS pool, with their virtual size,
// format, stored bytes, object size, backing file and who holds the
// one-writer lock (rbd ls -l's place for thindisk images).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "block/open.h"
#include "cli/common.h"
#include "cli/image_summary.h"
#include "io/ceph_module.h"
#include "io/rados_name.h"

namespace thindisk::cli {
namespace {

constexpr const char* kLsHelp =
    "POOL is rados://POOL[?conf=PATH&id=CLIENT]. Lists the images thindisk made\n"
    "there (one header object each), sorted by name; RBD images and other\n"
    "objects in the pool are not listed. For each: its virtual size, format\n"
    "(probed as `thindisk info` does), the bytes its objects hold, its object\n"
    "size, its backing file and the writer holding its lock (LOCK: the client,\n"
    "and whether it is alive or gone; `thindisk lock ls` shows the rest). An\n"
    "image that cannot be read is listed with format '?' and the reason on\n"
    "stderr.";

struct Row {
  io::RadosImageEntry entry;
  std::optional<ImageSummary> summary;   // none when it could not be read
  std::vector<io::RadosLocker> lockers;  // empty: no writer holds it (or unknown)
};

class LsCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand("ls", "List the images in a RADOS pool");
    sub->footer(kLsHelp);
    sub->add_option("--output", output_, "Output format: human or json")
        ->check(CLI::IsMember({"human", "json"}));
    sub->add_option("pool", pool_, "rados://POOL")->required();
    return sub;
  }

  Result<Outcome> Run() override {
    TD_ASSIGN_OR_RETURN(io::RadosName pool, io::ParseRadosPool(pool_));
    // Held for the whole listing, so each probe below reuses one connection.
    TD_ASSIGN_OR_RETURN(std::shared_ptr<void> connection,
                        io::ceph_module::HoldCluster(pool_));
    TD_ASSIGN_OR_RETURN(std::vector<io::RadosImageEntry> entries,
                        io::ceph_module::ListRados(pool_));
    std::vector<Row> rows;
    for (io::RadosImageEntry& e : entries) {
      io::RadosName name = pool;
      name.image = e.name;
      auto summary = ReadImageSummary(name.Uri(), "");
      if (!summary) PrintWarning(summary.error().message());
      auto lockers = io::ceph_module::ListRadosLockers(name.Uri());
      if (!lockers) PrintWarning(lockers.error().message());
      rows.push_back({std::move(e),
                      summary ? std::optional(std::move(*summary)) : std::nullopt,
                      lockers ? std::move(*lockers) : std::vector<io::RadosLocker>{}});
    }
    if (output_ == "json") {
      PrintJson(rows);
    } else {
      PrintHuman(rows);
    }
    return Outcome::kSuccess;
  }

 private:
  static void PrintJson(const std::vector<Row>& rows) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const Row& r : rows) {
      nlohmann::ordered_json o;
      o["name"] = r.entry.name;
      o["format"] = r.summary ? r.summary->format : "?";
      if (r.summary) {
        o["virtual-size"] = r.summary->virtual_size;
        o["actual-size"] = r.summary->actual_size;
      }
      o["object-size"] = r.entry.object_size;
      if (r.summary && !r.summary->backing_filename.empty()) {
        o["backing-filename"] = r.summary->backing_filename;
      }
      // As `thindisk lock ls` prints them; null when no writer holds it.
      o["lock"] = nullptr;
      if (!r.lockers.empty()) {
        const io::RadosLocker& l = r.lockers.front();
        o["lock"] = {{"client", l.client},
                     {"cookie", l.cookie},
                     {"address", l.address},
                     {"alive", l.watching}};
      }
      j.push_back(std::move(o));
    }
    std::cout << j.dump(4) << "\n";
  }

  static void PrintHuman(const std::vector<Row>& rows) {
    if (rows.empty()) return;
    int width = 4;  // "NAME"
    for (const Row& r : rows)
      width = std::max(width, static_cast<int>(r.entry.name.size()));
    std::printf("%-*s  %10s  %-6s  %10s  %-11s  %-24s  %s\n", width, "NAME", "SIZE",
                "FORMAT", "STORED", "OBJECT SIZE", "LOCK", "BACKING");
    for (const Row& r : rows) {
      const ImageSummary* s = r.summary ? &*r.summary : nullptr;
      std::string lock = "-";
      if (!r.lockers.empty()) {
        lock = r.lockers.front().client +
               (r.lockers.front().watching ? " (alive)" : " (gone)");
      }
      std::printf("%-*s  %10s  %-6s  %10s  %-11s  %-24s  %s\n", width,
                  r.entry.name.c_str(), s ? HumanSize(s->virtual_size).c_str() : "?",
                  s ? s->format.c_str() : "?",
                  s ? HumanSize(s->actual_size).c_str() : "?",
                  HumanSize(r.entry.object_size).c_str(), lock.c_str(),
                  s && !s->backing_filename.empty() ? s->backing_filename.c_str() : "-");
    }
  }

  std::string output_ = "human";
  std::string pool_;
};

}  // namespace

std::unique_ptr<Subcommand> NewLsCommand() { return std::make_unique<LsCommand>(); }

}  // namespace thindisk::cli
