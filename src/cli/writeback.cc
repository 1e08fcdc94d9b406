#include "cli/writeback.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "block/open.h"

namespace thindisk::cli {

BackgroundWriteback::BackgroundWriteback(const std::string& path, uint64_t every)
    : path_(path), every_(every) {
  if (block::IsUriName(path) || every == 0) return;
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ >= 0) thread_ = std::thread([this] { Run(); });
}

BackgroundWriteback::~BackgroundWriteback() { (void)Finish(); }

void BackgroundWriteback::Wrote(uint64_t bytes) {
  if (fd_ < 0) return;
  pending_ += bytes;
  if (pending_ < every_) return;
  pending_ = 0;
  std::lock_guard<std::mutex> lock(mu_);
  kicked_ = true;
  cv_.notify_one();
}

Status BackgroundWriteback::Finish() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void BackgroundWriteback::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return kicked_ || stop_; });
    if (!kicked_) return;  // stopped, with no sync asked for
    kicked_ = false;
    lock.unlock();
    const int rc = ::fdatasync(fd_);
    const int e = errno;
    lock.lock();
    if (rc != 0 && error_.ok()) error_ = Status::FromErrno(e, path_ + ": writing back");
  }
}

}  // namespace thindisk::cli
