#include "bench/proc_stats.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>

namespace thindisk::bench {
namespace {

Result<uint64_t> ReadWriteBytes(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::FromErrno(errno ? errno : EIO, path);
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "write_bytes:") return value;
  }
  return Status::NotSupported(path + ": no write_bytes line");
}

}  // namespace

Result<ProcessCost> ReadProcessCost(pid_t pid) {
  std::string dir = "/proc/" + std::to_string(pid);
  std::ifstream stat(dir + "/stat");
  if (!stat) return Status::NotFound(dir + "/stat: no such process (is --server-pid right?)");
  std::string line;
  std::getline(stat, line);
  // Field 2 (comm) may hold spaces and parentheses: parse after the last ')'.
  size_t close = line.rfind(')');
  if (close == std::string::npos) return Status::NotSupported(dir + "/stat: unexpected format");
  std::istringstream fields(line.substr(close + 2));
  // Fields 3..15 after comm: state ppid pgrp session tty tpgid flags minflt
  // cminflt majflt cmajflt utime stime.
  std::string skip;
  for (int i = 3; i < 14; ++i) fields >> skip;
  uint64_t utime = 0, stime = 0;
  if (!(fields >> utime >> stime)) return Status::NotSupported(dir + "/stat: unexpected format");
  ProcessCost cost;
  cost.cpu_seconds = double(utime + stime) / double(sysconf(_SC_CLK_TCK));
  TD_ASSIGN_OR_RETURN(cost.write_bytes, ReadWriteBytes(dir + "/io"));
  return cost;
}

ProcessCost SelfCost() {
  ProcessCost cost;
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) == 0) {
    cost.cpu_seconds = double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
                       double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  }
  Result<uint64_t> wb = ReadWriteBytes("/proc/self/io");
  if (wb.has_value()) cost.write_bytes = *wb;
  return cost;
}

}  // namespace thindisk::bench
