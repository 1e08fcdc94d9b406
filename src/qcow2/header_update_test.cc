// Header rewrites: the new fields land, unknown extensions survive, and a
// power cut or a failed write at any step leaves the old header or the new
// one, never a mix (torn writes included).
#include "qcow2/header_update.h"

#include <gtest/gtest.h>

#include "io/faulty_storage.h"
#include "io/memory_storage.h"
#include "qcow2/check.h"
#include "qcow2/image.h"

namespace thindisk::qcow2 {
namespace {

struct Start {
  uint32_t cluster = 65536;
  uint32_t version = 3;
  std::string backing;
  std::string format;
  size_t unknown_bytes = 0;  // an unknown extension of this size, if > 0
};

std::shared_ptr<io::MemoryStorage> MakeImage(const Start& s) {
  std::shared_ptr<io::MemoryStorage> mem = io::NewMemoryStorage("hdr.qcow2");
  CreateOptions o;
  o.size = 4 << 20;
  o.cluster_size = s.cluster;
  o.version = s.version;
  o.extended_l2 = false;
  if (s.version == 2) o.compression_type = CompressionType::kZlib;
  o.backing_file = s.backing;
  o.backing_format = s.format;
  Status st = Create(*mem, o);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (s.unknown_bytes > 0) {
    st = UpdateHeader(*mem, [&](Header& h) {
      h.unknown_extensions.push_back({0x5a5a0001, std::vector<uint8_t>(s.unknown_bytes, 0xab)});
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  return mem;
}

Header Decode(io::Storage& storage) {
  auto hc = ReadHeaderCluster(storage);
  EXPECT_TRUE(hc.has_value()) << hc.status().ToString();
  return hc ? hc->header : Header{};
}

// The fields a rewrite may change, plus the ones it must keep.
bool SameHeader(const Header& a, const Header& b) {
  auto same_ext = [](const std::vector<RawExtension>& x, const std::vector<RawExtension>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i].type != y[i].type || x[i].data != y[i].data) return false;
    }
    return true;
  };
  return a.version == b.version && a.backing_file == b.backing_file &&
         a.backing_format == b.backing_format && a.size == b.size &&
         a.compatible_features == b.compatible_features &&
         a.incompatible_features == b.incompatible_features &&
         a.refcount_order == b.refcount_order && a.l1_table_offset == b.l1_table_offset &&
         a.refcount_table_offset == b.refcount_table_offset &&
         same_ext(a.unknown_extensions, b.unknown_extensions);
}

std::string Describe(const Header& h) {
  return "v" + std::to_string(h.version) + " backing '" + h.backing_file + "' fmt '" +
         h.backing_format + "' unknown " + std::to_string(h.unknown_extensions.size());
}

struct Change {
  const char* name;
  Start start;
  std::function<void(Header&)> edit;
};

std::vector<Change> Changes() {
  auto set_backing = [](std::string n, std::string f) {
    return [n, f](Header& h) {
      h.backing_file = n;
      h.backing_format = n.empty() ? "" : f;
    };
  };
  return {
      {"rename", {65536, 3, "base.qcow2", "qcow2"}, set_backing("a/much/longer/base-name.qcow2", "qcow2")},
      {"flatten", {65536, 3, "base.qcow2", "qcow2"}, set_backing("", "")},
      {"add_backing", {65536, 3, "", ""}, set_backing("new-base.raw", "raw")},
      {"drop_format", {65536, 3, "base.qcow2", "qcow2"}, set_backing("base.qcow2", "")},
      {"add_format", {65536, 3, "base.qcow2", ""}, set_backing("base2.qcow2", "qcow2")},
      {"upgrade", {65536, 2, "base.qcow2", "qcow2"},
       [](Header& h) {
         h.version = 3;
         h.header_length = 112;
         h.feature_names = DefaultFeatureNames();
       }},
      {"downgrade", {65536, 3, "base.qcow2", "qcow2"},
       [](Header& h) {
         h.version = 2;
         h.incompatible_features = 0;
         h.compatible_features = 0;
         h.compression_type = CompressionType::kZlib;
         h.feature_names.clear();
       }},
      {"lazy_on", {4096, 3, "b.qcow2", "qcow2", 40}, [](Header& h) { h.compatible_features |= 1; }},
      {"flatten_unknown", {65536, 3, "base.qcow2", "qcow2", 200}, set_backing("", "")},
      {"add_backing_unknown", {65536, 3, "", "", 200}, set_backing("x.qcow2", "qcow2")},
      {"small_cluster", {512, 3, "base.qcow2", "qcow2"}, set_backing("b.qcow2", "qcow2")},
  };
}

TEST(HeaderUpdateTest, AppliesEveryChangeAndKeepsTheRest) {
  for (const Change& c : Changes()) {
    SCOPED_TRACE(c.name);
    if (c.start.version == 2 && c.start.cluster < 65536) continue;
    auto mem = MakeImage(c.start);
    Header want = Decode(*mem);
    c.edit(want);
    ASSERT_TRUE(RewriteHeader(*mem, want).ok());
    Header got = Decode(*mem);
    EXPECT_TRUE(SameHeader(got, want)) << Describe(got) << " vs " << Describe(want);
    // The image still opens and checks clean.
    auto report = Check(*mem, RepairMode::kNone);
    ASSERT_TRUE(report.has_value()) << report.status().ToString();
    EXPECT_EQ(report->corruptions + report->leaks, 0u);
    OpenOptions oo;
    oo.no_backing = true;
    auto img = Image::Open(mem->Clone(), oo);
    ASSERT_TRUE(img.has_value()) << img.status().ToString();
  }
}

TEST(HeaderUpdateTest, SetBackingFileRemovesFormatWithName) {
  auto mem = MakeImage({65536, 3, "base.qcow2", "qcow2"});
  ASSERT_TRUE(SetBackingFile(*mem, "", "qcow2").ok());
  Header h = Decode(*mem);
  EXPECT_EQ(h.backing_file, "");
  EXPECT_EQ(h.backing_format, "");
  EXPECT_FALSE(SetBackingFile(*mem, std::string(2000, 'x'), "raw").ok());
}

TEST(HeaderUpdateTest, RefusesClusterSizeChange) {
  auto mem = MakeImage({65536, 3, "", ""});
  Header h = Decode(*mem);
  h.cluster_bits = 12;
  EXPECT_EQ(RewriteHeader(*mem, h).code(), Code::kInvalidArgument);
}

TEST(HeaderUpdateTest, ExtensionAreaEndFindsTheEndMarker) {
  auto mem = MakeImage({65536, 3, "base.qcow2", "qcow2"});
  auto hc = ReadHeaderCluster(*mem);
  ASSERT_TRUE(hc.has_value());
  auto encoded = EncodeHeader(hc->header);
  ASSERT_TRUE(encoded.has_value());
  // Encoded: area, then the name right after it.
  EXPECT_EQ(ExtensionAreaEnd(hc->header, hc->bytes) + hc->header.backing_file.size(),
            encoded->size());
}

// Fails (or cuts power at) the n-th header write of each change, for every n
// and every way power loss can treat unflushed writes.
TEST(HeaderUpdateTest, CrashAtAnyStepLeavesOldOrNewHeader) {
  const io::PowerLossMode kModes[] = {io::PowerLossMode::kDropUnflushed,
                                      io::PowerLossMode::kKeepRandomSubset,
                                      io::PowerLossMode::kTearOne, io::PowerLossMode::kTearLast};
  for (const Change& c : Changes()) {
    SCOPED_TRACE(c.name);
    auto mem = MakeImage(c.start);
    Header old_header = Decode(*mem);
    Header new_header = old_header;
    c.edit(new_header);
    // How many header writes the change takes when nothing fails.
    uint64_t steps = 0;
    {
      auto probe = io::NewFaultyStorage(mem->Clone());
      ASSERT_TRUE(probe.has_value());
      ASSERT_TRUE(RewriteHeader(**probe, new_header).ok());
      steps = (*probe)->event_count(io::Event::kHeaderUpdate);
      ASSERT_GE(steps, 1u);
    }
    for (uint64_t nth = 1; nth <= steps; ++nth) {
      for (int variant = 0; variant < 3; ++variant) {
        for (io::PowerLossMode mode : kModes) {
          for (uint64_t seed = 1; seed <= 3; ++seed) {
            SCOPED_TRACE("step " + std::to_string(nth) + " variant " + std::to_string(variant) +
                         " mode " + std::to_string(int(mode)) + " seed " + std::to_string(seed));
            auto faulty = io::NewFaultyStorage(mem->Clone());
            ASSERT_TRUE(faulty.has_value());
            io::FaultyStorage::EventFault f;
            f.event = io::Event::kHeaderUpdate;
            f.nth = nth;
            f.persistent = variant == 0;  // a dead disk from this write on
            f.freeze = variant != 0;      // or a power cut at the step
            f.freeze_after_next = variant == 2;
            (*faulty)->FailAtEvent(f);
            Status s = RewriteHeader(**faulty, new_header);
            auto after = (*faulty)->SimulatePowerLoss(mode, seed);
            ASSERT_TRUE(after.has_value());
            auto hc = ReadHeaderCluster(**after);
            ASSERT_TRUE(hc.has_value()) << hc.status().ToString();
            EXPECT_TRUE(SameHeader(hc->header, old_header) || SameHeader(hc->header, new_header))
                << Describe(hc->header) << "; old " << Describe(old_header) << ", new "
                << Describe(new_header);
            if (s.ok() && variant == 0) {
              // A rewrite that reported success on a disk that then died
              // cannot have happened: the fault was armed inside it.
              ADD_FAILURE() << "rewrite succeeded despite a failed write";
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace thindisk::qcow2
