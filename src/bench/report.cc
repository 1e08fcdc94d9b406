#include "bench/report.h"

#include <fmt/format.h>

#include "bench/duration.h"

namespace thindisk::bench {
namespace {

template <typename T>
nlohmann::json OrNull(const std::optional<T>& v) {
  return v.has_value() ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

std::string Fixed(const std::optional<double>& v, int digits) {
  return v.has_value() ? fmt::format("{:.{}f}", *v, digits) : std::string("-");
}

}  // namespace

nlohmann::json ToJson(const Report& report) {
  nlohmann::json j;
  j["target"] = report.target;
  j["size"] = report.size;
  j["qd"] = report.qd;
  j["seed"] = report.seed;
  if (report.has_layout) {
    j["layout"] = {{"cluster_size", report.cluster_size}, {"extended_l2", report.extended_l2}};
  }
  if (report.latency_us.has_value()) j["latency_us"] = *report.latency_us;
  j["results"] = nlohmann::json::array();
  for (const WorkloadResult& r : report.results) {
    const PhaseFigures& f = r.figures;
    j["results"].push_back({
        {"id", r.id},
        {"title", r.title},
        {"variant", r.variant},
        {"qd", r.qd},
        {"ops", f.ops},
        {"bytes", f.bytes},
        {"seconds", f.seconds},
        {"flush_seconds", r.flush_seconds},
        {"mb_per_s", f.mb_per_s},
        {"iops", f.iops},
        {"p50_us", f.p50_us},
        {"p99_us", f.p99_us},
        {"space_amplification", OrNull(r.space_amplification)},
        {"allocated_bytes", OrNull(r.allocated_bytes)},
        {"write_amplification", OrNull(r.write_amplification)},
        {"host_bytes_written", OrNull(r.host_bytes_written)},
        {"cpu_us_per_op", OrNull(r.cpu_us_per_op)},
        {"cpu_source", r.cpu_source.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.cpu_source)},
        {"output_ratio", OrNull(r.output_ratio)},
        {"output_bytes", OrNull(r.output_bytes)},
    });
  }
  return j;
}

nlohmann::json ToJson(const SeedDemo& demo) {
  nlohmann::json layouts = nlohmann::json::array();
  for (const SeedLayout& l : demo.layouts) {
    nlohmann::json passes = nlohmann::json::array();
    for (const SeedPass& p : l.passes) {
      passes.push_back({{"name", p.name},
                        {"block_size", p.block_size},
                        {"bytes", p.bytes},
                        {"seconds", p.seconds},
                        {"kb_per_s", p.kb_per_s},
                        {"write_amplification", p.write_amplification},
                        {"host_bytes_written", p.host_bytes_written},
                        {"data_bytes", p.data_bytes},
                        {"fill_bytes", p.fill_bytes},
                        {"metadata_bytes", p.metadata_bytes},
                        {"speed_explanation", p.speed_explanation},
                        {"amplification_explanation", p.amplification_explanation}});
    }
    layouts.push_back({{"name", l.name},
                       {"cluster_size", l.cluster_size},
                       {"extended_l2", l.extended_l2},
                       {"passes", passes}});
  }
  return {{"seed_demo", {{"size", demo.size}, {"layouts", layouts}}}};
}

std::string ToHuman(const Report& report) {
  std::string out = fmt::format("thindisk bench: target {}, size {} bytes, qd {}, seed {}", report.target,
                                report.size, report.qd, report.seed);
  if (report.has_layout) {
    out += fmt::format(", cluster_size {}, extended_l2 {}", report.cluster_size,
                       report.extended_l2 ? "on" : "off");
  }
  if (report.latency_us.has_value()) {
    out += ", latency " + FormatDuration(std::chrono::microseconds(*report.latency_us));
  }
  out += "\n\n";
  out += fmt::format("{:<3} {:<11} {:>3} {:>10} {:>10} {:>9} {:>9} {:>7} {:>7} {:>9} {:>7}  {}\n", "id",
                     "variant", "qd", "MB/s", "IOPS", "p50 us", "p99 us", "space", "w-amp", "cpu us/op",
                     "out/in", "workload");
  for (const WorkloadResult& r : report.results) {
    const PhaseFigures& f = r.figures;
    out += fmt::format("{:<3} {:<11} {:>3} {:>10.1f} {:>10.0f} {:>9.1f} {:>9.1f} {:>7} {:>7} {:>9} {:>7}  {}\n",
                       r.id, r.variant, r.qd, f.mb_per_s, f.iops, f.p50_us, f.p99_us,
                       Fixed(r.space_amplification, 2), Fixed(r.write_amplification, 2),
                       Fixed(r.cpu_us_per_op, 1), Fixed(r.output_ratio, 3), r.title);
  }
  out +=
      "\nspace = allocated file bytes / guest bytes; w-amp = host bytes written / guest bytes "
      "written (final flush included); cpu = ";
  out += report.target == "in-process" ? "this process's user+system time per op; "
                                       : "server user+system time per op (--server-pid); ";
  out += "out/in = compressed output / input bytes. '-' = not measured.\n";
  return out;
}

std::string ToHuman(const SeedDemo& demo) {
  std::string out = fmt::format(
      "thindisk bench --seed-demo: dd-style writes over {} bytes of a fresh disk, per layout\n", demo.size);
  for (const SeedLayout& l : demo.layouts) {
    out += fmt::format("\n{} (cluster_size {}, extended_l2 {})\n", l.name, l.cluster_size,
                       l.extended_l2 ? "on" : "off");
    for (const SeedPass& p : l.passes) {
      out += fmt::format("  {}\n", p.name);
      out += fmt::format("    {:>12.0f} kB/s\n      {}\n", p.kb_per_s, p.speed_explanation);
      out += fmt::format(
          "    {:>12.2f} x write amplification ({} host bytes for {} guest bytes: {} data, {} fill, "
          "{} metadata)\n      {}\n",
          p.write_amplification, p.host_bytes_written, p.bytes, p.data_bytes, p.fill_bytes, p.metadata_bytes,
          p.amplification_explanation);
    }
  }
  return out;
}

}  // namespace thindisk::bench
