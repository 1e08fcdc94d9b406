#include "bench/in_process.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "bench/proc_stats.h"
#include "bench/scratch.h"

namespace thindisk::bench {
namespace {

constexpr uint32_t kSmallBlock = 4096;
constexpr uint32_t kLargeBlock = 1 << 20;
constexpr uint64_t kMaxCompressCorpus = 256ull << 20;

// One open image, closed (flushed) on Close. Its host figures are its top
// storage's (Scratch: HostStorage), whether counted by the wrappers or by
// the pool's storage itself.
struct Bench {
  std::shared_ptr<HostCounters> counters = std::make_shared<HostCounters>();
  std::unique_ptr<block::Device> device;
  io::Storage* host = nullptr;
  std::string key;  // the image's name in the scratch ("w2-qd1")
};

class InProcessRun {
 public:
  InProcessRun(const InProcessOptions& o, Scratch& scratch) : o_(o), scratch_(scratch) {}

  Status Run(Report& report) {
    auto wants = [&](Workload w) {
      return std::find(o_.workloads.begin(), o_.workloads.end(), w) != o_.workloads.end();
    };
    if (wants(Workload::kW1SeqRead)) TD_RETURN_IF_ERROR(W1(report));
    if (wants(Workload::kW2FirstWrite) || wants(Workload::kW3Rewrite)) {
      TD_RETURN_IF_ERROR(
          W2W3(report, wants(Workload::kW2FirstWrite), wants(Workload::kW3Rewrite)));
    }
    if (wants(Workload::kW4SeqWrite)) TD_RETURN_IF_ERROR(W4(report));
    if (wants(Workload::kW5CloneWrite)) TD_RETURN_IF_ERROR(W5(report));
    if (wants(Workload::kW6Compress)) TD_RETURN_IF_ERROR(W6(report));
    if (wants(Workload::kW9RandRead)) TD_RETURN_IF_ERROR(W9(report));
    return Status::Ok();
  }

 private:
  Result<Bench> Fresh(const std::string& key, qcow2::CreateOptions layout) {
    layout.size = VirtualSizeFor(o_.size);
    Bench b;
    b.key = key;
    TD_RETURN_IF_ERROR(scratch_.CreateImage(key, layout));
    TD_ASSIGN_OR_RETURN(b.device, scratch_.Open(key, b.counters, o_.latency));
    TD_ASSIGN_OR_RETURN(b.host, HostStorage(*b.device));
    return b;
  }

  ProgressFn Progress(const std::string& label) {
    if (!o_.progress) return nullptr;
    return
        [this, label](uint64_t done, uint64_t total) { o_.progress(label, done, total); };
  }

  static OpFn Writer(block::Device& d) {
    return [&d](const Op& op, std::span<uint8_t> buf) { return d.Write(op.offset, buf); };
  }
  static OpFn Reader(block::Device& d) {
    return [&d](const Op& op, std::span<uint8_t> buf) { return d.Read(op.offset, buf); };
  }
  static std::function<Status()> Flusher(block::Device& d) {
    return [&d] { return d.Flush(); };
  }

  // Runs one phase on `b` and fills in every figure it can: speed and
  // latency, host bytes and CPU charged to it, and (for writes) space
  // amplification over `footprint` distinct guest bytes.
  Result<WorkloadResult> Measure(Workload w, const std::string& variant, uint32_t qd,
                                 Bench& b, const std::vector<Op>& ops, const OpFn& fn,
                                 bool writes, uint64_t footprint,
                                 PhaseRun* run_out = nullptr) {
    uint64_t host0 = b.host->bytes_written();
    ProcessCost cpu0 = SelfCost();
    TD_ASSIGN_OR_RETURN(PhaseRun run,
                        RunThreaded(ops, qd, o_.seed, o_.limits,
                                    Progress(std::string(WorkloadId(w)) + " " + variant),
                                    fn, writes ? Flusher(*b.device) : nullptr));
    ProcessCost cpu1 = SelfCost();
    WorkloadResult r;
    r.id = std::string(WorkloadId(w));
    r.title = std::string(WorkloadTitle(w));
    r.variant = variant;
    r.qd = qd;
    r.figures = run.Figures();
    r.flush_seconds = run.finish_seconds;
    if (run.executed > 0) {
      r.cpu_us_per_op =
          (cpu1.cpu_seconds - cpu0.cpu_seconds) * 1e6 / double(run.executed);
      r.cpu_source = "self";
    }
    TD_ASSIGN_OR_RETURN(uint64_t allocated, b.host->AllocatedBytes());
    r.allocated_bytes = allocated;
    if (writes && run.bytes > 0) {
      uint64_t host = b.host->bytes_written() - host0;
      r.host_bytes_written = host;
      r.write_amplification = double(host) / double(run.bytes);
      uint64_t guest = footprint ? std::min(footprint, run.bytes) : run.bytes;
      r.space_amplification = double(allocated) / double(guest);
    }
    if (run_out) *run_out = std::move(run);
    return r;
  }

