// OpenScratch and the local-directory Scratch (see scratch.h); the pool's
// is in scratch_pool.cc.
#include "bench/scratch.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "bench/bench_image.h"
#include "io/rados_name.h"
#include "io/rbd_name.h"

namespace thindisk::bench {
namespace {

// Images are files in a ScratchDir, which takes whatever is left with it.
class DirScratch final : public Scratch {
 public:
  explicit DirScratch(std::unique_ptr<ScratchDir> dir) : dir_(std::move(dir)) {}
  ~DirScratch() override { dir_->set_keep(keep_); }

  std::string Name(const std::string& key) const override {
    return dir_->File(BackingName(key));
  }
  std::string BackingName(const std::string& key) const override {
    return key + ".qcow2";
  }

  Status CreateImage(const std::string& key,
                     const qcow2::CreateOptions& layout) override {
    return CreateQcow2(Name(key), layout);
  }

  Result<std::unique_ptr<block::Device>> Open(
      const std::string& key, std::shared_ptr<HostCounters> counters,
      std::chrono::microseconds latency) override {
    return OpenCounted(Name(key), std::move(counters), latency);
  }

  void Remove(const std::string& key) override {
    if (keep_) return;
    std::error_code ec;  // best effort: a leftover goes with the directory
    std::filesystem::remove(Name(key), ec);
  }

 private:
  std::unique_ptr<ScratchDir> dir_;
};

}  // namespace

Result<std::unique_ptr<Scratch>> NewScratchDir(const std::string& parent) {
  TD_ASSIGN_OR_RETURN(std::unique_ptr<ScratchDir> dir, ScratchDir::Create(parent));
  return std::unique_ptr<Scratch>(std::make_unique<DirScratch>(std::move(dir)));
}

Result<std::unique_ptr<Scratch>> OpenScratch(const std::string& where) {
  if (io::IsRbdName(where)) {
    return Status::InvalidArgument(
        where +
        ": bench makes thindisk images, not RBD ones; give the pool as rados://POOL");
  }
  if (io::IsRadosName(where)) return NewScratchPool(where);
  return NewScratchDir(where);
}

Result<io::Storage*> HostStorage(block::Device& device) {
  auto* image = dynamic_cast<qcow2::Image*>(&device);
  if (image == nullptr)
    return Status::Internal("bench: block::Open did not return a qcow2 image");
  return &image->storage();
}

}  // namespace thindisk::bench
