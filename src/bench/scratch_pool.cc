// The RADOS-pool Scratch (see scratch.h): images td-bench-<pid>-KEY in the
// pool, made, opened and removed as the CLI does for rados:// names.
#include <unistd.h>

#include <set>
#include <utility>

#include "bench/scratch.h"
#include "block/open.h"
#include "io/ceph_module.h"
#include "io/rados_header.h"
#include "io/rados_name.h"

namespace thindisk::bench {
namespace {

class PoolScratch final : public Scratch {
 public:
  explicit PoolScratch(io::RadosName pool)
      : pool_(std::move(pool)), prefix_("td-bench-" + std::to_string(::getpid()) + "-") {}

  // What failed to go earlier gets one more try; nothing to report from here.
  ~PoolScratch() override {
    if (keep_) return;
    for (const std::string& key : made_) (void)io::ceph_module::RemoveRados(Name(key));
  }

  std::string Name(const std::string& key) const override {
    io::RadosName n = pool_;
    n.image = BackingName(key);
    return n.Uri();
  }
  // A relative backing name is an image in the overlay's pool, reached
  // with the overlay's conf and id (block/open.h).
  std::string BackingName(const std::string& key) const override { return prefix_ + key; }

  // As `thindisk create rados://...` makes it (io::ceph_module::CreateRadosFormatted):
  // an image that exists is refused, never overwritten; a failure after the
  // header removes the image again.
  Status CreateImage(const std::string& key,
                     const qcow2::CreateOptions& layout) override {
    TD_RETURN_IF_ERROR(io::ceph_module::CreateRadosFormatted(
        Name(key), uint64_t(1) << io::RadosHeader::kDefaultObjectOrder,
        [&](io::Storage& storage) { return qcow2::Create(storage, layout); }));
    made_.insert(key);
    return Status::Ok();
  }

  Result<std::unique_ptr<block::Device>> Open(
      const std::string& key, std::shared_ptr<HostCounters> /*counters*/,
      std::chrono::microseconds latency) override {
    if (latency.count() > 0) {
      return Status::InvalidArgument(pool_.PoolUri() +
                                     ": a latency cannot be added under rados:// images; "
                                     "the pool's own is what is measured");
    }
    block::OpenOptions o;
    o.format = "qcow2";
    return block::Open(Name(key), o);
  }

  void Remove(const std::string& key) override {
    if (keep_) return;
    Status s = io::ceph_module::RemoveRados(Name(key));
    if (s.ok() || s.code() == Code::kNotFound) made_.erase(key);
  }

 private:
  const io::RadosName pool_;
  const std::string prefix_;
  std::set<std::string> made_;  // keys of the images this run made and has not removed
};

}  // namespace

Result<std::unique_ptr<Scratch>> NewScratchPool(const std::string& pool_uri) {
  TD_ASSIGN_OR_RETURN(io::RadosName pool, io::ParseRadosPool(pool_uri));
  return std::unique_ptr<Scratch>(std::make_unique<PoolScratch>(std::move(pool)));
}

}  // namespace thindisk::bench
