#include "bench/seed_demo.h"

#include <fmt/format.h>

#include <memory>

#include "bench/bench_image.h"
#include "bench/runner.h"

namespace thindisk::bench {
namespace {

constexpr uint32_t kDdSmall = 1024;
constexpr uint32_t kDdLarge = 1 << 20;

std::string Human(uint64_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= 1024 && bytes % 1024 == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

std::string Duration(double us) {
  if (us < 1000) return fmt::format("{:.1f} us", us);
  if (us < 1e6) return fmt::format("{:.2f} ms", us / 1000);
  return fmt::format("{:.2f} s", us / 1e6);
}

Result<SeedLayout> RunLayout(const SeedDemoOptions& o, ScratchDir& dir, const std::string& name,
                             uint32_t cluster_size, bool extended_l2) {
  qcow2::CreateOptions layout;
  layout.cluster_size = cluster_size;
  layout.extended_l2 = extended_l2;
  layout.size = VirtualSizeFor(2 * o.size);
  std::string path = dir.File(name + ".qcow2");
  TD_RETURN_IF_ERROR(CreateQcow2(path, layout));
  auto counters = std::make_shared<HostCounters>();
  TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> device, OpenCounted(path, counters));

  SeedLayout out;
  out.name = name;
  out.cluster_size = cluster_size;
  out.extended_l2 = extended_l2;
  const char* names[3] = {"1 KiB sequential writes into a fresh disk (dd bs=1k)",
                          "the same 1 KiB writes again (dd bs=1k over written space)",
                          "1 MiB writes into fresh space, then flush (dd bs=1M conv=fdatasync)"};
  for (int pass = 0; pass < 3; ++pass) {
    uint32_t block = pass < 2 ? kDdSmall : kDdLarge;
    std::vector<Op> ops = SequentialOps(pass < 2 ? 0 : o.size, o.size, block);
    ProgressFn progress;
    if (o.progress) {
      std::string label = name + " pass " + std::to_string(pass + 1);
      progress = [&o, label](uint64_t d, uint64_t t) { o.progress(label, d, t); };
    }
    uint64_t host0 = counters->bytes_written.load();
    uint64_t data0 = counters->data_bytes.load();
    uint64_t fill0 = counters->fill_bytes.load();
    uint64_t meta0 = counters->metadata_bytes.load();
    block::Device& d = *device;
    OpFn write = [&d](const Op& op, std::span<uint8_t> buf) { return d.Write(op.offset, buf); };
    std::function<Status()> flush = [&d] { return d.Flush(); };
    TD_ASSIGN_OR_RETURN(PhaseRun run, RunThreaded(ops, 1, 1, RunLimits{}, progress, write,
                                                  pass == 2 ? flush : nullptr));
    // dd's figure has no flush in passes 1-2; the page cache writes the
    // metadata back later all the same, so it is charged to the pass.
    if (pass < 2) TD_RETURN_IF_ERROR(device->Flush());
    SeedPass p;
    p.name = names[pass];
    p.block_size = block;
    p.bytes = run.bytes;
    p.seconds = run.seconds;
    p.kb_per_s = run.seconds > 0 ? double(run.bytes) / run.seconds / 1000 : 0;
    p.host_bytes_written = counters->bytes_written.load() - host0;
    p.write_amplification = run.bytes ? double(p.host_bytes_written) / double(run.bytes) : 0;
    p.data_bytes = counters->data_bytes.load() - data0;
    p.fill_bytes = counters->fill_bytes.load() - fill0;
    p.metadata_bytes = counters->metadata_bytes.load() - meta0;
    p.speed_explanation = ExplainSpeed(pass, p);
    p.amplification_explanation = ExplainAmplification(pass, cluster_size, extended_l2, p);
    out.passes.push_back(std::move(p));
  }
  TD_RETURN_IF_ERROR(device->Close());
  return out;
}

}  // namespace

std::string ExplainSpeed(int pass, const SeedPass& p) {
  if (p.kb_per_s <= 0 || p.block_size == 0 || p.bytes == 0) return "Not measured (the pass took no time).";
  // 1. The figures: time per request, and the host bytes written inside
  //    the requests (data and fill; the metadata of passes 0-1 is written
  //    by the untimed flush after them, so it cannot explain their time).
  const double request_us = double(p.block_size) * 1000 / p.kb_per_s;
  const double seed_us = 1024 * 1000 / kSeedKbPerS;  // the seed's dd bs=1k
  const double in_request = double(p.data_bytes + p.fill_bytes) / double(p.bytes);
  const std::string block = Human(p.block_size);
  const std::string paid = fmt::format("{:.0f} host bytes of data and fill per {} write ({:.2f}x)",
                                       in_request * p.block_size, block, in_request);
  if (pass == 2) {
    // 2. The flushed 1 MiB pass reads as the disk's bandwidth; a 1 KiB
    //    write at that bandwidth costs its transfer time, no more.
    const double transfer_us = 1024 * 1000 / p.kb_per_s;
    std::string out = fmt::format(
        "{:.1f} MB/s, {} per {} write, timed to the end of the flush that makes the data and then the "
        "metadata durable: about what the host disk sustains. ",
        p.kb_per_s / 1000, Duration(request_us), block);
    if (p.kb_per_s > kSeedKbPerS) {
      out += fmt::format("At this bandwidth 1 KiB takes {} to transfer, and a 1 KiB write at the seed's "
                         "{:.0f} kB/s took {}, {:.1f}x that: the seed paid a cost per request (a disk "
                         "round trip or a cluster fill each), not bandwidth.",
                         Duration(transfer_us), kSeedKbPerS, Duration(seed_us), seed_us / transfer_us);
    } else {
      out += fmt::format("This disk's bandwidth is itself no more than the seed's {:.0f} kB/s: here the "
                         "seed's figure would be the disk's, not the format's.",
                         kSeedKbPerS);
    }
    return out;
  }
  // 3. The 1 KiB passes: against the seed's rate, then where the time went.
  const double ratio = p.kb_per_s / kSeedKbPerS;
  std::string out = fmt::format("{:.0f} kB/s, {} per {} write: {} the seed's {:.0f} kB/s ({} per 1 KiB write). ",
                                p.kb_per_s, Duration(request_us), block,
                                ratio >= 1 ? fmt::format("{:.1f}x", ratio) : fmt::format("{:.0f}% of", ratio * 100),
                                kSeedKbPerS, Duration(seed_us));
  if (request_us < kNoDiskWaitUs) {
    out += pass == 0
               ? fmt::format("No request waited on the disk (dd without oflag issues no sync): each is the "
                             "engine's mapping lookup and first-touch allocation plus a copy into the page "
                             "cache, at {}, so the seed's cost per write is not paid.",
                             paid)
               : fmt::format("No request waited on the disk: rewrites of allocated space change no mapping, "
                             "so this is the in-place write path into the page cache, at {}.",
                             paid);
  } else if (in_request >= kCostlyAmplification) {
    out += fmt::format("Requests waited on the disk and each paid {}: more than the page cache absorbs, so "
                       "the extra host bytes, not the engine, set this rate, as in the seed.",
                       paid);
  } else {
    out += fmt::format("Requests waited, yet each paid only {}: the time went to the host (page-cache "
                       "writeback throttling, a slow or busy disk), not to bytes this engine added.",
                       paid);
  }
  return out;
}

std::string ExplainAmplification(int pass, uint32_t cluster_size, bool extended_l2, const SeedPass& p) {
  const std::string c = Human(cluster_size);
  std::string why;
  if (p.fill_bytes > 0) {
    why = extended_l2
              ? fmt::format("the first write into each untouched {} subcluster writes the whole subcluster, "
                            "its new bytes with zeros for the rest ({} bytes so written), so no stale byte "
                            "is ever readable, and no other part of the {} cluster is touched",
                            Human(cluster_size / 32), p.fill_bytes, c)
              : fmt::format("first writes write the whole {} cluster, the new bytes with zeros or copied "
                            "data around them ({} bytes so written)",
                            c, p.fill_bytes);
  } else if (pass == 0) {
    why = extended_l2
              ? fmt::format("a first write into a fresh {} subcluster past the end of the file writes only "
                            "its own bytes, since fresh host space already reads as zeros (a clone or "
                            "reused space would have the rest of the subcluster filled, never the whole "
                            "{} cluster)",
                            Human(cluster_size / 32), c)
              : fmt::format("a first write into a fresh {} cluster past the end of the file writes only "
                            "its own bytes, since fresh host space already reads as zeros (a clone "
                            "or reused space would have the whole cluster copied, as qemu does)",
                            c);
  } else if (pass == 1) {
    why = "rewrites of allocated space land in place and change no mapping";
  } else {
    why = "whole-megabyte writes into fresh space need no fill";
  }
  std::string meta;
  if (p.metadata_bytes > 0) {
    meta = fmt::format("; the other {} bytes are metadata written at the flush (L2 tables and refcount "
                       "blocks are written whole, {} each, which weighs more the larger the clusters and "
                       "the shorter the run)",
                       p.metadata_bytes, c);
  }
  return fmt::format("{:.2f}x: {}{}.", p.write_amplification, why, meta);
}

Result<SeedDemo> RunSeedDemo(const SeedDemoOptions& o) {
  TD_ASSIGN_OR_RETURN(std::unique_ptr<ScratchDir> dir, ScratchDir::Create(o.dir));
  SeedDemo demo;
  demo.size = o.size;
  TD_ASSIGN_OR_RETURN(SeedLayout def, RunLayout(o, *dir, "thindisk-default", 128 * 1024, true));
  demo.layouts.push_back(std::move(def));
  TD_ASSIGN_OR_RETURN(SeedLayout big, RunLayout(o, *dir, "large-clusters", 2 * 1024 * 1024, false));
  demo.layouts.push_back(std::move(big));
  return demo;
}

}  // namespace thindisk::bench
