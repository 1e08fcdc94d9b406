// --image-opts as the image tools read it (image_opts.h): the option string
// becomes a file name, a format, a cache mode and a window, and what a tool
// cannot honour is refused before anything is opened.
#include "cli/image_opts.h"

#include <gtest/gtest.h>

#include <vector>

#include "block/device.h"
#include "io/memory_storage.h"
#include "raw/raw_image.h"

namespace thindisk::cli {
namespace {

struct Applied {
  Status status;
  std::string name, format, cache = "writeback";
  ImageWindow window;
};

Applied Apply(std::string text, ImageUse use, bool window = false,
              std::string format = "") {
  Applied a;
  a.name = std::move(text);
  a.format = std::move(format);
  a.status = ApplyImageOpts(&a.name, &a.format, "-f", &a.cache, "thindisk test", use,
                            window ? &a.window : nullptr);
  return a;
}

TEST(ImageOptsTest, NameFormatAndCache) {
  Applied a =
      Apply("driver=qcow2,file.driver=file,file.filename=/d/x.qcow2,cache.direct=on",
            ImageUse::kRead);
  ASSERT_TRUE(a.status.ok()) << a.status.ToString();
  EXPECT_EQ(a.name, "/d/x.qcow2");
  EXPECT_EQ(a.format, "qcow2");
  EXPECT_EQ(a.cache, "none");
  Applied unsafe = Apply("file.filename=y.img,cache.no-flush=on", ImageUse::kWrite);
  ASSERT_TRUE(unsafe.status.ok()) << unsafe.status.ToString();
  EXPECT_EQ(unsafe.name, "y.img");
  EXPECT_EQ(unsafe.format, "");  // probed
  EXPECT_EQ(unsafe.cache, "unsafe");
  Applied plain = Apply("driver=file,filename=z.img", ImageUse::kRead);
  ASSERT_TRUE(plain.status.ok()) << plain.status.ToString();
  EXPECT_EQ(plain.format, "raw");
  EXPECT_EQ(plain.cache, "writeback");  // the tool's flag stays
}

TEST(ImageOptsTest, Window) {
  Applied a =
      Apply("driver=raw,file.filename=d.img,offset=1M,size=4k", ImageUse::kRead, true);
  ASSERT_TRUE(a.status.ok()) << a.status.ToString();
  EXPECT_EQ(a.window.offset, 1u << 20);
  EXPECT_EQ(a.window.size, std::optional<uint64_t>(4096));
  EXPECT_FALSE(a.window.whole());
  Applied none = Apply("driver=raw,file.filename=d.img,offset=1M", ImageUse::kRead);
  ASSERT_FALSE(none.status.ok());
  EXPECT_NE(none.status.message().find("not supported by thindisk test"),
            std::string::npos);
}

TEST(ImageOptsTest, Refusals) {
  struct Bad {
    const char* text;
    ImageUse use;
    const char* says;
  };
  for (const Bad& b :
       {Bad{"driver=qcow2,file.filename=x,read-only=on", ImageUse::kWrite,
            "read-only=on"},
        Bad{"driver=qcow2,file.filename=x,discard=unmap", ImageUse::kWrite, "discard="},
        Bad{"driver=qcow2,file.filename=x,detect-zeroes=on", ImageUse::kWrite,
            "detect-zeroes="},
        Bad{"driver=qcow2,file.filename=x,cache.direct=on,cache.no-flush=on",
            ImageUse::kRead, "cache.direct=on with cache.no-flush=on"},
        Bad{"driver=qcow2,file.filename=x,bogus=1", ImageUse::kRead, "'bogus'"}}) {
    Applied a = Apply(b.text, b.use);
    ASSERT_FALSE(a.status.ok()) << b.text;
    EXPECT_NE(a.status.message().find(b.says), std::string::npos)
        << b.text << ": " << a.status.message();
    EXPECT_EQ(a.name, b.text) << "a refused string is left as it was";
  }
  // What only reads takes read-only=on and the write policies as given.
  EXPECT_TRUE(
      Apply("driver=qcow2,file.filename=x,read-only=on,discard=unmap", ImageUse::kRead)
          .status.ok());
  Applied clash = Apply("driver=qcow2,file.filename=x", ImageUse::kRead, false, "raw");
  ASSERT_FALSE(clash.status.ok());
  EXPECT_NE(clash.status.message().find("--image-opts and -f are mutually exclusive"),
            std::string::npos);
}

// A raw device of `size` bytes, byte i holding i % 251.
std::unique_ptr<block::Device> Numbered(uint64_t size) {
  auto storage = io::NewMemoryStorage();
  std::vector<uint8_t> bytes(size);
  for (uint64_t i = 0; i < size; ++i) bytes[i] = uint8_t(i % 251);
  EXPECT_TRUE(storage->WriteAt(0, bytes).ok());
  auto dev = raw::OpenRaw(std::move(storage), /*read_only=*/true, "numbered");
  EXPECT_TRUE(dev.has_value());
  return std::move(*dev);
}

TEST(ImageOptsTest, OpenWindowShowsTheWindowAndRefusesWhatDoesNotFit) {
  auto whole = OpenWindow("n", Numbered(8192), ImageWindow{});
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ((*whole)->size(), 8192u);

  auto win = OpenWindow("n", Numbered(8192), ImageWindow{1000, 3000});
  ASSERT_TRUE(win.has_value()) << win.status().ToString();
  EXPECT_EQ((*win)->size(), 3000u);
  std::vector<uint8_t> buf(16);
  ASSERT_TRUE((*win)->Read(0, buf).ok());
  EXPECT_EQ(buf[0], uint8_t(1000 % 251));
  EXPECT_FALSE((*win)->Read(2990, buf).ok()) << "a read past the window's end";

  auto tail = OpenWindow("n", Numbered(8192), ImageWindow{4096, std::nullopt});
  ASSERT_TRUE(tail.has_value());
  EXPECT_EQ((*tail)->size(), 4096u);

  auto past = OpenWindow("n", Numbered(8192), ImageWindow{4096, 8192});
  ASSERT_FALSE(past.has_value());
  EXPECT_EQ(past.error().message(),
            "n: offset 4096 + size 8192 is past the image size 8192");
  auto beyond = OpenWindow("n", Numbered(8192), ImageWindow{9000, std::nullopt});
  ASSERT_FALSE(beyond.has_value());
  EXPECT_EQ(beyond.error().message(), "n: offset 9000 is past the image size 8192");
}

}  // namespace
}  // namespace thindisk::cli
