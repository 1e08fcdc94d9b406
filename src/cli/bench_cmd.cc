// thindisk bench: the DESIGN.md workloads W1-W6 and W9 on fresh images
// in-process, in a local directory (optionally on slow storage, --latency)
// or in a RADOS pool (rados://POOL), or W1-W4 against any NBD server
// (--uri); --seed-demo reproduces the project's seed experiment. The work
// is in src/bench; this file turns flags into its options and prints the
// report.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>

#include "bench/duration.h"
#include "bench/in_process.h"
#include "bench/remote.h"
#include "bench/report.h"
#include "bench/seed_demo.h"
#include "cli/common.h"
#include "cli/image_create.h"
#include "io/rados_name.h"
#include "io/rbd_name.h"
#include "qcow2/format.h"

namespace thindisk::cli {
namespace {

constexpr const char* kBenchHelp =
    R"(Workloads (fresh image each, virtual size max(4 GiB, --size)):
  W1  sequential read, 1 MiB blocks, of a never-written image       MB/s
  W2  4 KiB random first writes over --size (QD 1 and --qd)          IOPS, write amplification
  W3  the same 4 KiB writes again (allocated space)                  IOPS
  W4  sequential write, 1 MiB blocks, then flush                     MB/s
  W5  4 KiB random writes into a clone of a fully written base       IOPS, write amplification
  W6  compressed convert (zlib, zstd) of a text corpus and random    MB/s, output/input
      data, min(--size, 256 MiB) each (in-process only)
  W9  4 KiB random reads of written data (QD 1 and --qd), after     IOPS
      writing --size in 1 MiB requests and flushing (untimed);
      in-process only, not in the default list
--ops and --runtime bound each phase (W2 and W9: each queue depth) on its own.
--latency adds a delay to every host request of every image (a slow
network or distributed store, e.g. 1ms): requests in flight then decide
the figures, so QD 1 against --qd shows what concurrency gains.
Write phases end with a flush, included in their time. Space amplification
= allocated file bytes / guest bytes; write amplification = host bytes
written / guest bytes (in-process: counted under the engine; --uri: the
server's /proc/PID/io write_bytes, with --server-pid).
DIR may be a RADOS pool, rados://POOL[?conf=PATH&id=CLIENT]: the images are
then td-bench-<pid>-<workload> in the pool, made as `thindisk create
rados://` makes them and removed at the end (kept with --keep); host bytes
are those sent to RADOS (not the OSDs' replicas), allocated bytes the sizes
of the images' objects. --latency and --seed-demo take a local DIR.

Examples:
  thindisk bench /var/tmp --size 1G
  thindisk bench --size 64M --workloads W2,W3 --qd 1 --output json
  thindisk bench /var/tmp -o cluster_size=64k,extended_l2=off
  thindisk bench rados://thindisk --size 64M --workloads W2,W3,W4 --output json
  thindisk bench --latency 1ms --workloads W2,W9 --qd 32 --size 64M --ops 4096
  thindisk bench --uri 'nbd+unix:///?socket=/tmp/nbd.sock' --server-pid 1234 --image disk.qcow2
  thindisk bench --seed-demo /var/tmp --size 16M)";

// Redraws "  W2 qd16        42.0%" in place on stderr; a new label starts a new line.
class LabelledProgress {
 public:
  explicit LabelledProgress(bool enabled) : enabled_(enabled) {}
  ~LabelledProgress() { Finish(); }
  void Update(const std::string& label, uint64_t done, uint64_t total) {
    if (!enabled_) return;
    if (label != label_ && !label_.empty()) std::fputc('\n', stderr);
    label_ = label;
    double pct = total ? 100.0 * double(done) / double(total) : 100.0;
    std::fprintf(stderr, "\r  %-28s %6.1f%%", label.c_str(), pct);
    std::fflush(stderr);
  }
  void Finish() {
    if (enabled_ && !label_.empty()) std::fputc('\n', stderr);
    label_.clear();
  }

 private:
  bool enabled_;
  std::string label_;
};

class BenchCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand(
        "bench", "Measure the seed workloads (W1-W6, W9) in-process or over NBD");
    sub->footer(kBenchHelp);
    sub->add_option("dir", dir_,
                    "Directory for the fresh images (default /var/tmp, else the cwd), or "
                    "rados://POOL");
    sub->add_option(
        "--uri", uri_,
        "Benchmark an NBD server instead (nbd+unix:///?socket=..., nbd://host:port)");
    sub->add_option("-o,--options", option_strings_,
                    "qcow2 create options for the images (key=value,...)");
    sub->add_option("--cluster-size", cluster_size_text_,
                    "Cluster size of the images (default 128k)");
    sub->add_option("--extended-l2", extended_l2_text_,
                    "Subclusters: on (default) or off");
    sub->add_option("--workloads", workloads_text_,
                    "Comma-separated W1..W6, W9 (default: W1-W6, or W1-W4 with --uri)");
    sub->add_option("--size", size_text_,
                    "Guest bytes per workload (default 1G; --seed-demo: 64M)");
    sub->add_option("--qd", qd_,
                    "Queue depth: worker threads in-process, requests in flight over NBD")
        ->check(CLI::Range(1, 256));
    sub->add_option("--seed", seed_, "Seed for offsets and data (default 1)");
    sub->add_option("--runtime", runtime_,
                    "Stop each phase after this many seconds (0: no limit)")
        ->check(CLI::NonNegativeNumber);
    sub->add_option("--ops", max_ops_,
                    "Stop each phase after this many requests (0: no limit)");
    sub->add_option(
        "--latency", latency_text_,
        "In-process: delay every host request by this much (1ms, 500us; default 0)");
    sub->add_option("--output", output_, "Report format: human (default) or json")
        ->check(CLI::IsMember({"human", "json"}));
    sub->add_option("--server-pid", server_pid_,
                    "With --uri: the server's pid, for host writes and CPU per op");
    sub->add_option("--image", image_,
                    "With --uri: the served file, for space amplification");
    sub->add_flag("--seed-demo", seed_demo_,
                  "Reproduce the seed experiment (dd bs=1k / bs=1M, two layouts)");
    sub->add_flag("--progress", progress_,
                  "Show progress on stderr even when it is not a terminal");
    sub->add_flag("-q,--quiet", quiet_, "No progress");
    sub->add_flag("--keep", keep_,
                  "Keep the images (in a thindisk-bench-* directory under DIR; in a "
                  "pool: td-bench-PID-*)");
    return sub;
  }

