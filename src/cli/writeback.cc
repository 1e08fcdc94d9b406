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
  util::MutexLock lock(mu_);
  kicked_ = true;
  cv_.NotifyOne();
}

Status BackgroundWriteback::Finish() {
  if (thread_.joinable()) {
    {
      util::MutexLock lock(mu_);
      stop_ = true;
    }
    cv_.NotifyOne();
    thread_.join();
  }
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  util::MutexLock lock(mu_);
  return error_;
}

void BackgroundWriteback::Run() {
  util::UniqueLock lock(mu_);
  while (true) {
    while (!kicked_ && !stop_) cv_.Wait(mu_);
    if (!kicked_) return;  // stopped, with no sync asked for
    kicked_ = false;
    lock.Unlock();
    const int rc = ::fdatasync(fd_);
    const int e = errno;
    lock.Lock();
    if (rc != 0 && error_.ok()) error_ = Status::FromErrno(e, path_ + ": writing back");
  }
}

}  // namespace thindisk::cli
