#include "bench/report.h"

#include <gtest/gtest.h>

namespace thindisk::bench {
namespace {

WorkloadResult SampleWrite() {
  WorkloadResult r;
  r.id = "W2";
  r.title = "4 KiB random first writes";
  r.variant = "qd16";
  r.qd = 16;
  LatencyLog log;
  for (uint64_t i = 1; i <= 10; ++i) log.Add(i * 1000);
  r.figures = Summarize(10, 40960, 0.5, log);
  r.flush_seconds = 0.1;
  r.space_amplification = 1.02;
  r.allocated_bytes = 41000;
  r.write_amplification = 1.05;
  r.host_bytes_written = 43000;
  r.cpu_us_per_op = 3.5;
  r.cpu_source = "self";
  return r;
}

TEST(ReportJsonTest, HasEveryFieldWithTheRightTypes) {
  Report report;
  report.size = 4 << 20;
  report.qd = 16;
  report.seed = 1;
  report.has_layout = true;
  report.cluster_size = 131072;
  report.extended_l2 = true;
  report.results.push_back(SampleWrite());
  WorkloadResult read = SampleWrite();
  read.id = "W1";
  read.space_amplification.reset();
  read.write_amplification.reset();
  read.host_bytes_written.reset();
  report.results.push_back(read);

  nlohmann::json j = ToJson(report);
  EXPECT_EQ(j["target"], "in-process");
  EXPECT_EQ(j["layout"]["cluster_size"], 131072);
  EXPECT_EQ(j["layout"]["extended_l2"], true);
  ASSERT_EQ(j["results"].size(), 2u);
  const nlohmann::json& w2 = j["results"][0];
  for (const char* key : {"ops", "bytes", "qd"}) EXPECT_TRUE(w2[key].is_number_unsigned()) << key;
  for (const char* key : {"seconds", "mb_per_s", "iops", "p50_us", "p99_us", "space_amplification",
                          "write_amplification", "cpu_us_per_op"}) {
    EXPECT_TRUE(w2[key].is_number()) << key;
  }
  EXPECT_DOUBLE_EQ(w2["iops"].get<double>(), 20.0);
  EXPECT_DOUBLE_EQ(w2["p50_us"].get<double>(), 5.0);
  EXPECT_EQ(w2["cpu_source"], "self");
  // Not measured is null, not 0, so a reader can tell the two apart.
  const nlohmann::json& w1 = j["results"][1];
  EXPECT_TRUE(w1.contains("write_amplification"));
  EXPECT_TRUE(w1["write_amplification"].is_null());
  EXPECT_TRUE(w1["output_ratio"].is_null());
}

TEST(ReportJsonTest, RemoteHasNoLayout) {
  Report report;
  report.target = "nbd+unix:///?socket=/tmp/s";
  nlohmann::json j = ToJson(report);
  EXPECT_FALSE(j.contains("layout"));
  EXPECT_FALSE(j.contains("latency_us"));
  EXPECT_TRUE(j["results"].is_array());
}

TEST(ReportTest, LatencyIsASettingInJsonAndHuman) {
  Report report;
  report.latency_us = 1000;
  EXPECT_EQ(ToJson(report)["latency_us"], 1000);
  EXPECT_NE(ToHuman(report).find(", latency 1ms\n"), std::string::npos) << ToHuman(report);
  report.latency_us = 500;
  EXPECT_NE(ToHuman(report).find(", latency 500us\n"), std::string::npos) << ToHuman(report);
  report.latency_us = 0;
  EXPECT_EQ(ToJson(report)["latency_us"], 0);
  EXPECT_NE(ToHuman(report).find(", latency 0\n"), std::string::npos) << ToHuman(report);
}

TEST(ReportJsonTest, SeedDemoShape) {
  SeedDemo demo;
  demo.size = 1 << 20;
  SeedLayout l;
  l.name = "thindisk-default";
  l.cluster_size = 131072;
  l.extended_l2 = true;
  SeedPass p;
  p.name = "1 KiB";
  p.block_size = 1024;
  p.kb_per_s = 1234.5;
  p.write_amplification = 1.75;
  p.speed_explanation = "why fast";
  p.amplification_explanation = "why 1.75";
  l.passes.push_back(p);
  demo.layouts.push_back(l);
  nlohmann::json j = ToJson(demo);
  ASSERT_EQ(j["seed_demo"]["layouts"].size(), 1u);
  const nlohmann::json& pass = j["seed_demo"]["layouts"][0]["passes"][0];
  EXPECT_DOUBLE_EQ(pass["kb_per_s"].get<double>(), 1234.5);
  EXPECT_EQ(pass["amplification_explanation"], "why 1.75");
  std::string human = ToHuman(demo);
  EXPECT_NE(human.find("why fast"), std::string::npos);
  EXPECT_NE(human.find("1.75 x write amplification"), std::string::npos);
}

TEST(ReportHumanTest, OneRowPerResultAndDashesForMissing) {
  Report report;
  report.results.push_back(SampleWrite());
  WorkloadResult r = SampleWrite();
  r.id = "W1";
  r.write_amplification.reset();
  report.results.push_back(r);
  std::string text = ToHuman(report);
  EXPECT_NE(text.find("W2  qd16"), std::string::npos) << text;
  EXPECT_NE(text.find("1.05"), std::string::npos);
  EXPECT_NE(text.find(" -  "), std::string::npos);
}

}  // namespace
}  // namespace thindisk::bench