  Result<Outcome> Run() override {
    TD_RETURN_IF_ERROR(Validate());
    LabelledProgress progress((progress_ || isatty(STDERR_FILENO)) && !quiet_);
    bench::LabelledProgressFn on_progress = [&progress](const std::string& l, uint64_t d,
                                                        uint64_t t) {
      progress.Update(l, d, t);
    };
    if (seed_demo_) {
      bench::SeedDemoOptions o;
      o.dir = Dir();
      o.size = size_.value_or(64ull << 20);
      o.progress = on_progress;
      TD_ASSIGN_OR_RETURN(bench::SeedDemo demo, bench::RunSeedDemo(o));
      progress.Finish();
      Print(bench::ToJson(demo), bench::ToHuman(demo));
      return Outcome::kSuccess;
    }
    bench::WorkloadOptions run;
    run.limits.max_seconds = runtime_;
    run.limits.max_ops = max_ops_;
    run.size = size_.value_or(1ull << 30);
    run.qd = qd_;
    run.seed = seed_;
    run.workloads = workloads_;
    run.progress = on_progress;
    bench::Report report;
    if (!uri_.empty()) {
      bench::RemoteOptions o;
      static_cast<bench::WorkloadOptions&>(o) = run;
      o.uri = uri_;
      o.server_pid = server_pid_;
      o.image_path = image_;
      TD_ASSIGN_OR_RETURN(report, bench::RunRemote(o));
    } else {
      bench::InProcessOptions o;
      static_cast<bench::WorkloadOptions&>(o) = run;
      o.dir = Dir();
      TD_ASSIGN_OR_RETURN(o.layout, Layout());
      o.keep_images = keep_;
      o.latency = latency_;
      TD_ASSIGN_OR_RETURN(report, bench::RunInProcess(o));
    }
    progress.Finish();
    Print(bench::ToJson(report), bench::ToHuman(report));
    return Outcome::kSuccess;
  }

