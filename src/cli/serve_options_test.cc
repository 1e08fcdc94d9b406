// The qemu-nbd option values `thindisk serve` accepts (serve_options.h):
// every spelling qemu-nbd 7.2 takes maps to the same meaning, and anything
// else is one clear kInvalidArgument naming the option.
#include "cli/serve_options.h"

#include <gtest/gtest.h>

namespace thindisk::cli {
namespace {

using Discard = nbd::FilterOptions::Discard;
using DetectZeroes = nbd::FilterOptions::DetectZeroes;

TEST(ServeOptionsTest, CacheModes) {
  struct Want {
    const char* text;
    io::CacheMode mode;
    bool write_through;
  };
  for (const Want& w : {Want{"writeback", io::CacheMode::kWriteback, false},
                        Want{"none", io::CacheMode::kNone, false},
                        Want{"writethrough", io::CacheMode::kWriteback, true},
                        Want{"directsync", io::CacheMode::kNone, true},
                        Want{"unsafe", io::CacheMode::kUnsafe, false}}) {
    auto c = ParseCacheMode(w.text);
    ASSERT_TRUE(c.has_value()) << w.text;
    EXPECT_EQ(c->mode, w.mode) << w.text;
    EXPECT_EQ(c->write_through, w.write_through) << w.text;
  }
  auto bad = ParseCacheMode("direct");
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.error().message().find("--cache 'direct'"), std::string::npos);
  EXPECT_NE(bad.error().message().find("directsync"), std::string::npos);
}

TEST(ServeOptionsTest, AioNativeIsThreads) {
  EXPECT_EQ(ParseAioMode("threads").value(), AioChoice::kThreads);
  EXPECT_EQ(ParseAioMode("native").value(), AioChoice::kThreads);
  EXPECT_EQ(ParseAioMode("io_uring").value(), AioChoice::kIoUring);
  EXPECT_FALSE(ParseAioMode("uring").has_value());
  EXPECT_FALSE(ParseAioMode("").has_value());
}

TEST(ServeOptionsTest, DiscardAndDetectZeroes) {
  EXPECT_EQ(ParseDiscardMode("ignore").value(), Discard::kIgnore);
  EXPECT_EQ(ParseDiscardMode("off").value(), Discard::kIgnore);
  EXPECT_EQ(ParseDiscardMode("unmap").value(), Discard::kUnmap);
  EXPECT_EQ(ParseDiscardMode("on").value(), Discard::kUnmap);
  EXPECT_FALSE(ParseDiscardMode("trim").has_value());
  EXPECT_EQ(ParseDetectZeroesMode("off").value(), DetectZeroes::kOff);
  EXPECT_EQ(ParseDetectZeroesMode("on").value(), DetectZeroes::kOn);
  EXPECT_EQ(ParseDetectZeroesMode("unmap").value(), DetectZeroes::kUnmap);
  EXPECT_FALSE(ParseDetectZeroesMode("ignore").has_value());

  nbd::FilterOptions f;
  f.detect_zeroes = DetectZeroes::kUnmap;
  f.discard = Discard::kIgnore;
  Status s = CheckFilterOptions(f);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("--discard=unmap"), std::string::npos);
  f.discard = Discard::kUnmap;
  EXPECT_TRUE(CheckFilterOptions(f).ok());
}

TEST(ServeOptionsTest, OffsetsAsQemuNbdReadsThem) {
  EXPECT_EQ(ParseOffset("0").value(), 0u);
  EXPECT_EQ(ParseOffset("1048576").value(), 1048576u);
  EXPECT_EQ(ParseOffset("0x100000").value(), 1048576u);
  EXPECT_EQ(ParseOffset("010").value(), 8u);  // strtoll base 0: octal
  for (const char* bad : {"", "-1", "1M", "1k", " 1", "abc", "99999999999999999999"}) {
    auto r = ParseOffset(bad);
    ASSERT_FALSE(r.has_value()) << "'" << bad << "' parsed";
    EXPECT_NE(r.error().message().find("-o/--offset"), std::string::npos);
  }
}