  Status W1(Report& report) {
    TD_ASSIGN_OR_RETURN(Bench b, Fresh("w1", o_.layout));
    std::vector<Op> ops = SequentialOps(0, o_.size, kLargeBlock);
    TD_ASSIGN_OR_RETURN(WorkloadResult r,
                        Measure(Workload::kW1SeqRead, "qd" + std::to_string(o_.qd), o_.qd,
                                b, ops, Reader(*b.device), false, 0));
    report.results.push_back(std::move(r));
    return Close(b);
  }

  Status W2W3(Report& report, bool w2, bool w3) {
    std::vector<Op> ops = RandomOps(o_.size, kSmallBlock, o_.seed);
    if (w2 && o_.qd > 1) {
      TD_ASSIGN_OR_RETURN(Bench b, Fresh("w2-qd1", o_.layout));
      TD_ASSIGN_OR_RETURN(WorkloadResult r, Measure(Workload::kW2FirstWrite, "qd1", 1, b,
                                                    ops, Writer(*b.device), true, 0));
      report.results.push_back(std::move(r));
      TD_RETURN_IF_ERROR(Close(b));
    }
    TD_ASSIGN_OR_RETURN(Bench b, Fresh("w2", o_.layout));
    std::string variant = "qd" + std::to_string(o_.qd);
    PhaseRun first;
    TD_ASSIGN_OR_RETURN(WorkloadResult r,
                        Measure(Workload::kW2FirstWrite, variant, o_.qd, b, ops,
                                Writer(*b.device), true, 0, &first));
    if (w2) report.results.push_back(std::move(r));
    if (w3) {
      // Exactly the writes W2 made, so every one lands on allocated space.
      std::vector<Op> again(ops.begin(), ops.begin() + ptrdiff_t(first.executed));
      TD_ASSIGN_OR_RETURN(WorkloadResult r3,
                          Measure(Workload::kW3Rewrite, variant, o_.qd, b, again,
                                  Writer(*b.device), true, first.bytes));
      report.results.push_back(std::move(r3));
    }
    return Close(b);
  }

  Status W4(Report& report) {
    TD_ASSIGN_OR_RETURN(Bench b, Fresh("w4", o_.layout));
    std::vector<Op> ops = SequentialOps(0, o_.size, kLargeBlock);
    TD_ASSIGN_OR_RETURN(WorkloadResult r,
                        Measure(Workload::kW4SeqWrite, "qd" + std::to_string(o_.qd),
                                o_.qd, b, ops, Writer(*b.device), true, 0));
    report.results.push_back(std::move(r));
    return Close(b);
  }

  Status W5(Report& report) {
    // The base is set-up, not measured: written in full, then closed.
    {
      TD_ASSIGN_OR_RETURN(Bench base, Fresh("w5-base", o_.layout));
      RunLimits unlimited;
      TD_ASSIGN_OR_RETURN(PhaseRun fill,
                          RunThreaded(SequentialOps(0, o_.size, kLargeBlock), o_.qd,
                                      o_.seed + 5, unlimited, Progress("W5 base"),
                                      Writer(*base.device), Flusher(*base.device)));
      (void)fill;
      TD_RETURN_IF_ERROR(Close(base, /*remove=*/false));
    }
    qcow2::CreateOptions overlay = o_.layout;
    overlay.backing_file = scratch_.BackingName("w5-base");  // beside the overlay
    overlay.backing_format = "qcow2";
    TD_ASSIGN_OR_RETURN(Bench b, Fresh("w5-overlay", overlay));
    std::vector<Op> ops = RandomOps(o_.size, kSmallBlock, o_.seed + 5);
    TD_ASSIGN_OR_RETURN(WorkloadResult r,
                        Measure(Workload::kW5CloneWrite, "qd" + std::to_string(o_.qd),
                                o_.qd, b, ops, Writer(*b.device), true, 0));
    report.results.push_back(std::move(r));
    TD_RETURN_IF_ERROR(Close(b));
    scratch_.Remove("w5-base");
    return Status::Ok();
  }

