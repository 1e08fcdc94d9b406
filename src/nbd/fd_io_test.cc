// fd_io's writes: SkipIov's bookkeeping after a partial write, and
// WriteAllV resuming after the partial writes a full socket or pipe
// buffer gives it.
#include "nbd/fd_io.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

namespace thindisk::nbd {
namespace {

TEST(IsSocketTest, SocketsAreAndPipesAreNot) {
  int sv[2], p[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  ASSERT_EQ(pipe(p), 0);
  EXPECT_TRUE(IsSocket(sv[0]));
  EXPECT_FALSE(IsSocket(p[0]));
  EXPECT_FALSE(IsSocket(-1));
  for (int fd : {sv[0], sv[1], p[0], p[1]}) close(fd);
}

TEST(SkipIovTest, PassesOverWholeIovecsAndStartsInsideTheNext) {
  std::array<uint8_t, 10> a{}, b{}, c{};
  std::array<iovec, 3> iov = {iovec{a.data(), 4}, iovec{b.data(), 6}, iovec{c.data(), 10}};
  EXPECT_EQ(SkipIov(iov, 0), 0u);
  EXPECT_EQ(iov[0].iov_len, 4u);
  EXPECT_EQ(SkipIov(iov, 7), 1u);  // all of a, 3 bytes of b
  EXPECT_EQ(iov[1].iov_base, b.data() + 3);
  EXPECT_EQ(iov[1].iov_len, 3u);
  EXPECT_EQ(SkipIov(std::span<iovec>(iov).subspan(1), 3), 1u);  // b ends exactly
  EXPECT_EQ(iov[2].iov_len, 10u);
  EXPECT_EQ(SkipIov(std::span<iovec>(iov).subspan(2), 10), 1u);
  EXPECT_EQ(SkipIov(std::span<iovec>(iov).subspan(3), 5), 0u);  // nothing left to skip
}

TEST(SkipIovTest, PassesOverEmptyIovecsOnlyWithinTheBytes) {
  std::array<uint8_t, 8> a{}, b{};
  std::array<iovec, 3> iov = {iovec{a.data(), 8}, iovec{nullptr, 0}, iovec{b.data(), 8}};
  EXPECT_EQ(SkipIov(iov, 8), 1u);  // stops at the empty one: no byte left
  EXPECT_EQ(SkipIov(std::span<iovec>(iov).subspan(1), 1), 1u);
  EXPECT_EQ(iov[2].iov_base, b.data() + 1);
}

// Sends `pieces` through `write_fd` with WriteAllV while a thread reads
// `read_fd` to the end; returns what arrived. `write_fd` is made
// non-blocking: a blocking one takes every byte of a call (unless a signal
// comes), a non-blocking one only what its buffer has room for.
std::vector<uint8_t> SendThrough(int write_fd, int read_fd,
                                 const std::vector<std::vector<uint8_t>>& pieces) {
  EXPECT_EQ(::fcntl(write_fd, F_SETFL, ::fcntl(write_fd, F_GETFL) | O_NONBLOCK), 0);
  std::vector<uint8_t> got;
  std::thread reader([&] {
    std::vector<uint8_t> buf(1000);  // small reads: the writer fills up
    for (ssize_t n; (n = ::read(read_fd, buf.data(), buf.size())) > 0;)
      got.insert(got.end(), buf.begin(), buf.begin() + n);
  });
  std::vector<iovec> iov;
  for (const auto& p : pieces) iov.push_back({const_cast<uint8_t*>(p.data()), p.size()});
  Status s = WriteAllV(write_fd, iov);
  ::close(write_fd);
  reader.join();
  EXPECT_TRUE(s.ok()) << s.ToString();
  return got;
}

std::vector<std::vector<uint8_t>> Pieces() {
  // Sizes that straddle any socket or pipe buffer, an empty one among them.
  std::vector<std::vector<uint8_t>> pieces;
  uint8_t next = 0;
  for (size_t size : {size_t(16), size_t(0), size_t(300000), size_t(7), size_t(1) << 20}) {
    std::vector<uint8_t> p(size);
    std::iota(p.begin(), p.end(), next);
    next = uint8_t(next + size);
    pieces.push_back(std::move(p));
  }
  return pieces;
}

std::vector<uint8_t> Joined(const std::vector<std::vector<uint8_t>>& pieces) {
  std::vector<uint8_t> all;
  for (const auto& p : pieces) all.insert(all.end(), p.begin(), p.end());
  return all;
}

TEST(WriteAllVTest, ResumesAfterPartialSendsOnASmallSocketBuffer) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  const int small = 4096;
  ASSERT_EQ(::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
  const auto pieces = Pieces();
  EXPECT_EQ(SendThrough(sv[0], sv[1], pieces), Joined(pieces));
  ::close(sv[1]);
}

TEST(WriteAllVTest, ResumesAfterPartialWritesToAPipe) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);  // not a socket: the writev path
  const auto pieces = Pieces();
  EXPECT_EQ(SendThrough(p[1], p[0], pieces), Joined(pieces));
  ::close(p[0]);
}

}  // namespace
}  // namespace thindisk::nbd