TEST(ServeOptionsTest, LoadSnapshotSyntax) {
  auto bare = ParseLoadSnapshot("snap1");
  ASSERT_TRUE(bare.has_value());
  EXPECT_EQ(bare->id_or_name, "snap1");
  EXPECT_TRUE(bare->id.empty() && bare->name.empty());

  auto both = ParseLoadSnapshot("snapshot.id=2,snapshot.name=nightly");
  ASSERT_TRUE(both.has_value());
  EXPECT_TRUE(both->id_or_name.empty());
  EXPECT_EQ(both->id, "2");
  EXPECT_EQ(both->name, "nightly");

  auto name = ParseLoadSnapshot("snapshot.name=a,,b");  // ",," is a comma
  ASSERT_TRUE(name.has_value());
  EXPECT_EQ(name->name, "a,b");
  EXPECT_TRUE(name->id.empty());

  EXPECT_FALSE(ParseLoadSnapshot("").has_value());
  auto junk = ParseLoadSnapshot("snapshot.id=1,size=2");
  ASSERT_FALSE(junk.has_value());
  EXPECT_NE(junk.error().message().find("'size'"), std::string::npos);
  // "snapshot." starts the key form, as in qemu: an unknown key is refused,
  // not taken for a name; convert's -l names itself.
  auto unknown = ParseLoadSnapshot("snapshot.foo=1", "-l");
  ASSERT_FALSE(unknown.has_value());
  EXPECT_EQ(
      unknown.error().message(),
      "-l: unknown key 'snapshot.foo' (expected snapshot.id= and/or snapshot.name=)");
  auto dotted = ParseLoadSnapshot("nightly.snapshot");
  ASSERT_TRUE(dotted.has_value());
  EXPECT_EQ(dotted->id_or_name, "nightly.snapshot");
}

TEST(ServeOptionsTest, ImageOptsKeys) {
  auto q = ParseImageOpts(
      "driver=qcow2,file.driver=file,file.filename=/x/disk.qcow2,read-only=on,"
      "cache.direct=on,discard=unmap,detect-zeroes=unmap,file.aio=io_uring");
  ASSERT_TRUE(q.has_value()) << q.status().ToString();
  EXPECT_EQ(q->format, "qcow2");
  EXPECT_EQ(q->filename, "/x/disk.qcow2");
  EXPECT_EQ(q->read_only, std::optional<bool>(true));
  EXPECT_EQ(q->cache_direct, std::optional<bool>(true));
  EXPECT_FALSE(q->cache_no_flush.has_value());
  EXPECT_EQ(q->discard, std::optional<Discard>(Discard::kUnmap));
  EXPECT_EQ(q->detect_zeroes, std::optional<DetectZeroes>(DetectZeroes::kUnmap));
  EXPECT_EQ(q->aio, std::optional<AioChoice>(AioChoice::kIoUring));

  auto raw = ParseImageOpts("driver=raw,offset=1M,size=1M,file.driver=file,file.filename=f.raw");
  ASSERT_TRUE(raw.has_value());
  EXPECT_EQ(raw->format, "raw");
  EXPECT_EQ(raw->offset, 1u << 20);
  EXPECT_EQ(raw->size, std::optional<uint64_t>(1u << 20));

  // No driver: the format is probed (qemu's reading of file.filename= alone).
  auto probed = ParseImageOpts("file.filename=some.img");
  ASSERT_TRUE(probed.has_value()) << probed.status().ToString();
  EXPECT_EQ(probed->format, "");
  EXPECT_EQ(probed->filename, "some.img");

  auto file = ParseImageOpts("driver=file,filename=plain.img,cache.no-flush=on");
  ASSERT_TRUE(file.has_value());
  EXPECT_EQ(file->format, "raw");
  EXPECT_EQ(file->filename, "plain.img");
  EXPECT_EQ(file->cache_no_flush, std::optional<bool>(true));
}

TEST(ServeOptionsTest, ImageOptsRefuseWhatTheyCannotHonour) {
  struct Bad {
    const char* text;
    const char* says;
  };
  for (const Bad& b :
       {Bad{"filename=x", "give driver="},
        Bad{"driver=qcow2,filename=x", "use file.filename="},
        Bad{"driver=file,file.filename=x", "takes filename="},
        Bad{"driver=qcow2", "file.filename= is missing"},
        Bad{"driver=luks,file.filename=x", "driver=luks"},
        Bad{"driver=qcow2,file.driver=nbd,file.filename=x", "file.driver=nbd"},
        Bad{"driver=qcow2,file.filename=x,offset=4096", "need driver=raw"},
        Bad{"driver=qcow2,file.filename=x,file.locking=off", "'file.locking'"},
        Bad{"driver=qcow2,file.filename=x,read-only=maybe", "read-only"}}) {
    auto r = ParseImageOpts(b.text);
    ASSERT_FALSE(r.has_value()) << b.text;
    EXPECT_NE(r.error().message().find(b.says), std::string::npos)
        << b.text << ": " << r.error().message();
  }
}

}  // namespace
}  // namespace thindisk::cli
