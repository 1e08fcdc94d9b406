// CreateRados, OpenRados, RemoveRados: the life of an image in a pool (see
// io/rados_storage.h for the layout and the invariants kept here).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <exception>

#include "io/rados_aio.h"
#include "io/rados_storage.h"

namespace thindisk::io {
namespace {

struct Pool {
  RadosName name;
  std::shared_ptr<RadosCluster> cluster;
  librados::IoCtx io;
  std::string header_oid;
};

Result<Pool> Connect(Result<RadosName> name) {
  if (!name) return name.error();
  auto cluster = RadosCluster::Get(*name);
  if (!cluster) return cluster.error();
  auto io = (*cluster)->OpenPool(*name);
  if (!io) return io.error();
  std::string header_oid = name->image + ".header";
  return Pool{std::move(*name), std::move(*cluster), std::move(*io),
              std::move(header_oid)};
}

// Reads header object `oid` of pool.io: ENOENT when it is gone.
Result<std::vector<uint8_t>> ReadHeaderBytes(Pool& pool, const std::string& oid) {
  librados::bufferlist bl;
  // A header is 64 bytes; 4 KiB leaves room for later versions' fields.
  const int ret = pool.io.read(oid, bl, 4096, 0);
  if (ret < 0) return Status::FromErrno(-ret, pool.name.PoolUri() + ": read " + oid);
  std::vector<uint8_t> bytes(bl.length());
  if (!bytes.empty()) bl.begin().copy(bl.length(), reinterpret_cast<char*>(bytes.data()));
  return bytes;
}

// The image's header, decoded; kNotFound when the header object is missing.
Result<RadosHeader> ReadHeader(Pool& pool) {
  const std::string what = pool.name.ToString();
  auto bytes = ReadHeaderBytes(pool, pool.header_oid);
  if (!bytes && bytes.error().error_number() == ENOENT) {
    return Status::NotFound(what + ": no such image (no header object " +
                                pool.header_oid + " in pool '" + pool.name.pool + "')",
                            ENOENT);
  }
  if (!bytes) return bytes.error();
  return RadosHeader::Decode(*bytes, what);
}

// Writes a fresh header; fails with EEXIST when the image exists.
Status WriteNewHeader(Pool& pool, const RadosHeader& h) {
  const std::vector<uint8_t> bytes = h.Encode();
  librados::bufferlist bl;
  bl.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  librados::ObjectWriteOperation op;
  op.create(true);  // exclusive: one create wins, the other sees EEXIST
  op.write_full(bl);
  const int ret = pool.io.operate(pool.header_oid, &op);
  if (ret == -EEXIST) {
    return Status(Code::kBusy, pool.name.ToString() + ": image already exists", EEXIST);
  }
  if (ret < 0) {
    return Status::FromErrno(
        -ret, pool.name.ToString() + ": create header object " + pool.header_oid);
  }
  return Status::Ok();
}

// True for "IMAGE.<16 hex digits>".
bool IsDataObjectOf(const std::string& oid, const std::string& image) {
  if (oid.size() != image.size() + 17 || oid.compare(0, image.size(), image) != 0 ||
      oid[image.size()] != '.') {
    return false;
  }
  for (size_t i = image.size() + 1; i < oid.size(); ++i) {
    const char c = oid[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// The names of the pool's objects that `keep` accepts, by listing it.
template <typename Keep>
Result<std::vector<std::string>> ListObjects(Pool& pool, Keep keep) {
  std::vector<std::string> found;
  try {  // librados' listing iterator reports errors by throwing
    for (auto it = pool.io.nobjects_begin(); it != pool.io.nobjects_end(); ++it) {
      if (keep(it->get_oid())) found.push_back(it->get_oid());
    }
  } catch (const std::exception& e) {
    return Status::Internal(pool.name.PoolUri() + ": list pool '" + pool.name.pool +
                            "': " + e.what());
  }
  return found;
}

// Every data object of `image` in the pool (the remove path for images
// whose data limit spans too many indexes to try one by one).
Result<std::vector<std::string>> ListDataObjects(Pool& pool) {
  return ListObjects(pool, [&](const std::string& oid) {
    return IsDataObjectOf(oid, pool.name.image);
  });
}

}  // namespace

Status CreateRados(const std::string& name, uint64_t size, uint64_t object_size) {
  auto pool = Connect(ParseRadosName(name));
  if (!pool) return pool.error();
  const std::string what = pool->name.ToString();
  auto order = RadosObjectOrder(object_size, what);
  if (!order) return order.error();
  if (size > RadosHeader::kMaxSize) {
    return Status::InvalidArgument(what + ": size " + std::to_string(size) +
                                   " exceeds 2^62");
  }
  RadosHeader h;
  h.object_order = *order;
  h.size = size;
  h.data_limit = 0;  // no data object exists yet
  return WriteNewHeader(*pool, h);
}

Result<std::unique_ptr<Storage>> OpenRados(const std::string& name,
                                           const OpenOptions& options) {
  // 1. Connect and find the pool.
  auto pool = Connect(ParseRadosName(name));
  if (!pool) return pool.error();
  // 2. The header (created first when asked to).
  auto header = ReadHeader(*pool);
  if (!header && header.error().code() == Code::kNotFound && options.create &&
      !options.read_only) {
    TD_RETURN_IF_ERROR(WriteNewHeader(*pool, RadosHeader{}));
    header = ReadHeader(*pool);
  } else if (header && options.create && options.exclusive) {
    return Status(Code::kBusy, pool->name.ToString() + ": image already exists", EEXIST);
  }
  if (!header) return header.error();
  // 3. A writer takes the image's lock before step 4 writes anything, and
  //    reads the header again under it: the previous writer may have
  //    flushed a new size between our read and its release.
  std::unique_ptr<RadosLock> lock;
  if (!options.read_only) {
    std::optional<RadosLocker> fenced;
    auto taken = RadosLock::Acquire(pool->cluster, pool->io, pool->name.ToString(),
                                    pool->header_oid, &fenced, options.takeover);
    if (!taken) return taken.error();
    lock = std::move(*taken);
    if (fenced) {
      std::fprintf(stderr,
                   "thindisk: %s: fenced %s (it held the lock with no watch: its process or "
                   "host is gone) and broke its lock\n",
                   pool->name.ToString().c_str(), fenced->ToString().c_str());
    }
    header = ReadHeader(*pool);
    if (!header) return header.error();
  }
  std::unique_ptr<RadosStorage> storage(new RadosStorage(std::move(pool->cluster),
                                                         std::move(pool->io), pool->name,
                                                         *header, options.read_only));
  storage->lock_ = std::move(lock);
  // 4. Recovery: bytes between the durable size and the data limit may be
  //    stale (writes that landed before a crash, their size not flushed).
  //    Clear them before anything can grow the size over them.
  if (!options.read_only && header->data_limit > storage->RoundUpToObject(header->size)) {
    std::lock_guard<std::mutex> lock(storage->header_mu_);
    TD_RETURN_IF_ERROR(storage->ClearFromLocked(header->size).WithContext("recovery"));
    TD_RETURN_IF_ERROR(
        storage->WriteHeaderLocked(storage->RoundUpToObject(header->size)));
  }
  if (!options.read_only && options.cache != CacheMode::kNone) {
    RadosStorage* raw = storage.get();
    storage->write_back_ = std::make_unique<WriteBack>(
        [raw](const WriteBack::Extents& extents) { return raw->WriteHeld(extents); });
  }
  return std::unique_ptr<Storage>(std::move(storage));
}

Status CreateRadosFormatted(const std::string& name, uint64_t object_size,
                            const std::function<Status(Storage&)>& format) {
  TD_RETURN_IF_ERROR(CreateRados(name, 0, object_size));
  auto storage = OpenRados(name, OpenOptions{});
  Status s = storage.status();
  if (s.ok()) s = format(**storage);
  if (s.ok()) s = (*storage)->Flush();
  if (storage) storage->reset();  // releases the image's lock before the remove
  if (s.ok()) return s;
  (void)RemoveRados(name);
  return s.WithContext(name);
}

Status RemoveRados(const std::string& name, const RemoveProgress& progress) {
  auto pool = Connect(ParseRadosName(name));
  if (!pool) return pool.error();
  // Refuses what is not a thindisk image (bad magic, newer version) before
  // touching anything.
  auto header = ReadHeader(*pool);
  if (!header) return header.error();
  const std::string what = pool->name.ToString();
  // A writer's image is refused; a gone writer is fenced, so it cannot
  // write objects back after they are removed. The lock goes with the
  // header object.
  std::optional<RadosLocker> fenced;
  auto lock = RadosLock::Acquire(pool->cluster, pool->io, what, pool->header_oid, &fenced);
  if (!lock) return lock.error();
  librados::IoCtx io;
  io.dup(pool->io);
  // A read-only storage: its helpers, and a destructor that writes nothing.
  RadosStorage storage(pool->cluster, std::move(io), pool->name, *header,
                       /*read_only=*/true);
  // The data objects: by index below the data limit when there are few
  // indexes, else the ones a listing of the pool finds.
  const uint64_t objects = header->data_limit >> header->object_order;
  const bool by_index = objects <= RadosStorage::kMaxIndexRemove;
  std::vector<std::string> found;
  if (!by_index) {
    auto listed = ListDataObjects(*pool);
    if (!listed) return listed.error();
    found = std::move(*listed);
  }
  const uint64_t count = by_index ? objects : found.size();
  auto remove = [&](uint64_t first, uint64_t last) -> Status {
    if (by_index) return storage.RemoveObjects(first, last);
    return rados_internal::RunAio(
        last - first, RadosStorage::kMaxInFlight,
        [&](uint64_t i, rados_internal::AioSlot& s) {
          return pool->io.aio_remove(found[first + i], s.completion);
        },
        [&](uint64_t i, rados_internal::AioSlot&, int ret) {
          if (ret >= 0 || ret == -ENOENT) return Status::Ok();
          return Status::FromErrno(-ret, what + ": remove " + found[first + i]);
        });
  };
  // Batches of kProgressBatch (whole windows of RunAio, so as many in
  // flight as in one call), the progress told after each; the header last.
  constexpr uint64_t kProgressBatch = 16 * RadosStorage::kMaxInFlight;
  const uint64_t total = count + 1;
  for (uint64_t first = 0; first < count; first += kProgressBatch) {
    const uint64_t last = std::min(count, first + kProgressBatch);
    TD_RETURN_IF_ERROR(remove(first, last));
    if (progress) progress(last, total);
  }
  // The header last: until it goes, the image exists and can be removed again.
  const int ret = pool->io.remove(pool->header_oid);
  if (ret < 0 && ret != -ENOENT) {
    return Status::FromErrno(-ret, what + ": remove header object " + pool->header_oid);
  }
  if (progress) progress(total, total);
  return Status::Ok();
}

Result<std::vector<RadosImageEntry>> ListRados(const std::string& pool_name) {
  auto pool = Connect(ParseRadosPool(pool_name));
  if (!pool) return pool.error();
  constexpr std::string_view kSuffix = ".header";
  auto headers = ListObjects(*pool, [&](const std::string& oid) {
    return oid.size() > kSuffix.size() && oid.ends_with(kSuffix);
  });
  if (!headers) return headers.error();
  std::vector<RadosImageEntry> images;
  for (const std::string& oid : *headers) {
    const std::string image = oid.substr(0, oid.size() - kSuffix.size());
    auto bytes = ReadHeaderBytes(*pool, oid);
    if (!bytes && bytes.error().error_number() == ENOENT) continue;  // removed meanwhile
    if (!bytes) return bytes.error();
    auto header = RadosHeader::Decode(*bytes, pool->name.PoolUri() + "/" + image);
    if (!header) continue;  // some other program's object
    images.push_back({image, header->size, uint64_t(1) << header->object_order});
  }
  std::sort(images.begin(), images.end(),
            [](const RadosImageEntry& a, const RadosImageEntry& b) { return a.name < b.name; });
  return images;
}

}  // namespace thindisk::io
