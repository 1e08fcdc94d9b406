// Unix listeners: the socket file appears only once it listens, replaces a
// stale one in one step, keeps any other file, and takes its mode first.
#include "nbd/listener.h"

#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "util/temp_dir_test_util.h"

namespace thindisk::nbd {
namespace {

using test_env::TempDir;

std::set<std::string> Entries(const std::string& dir) {
  std::set<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
      names.insert(e->d_name);
  }
  closedir(d);
  return names;
}

// connect() to the socket at `path`: 0, or the errno.
int ConnectErrno(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 ? 0 : errno;
  close(fd);
  return rc;
}

TEST(ListenUnix, TheFileIsTheListeningSocketAndNothingElseIsLeft) {
  TempDir dir("/tmp", "td-listen");
  const std::string path = dir.path() + "/s.sock";
  auto fd = ListenUnix(path, {.mode = 0600});
  ASSERT_TRUE(fd.has_value()) << fd.status().ToString();
  EXPECT_EQ(Entries(dir.path()), std::set<std::string>{"s.sock"});  // no staging name left
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(ConnectErrno(path), 0);
  close(*fd);
}

TEST(ListenUnix, ReplacesAStaleSocketAndKeepsOtherFiles) {
  TempDir dir("/tmp", "td-listen");
  const std::string path = dir.path() + "/s.sock";
  auto old = ListenUnix(path);
  ASSERT_TRUE(old.has_value());
  close(*old);  // what a killed server leaves: a socket nobody listens on
  EXPECT_EQ(ConnectErrno(path), ECONNREFUSED);
  auto fresh = ListenUnix(path);
  ASSERT_TRUE(fresh.has_value()) << fresh.status().ToString();
  EXPECT_EQ(ConnectErrno(path), 0);
  close(*fresh);

  const std::string file = dir.path() + "/data";
  { std::ofstream(file) << "keep me\n"; }
  auto refused = ListenUnix(file);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument);
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "keep me");
  EXPECT_EQ(Entries(dir.path()), (std::set<std::string>{"data", "s.sock"}));
}

// A path with no room for the staging suffix is bound in place.
TEST(ListenUnix, ALongPathIsBoundDirectly) {
  TempDir dir("/tmp", "td-listen");
  std::string path = dir.path() + "/";
  path += std::string(sizeof(sockaddr_un::sun_path) - 1 - path.size(), 's');
  auto fd = ListenUnix(path);
  ASSERT_TRUE(fd.has_value()) << fd.status().ToString();
  EXPECT_EQ(ConnectErrno(path), 0);
  close(*fd);
  auto too_long = ListenUnix(path + "x");
  EXPECT_EQ(too_long.status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace thindisk::nbd