  Status W6(Report& report) {
    const uint32_t cluster = o_.layout.cluster_size;
    uint64_t bytes = std::min(o_.size, kMaxCompressCorpus);
    bytes = std::max<uint64_t>(bytes - bytes % cluster, cluster);
    for (bool text : {true, false}) {
      std::vector<uint8_t> corpus;
      if (text) {
        corpus = TextCorpus(o_.seed, bytes);
      } else {
        corpus.resize(bytes);
        FillRandom(o_.seed + 6, corpus);
      }
      for (qcow2::CompressionType type :
           {qcow2::CompressionType::kZlib, qcow2::CompressionType::kZstd}) {
        bool zlib = type == qcow2::CompressionType::kZlib;
        std::string variant =
            std::string(zlib ? "zlib " : "zstd ") + (text ? "text" : "random");
        qcow2::CreateOptions layout = o_.layout;
        layout.compression_type = type;
        TD_ASSIGN_OR_RETURN(
            Bench b,
            Fresh("w6-" + variant.substr(0, 4) + (text ? "-text" : "-random"), layout));
        auto* image = static_cast<qcow2::Image*>(b.device.get());  // HostStorage checked
        TD_ASSIGN_OR_RETURN(uint64_t size0, b.host->AllocatedBytes());
        OpFn fn = [image, &corpus](const Op& op, std::span<uint8_t>) {
          return image->WriteCompressed(
              op.offset, std::span<const uint8_t>(corpus.data() + op.offset, op.length));
        };
        TD_ASSIGN_OR_RETURN(WorkloadResult r,
                            Measure(Workload::kW6Compress, variant, o_.qd, b,
                                    SequentialOps(0, bytes, cluster), fn, true, 0));
        TD_ASSIGN_OR_RETURN(uint64_t size1, b.host->AllocatedBytes());
        // Output is what the data costs on the host (allocated bytes), not
        // the file's length, which may include holes.
        if (r.figures.bytes > 0 && size1 >= size0) {
          r.output_bytes = size1 - size0;
          r.output_ratio = double(size1 - size0) / double(r.figures.bytes);
        }
        report.results.push_back(std::move(r));
        TD_RETURN_IF_ERROR(Close(b));
      }
    }
    return Status::Ok();
  }

  Status W9(Report& report) {
    TD_ASSIGN_OR_RETURN(Bench b, Fresh("w9", o_.layout));
    // Set-up, not measured: every block written, so every read finds data
    // (and the engine's tables for it are loaded, as on a disk in use).
    RunLimits unlimited;
    TD_ASSIGN_OR_RETURN(
        PhaseRun fill,
        RunThreaded(SequentialOps(0, o_.size, kLargeBlock), o_.qd, o_.seed + 9, unlimited,
                    Progress("W9 fill"), Writer(*b.device), Flusher(*b.device)));
    (void)fill;
    std::vector<Op> ops = RandomOps(o_.size, kSmallBlock, o_.seed + 9);
    std::vector<uint32_t> depths = {1};
    if (o_.qd > 1) depths.push_back(o_.qd);
    for (uint32_t qd : depths) {
      std::string variant = "qd" + std::to_string(qd);
      TD_ASSIGN_OR_RETURN(WorkloadResult r, Measure(Workload::kW9RandRead, variant, qd, b,
                                                    ops, Reader(*b.device), false, 0));
      report.results.push_back(std::move(r));
    }
    return Close(b);
  }

  // Closes (flushes) the image and, unless kept, removes it.
  Status Close(Bench& b, bool remove = true) {
    Status s = b.device->Close();
    b.device.reset();
    b.host = nullptr;
    if (remove) scratch_.Remove(b.key);
    return s;
  }

  const InProcessOptions& o_;
  Scratch& scratch_;
};

}  // namespace

uint64_t VirtualSizeFor(uint64_t size) {
  constexpr uint64_t kDesignSize = 4ull << 30;
  constexpr uint64_t kAlign = 2ull << 20;  // any allowed cluster size divides it
  uint64_t v = std::max(size, kDesignSize);
  return (v + kAlign - 1) / kAlign * kAlign;
}

Result<Report> RunInProcess(const InProcessOptions& options) {
  TD_ASSIGN_OR_RETURN(std::unique_ptr<Scratch> scratch, OpenScratch(options.dir));
  scratch->set_keep(options.keep_images);
  Report report;
  report.size = options.size;
  report.qd = options.qd;
  report.seed = options.seed;
  report.has_layout = true;
  report.cluster_size = options.layout.cluster_size;
  report.extended_l2 = options.layout.extended_l2;
  report.latency_us = uint64_t(options.latency.count());
  InProcessRun run(options, *scratch);
  TD_RETURN_IF_ERROR(run.Run(report));
  return report;
}

}  // namespace thindisk::bench
