// Helpers for the engine's qemu-img interop tests: a temp dir per test,
// running shell commands, and the "qemu-img agrees" check.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/posix_storage.h"
#include "qcow2/image_test_util.h"
#include "util/capability_test_util.h"
#include "util/shell_test_util.h"

namespace thindisk::qcow2::testing {

using test_env::RunResult;
using test_env::Shell;

inline bool HaveQemuImg() { return Shell("qemu-img --version").exit_code == 0; }

// A missing qemu-img skips locally, fails in CI (util/capability_test_util.h).
#define REQUIRE_QEMU_IMG() \
  TD_REQUIRE_TOOL("qemu-img", ::thindisk::qcow2::testing::HaveQemuImg())

class InteropTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/td_engine_interop_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  static void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  static std::unique_ptr<Image> OpenImage(const std::string& path, bool read_only) {
    io::OpenOptions fo;
    fo.read_only = read_only;
    auto storage = io::OpenFile(path, fo);
    EXPECT_TRUE(storage.has_value()) << storage.status().ToString();
    if (!storage) return nullptr;
    OpenOptions oo;
    oo.read_only = read_only;
    auto img = Image::Open(std::move(*storage), oo);
    EXPECT_TRUE(img.has_value()) << img.status().ToString();
    return img ? std::move(*img) : nullptr;
  }
  // qemu-img check must be clean; compare must find identical content.
  void ExpectQemuAgrees(const std::string& qcow2, const std::vector<uint8_t>& want) {
    auto check = Shell("qemu-img check " + qcow2);
    EXPECT_EQ(check.exit_code, 0) << check.output;
    EXPECT_EQ(check.output.find("leaked"), std::string::npos) << check.output;
    WriteFile(Path("expected.raw"), want);
    auto cmp = Shell("qemu-img compare -f raw -F qcow2 " + Path("expected.raw") + " " + qcow2);
    EXPECT_EQ(cmp.exit_code, 0) << cmp.output;
  }

  std::string dir_;
};

}  // namespace thindisk::qcow2::testing