 private:
  // Every combination error is found before any image is made.
  Status Validate() {
    bool remote = !uri_.empty();
    if (remote && !dir_.empty())
      return Status::InvalidArgument("--uri and a DIR exclude each other");
    TD_RETURN_IF_ERROR(ValidatePool());
    if (remote && (!option_strings_.empty() || !cluster_size_text_.empty() ||
                   !extended_l2_text_.empty())) {
      return Status::InvalidArgument(
          "-o, --cluster-size and --extended-l2 shape in-process images; "
          "with --uri the server's image is used as it is");
    }
    if (remote && seed_demo_)
      return Status::InvalidArgument("--seed-demo runs in-process only (drop --uri)");
    if (!latency_text_.empty()) {
      if (remote) {
        return Status::InvalidArgument(
            "--latency slows in-process images; with --uri the server's "
            "storage is used as it is (drop --latency)");
      }
      if (seed_demo_) {
        return Status::InvalidArgument(
            "--seed-demo reproduces the seed on real storage; "
            "drop --latency");
      }
      TD_ASSIGN_OR_RETURN(latency_, bench::ParseDuration(latency_text_, "--latency"));
    }
    if (!remote && (server_pid_ != 0 || !image_.empty())) {
      return Status::InvalidArgument(
          "--server-pid and --image describe an NBD server: they need --uri");
    }
    if (server_pid_ < 0)
      return Status::InvalidArgument("--server-pid must be a process id");
    if (!size_text_.empty()) {
      TD_ASSIGN_OR_RETURN(uint64_t size, ParseSize(size_text_));
      if (size < (1u << 20) || size % 4096 != 0) {
        return Status::InvalidArgument(
            "--size must be at least 1 MiB and a multiple of 4 KiB, not '" + size_text_ +
            "'");
      }
      size_ = size;
    }
    if (workloads_text_.empty()) {
      workloads_text_ = remote ? "W1,W2,W3,W4" : "W1,W2,W3,W4,W5,W6";
    } else if (seed_demo_) {
      return Status::InvalidArgument("--seed-demo runs its own passes; drop --workloads");
    }
    TD_ASSIGN_OR_RETURN(workloads_, bench::ParseWorkloads(workloads_text_));
    if (remote) {
      for (bench::Workload w : workloads_) {
        if (w == bench::Workload::kW5CloneWrite || w == bench::Workload::kW6Compress) {
          return Status::InvalidArgument(
              std::string(bench::WorkloadId(w)) +
              " creates images, so it runs in-process only (drop --uri)");
        }
        if (w == bench::Workload::kW9RandRead) {
          return Status::InvalidArgument("W9 runs in-process only (drop --uri)");
        }
      }
    }
    if (!remote && !seed_demo_) TD_RETURN_IF_ERROR(Layout().status());
    return Status::Ok();
  }

  // A rados:// DIR must name a pool; what needs local files refuses it.
  Status ValidatePool() const {
    if (io::IsRbdName(dir_)) {
      return Status::InvalidArgument(dir_ +
                                     ": bench makes thindisk images, not RBD ones; "
                                     "give the pool as rados://POOL");
    }
    if (!io::IsRadosName(dir_)) return Status::Ok();
    TD_RETURN_IF_ERROR(io::ParseRadosPool(dir_).status());
    if (seed_demo_) {
      return Status::InvalidArgument(
          "--seed-demo reproduces the seed on local files; give a "
          "directory, not " +
          dir_);
    }
    if (!latency_text_.empty()) {
      return Status::InvalidArgument(
          "--latency slows local images; a rados:// pool is "
          "measured with its own latency (drop --latency)");
    }
    return Status::Ok();
  }

  Result<qcow2::CreateOptions> Layout() const {
    CreatePlan plan;
    plan.format = "qcow2";
    TD_RETURN_IF_ERROR(ApplyCreateOptions(plan, option_strings_));
    if (!plan.backing_file.empty()) {
      return Status::InvalidArgument(
          "bench makes its own images: -o backing_file is not allowed");
    }
    if (!cluster_size_text_.empty())
      TD_RETURN_IF_ERROR(ApplyCreateOption(plan, "cluster_size", cluster_size_text_));
    if (!extended_l2_text_.empty())
      TD_RETURN_IF_ERROR(ApplyCreateOption(plan, "extended_l2", extended_l2_text_));
    DefaultExtendedL2(plan);
    if (plan.qcow2.extended_l2 && plan.qcow2.cluster_size < qcow2::kMinExtendedL2ClusterSize) {
      return Status::InvalidArgument(
          "extended_l2=on needs clusters of at least 16 KiB (add --extended-l2 off)");
    }
    return plan.qcow2;
  }

  std::string Dir() const {
    if (!dir_.empty()) return dir_;
    return access("/var/tmp", W_OK) == 0 ? "/var/tmp" : ".";
  }

  void Print(const nlohmann::json& json, const std::string& human) const {
    if (output_ == "json") {
      std::cout << json.dump(2) << std::endl;
    } else {
      std::cout << human << std::flush;
    }
  }

  std::string dir_;
  std::string uri_;
  std::vector<std::string> option_strings_;
  std::string cluster_size_text_;
  std::string extended_l2_text_;
  std::string workloads_text_;
  std::vector<bench::Workload> workloads_;
  std::string size_text_;
  std::optional<uint64_t> size_;
  uint32_t qd_ = 16;
  uint64_t seed_ = 1;
  double runtime_ = 0;
  uint64_t max_ops_ = 0;
  std::string latency_text_;
  std::chrono::microseconds latency_{0};
  std::string output_ = "human";
  pid_t server_pid_ = 0;
  std::string image_;
  bool seed_demo_ = false;
  bool progress_ = false;
  bool quiet_ = false;
  bool keep_ = false;
};

}  // namespace

std::unique_ptr<Subcommand> NewBenchCommand() { return std::make_unique<BenchCommand>(); }

}  // namespace thindisk::cli
