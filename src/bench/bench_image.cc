#include "bench/bench_image.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <system_error>
#include <vector>

#include "block/open.h"
#include "io/latency_storage.h"
#include "io/storage.h"

namespace thindisk::bench {

Status CreateQcow2(const std::string& path, const qcow2::CreateOptions& options) {
  io::OpenOptions o;
  o.create = true;
  o.exclusive = true;
  TD_ASSIGN_OR_RETURN(std::unique_ptr<io::Storage> storage, io::OpenFile(path, o));
  Status s = qcow2::Create(*storage, options);
  if (s.ok()) s = storage->Flush();
  return s.ok() ? s : s.WithContext(path);
}

Result<std::unique_ptr<block::Device>> OpenCounted(const std::string& path,
                                                   std::shared_ptr<HostCounters> counters,
                                                   std::chrono::microseconds latency) {
  block::OpenOptions o;
  o.format = "qcow2";
  o.open_file = [counters, latency](const std::string& file, const io::OpenOptions& options)
      -> Result<std::unique_ptr<io::Storage>> {
    TD_ASSIGN_OR_RETURN(std::unique_ptr<io::Storage> inner, io::OpenFile(file, options));
    if (latency.count() > 0) inner = std::make_unique<io::LatencyStorage>(std::move(inner), latency);
    return std::unique_ptr<io::Storage>(std::make_unique<CountingStorage>(std::move(inner), counters));
  };
  return block::Open(path, o);
}

Result<uint64_t> AllocatedFileBytes(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::FromErrno(errno, path);
  return uint64_t(st.st_blocks) * 512;
}

Result<std::unique_ptr<ScratchDir>> ScratchDir::Create(const std::string& parent) {
  std::string pattern = parent + "/thindisk-bench-XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) return Status::FromErrno(errno, "mkdtemp in " + parent);
  return std::unique_ptr<ScratchDir>(new ScratchDir(buf.data()));
}

ScratchDir::~ScratchDir() {
  if (keep_) return;
  std::error_code ec;  // best effort: nothing to report from a destructor
  std::filesystem::remove_all(path_, ec);
}

}  // namespace thindisk::bench
