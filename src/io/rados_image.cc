// CreateRados, OpenRados, RemoveRados: the life of an image in a pool (see
// io/rados_storage.h for the layout and the invariants kept here).
#include <cerrno>
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

Result<Pool> Connect(const std::string& uri) {
  auto name = ParseRadosName(uri);
  if (!name) return name.error();
  auto cluster = RadosCluster::Get(*name);
  if (!cluster) return cluster.error();
  auto io = (*cluster)->OpenPool(*name);
  if (!io) return io.error();
  std::string header_oid = name->image + ".header";
  return Pool{std::move(*name), std::move(*cluster), std::move(*io),
              std::move(header_oid)};
}

// The image's header, decoded; kNotFound when the header object is missing.
Result<RadosHeader> ReadHeader(Pool& pool) {
  const std::string what = pool.name.ToString();
  librados::bufferlist bl;
  // A header is 64 bytes; 4 KiB leaves room for later versions' fields.
  const int ret = pool.io.read(pool.header_oid, bl, 4096, 0);
  if (ret == -ENOENT) {
    return Status::NotFound(what + ": no such image (no header object " +
                                pool.header_oid + " in pool '" + pool.name.pool + "')",
                            ENOENT);
  }
  if (ret < 0)
    return Status::FromErrno(-ret, what + ": read header object " + pool.header_oid);
  std::vector<uint8_t> bytes(bl.length());
  if (!bytes.empty()) bl.begin().copy(bl.length(), reinterpret_cast<char*>(bytes.data()));
  return RadosHeader::Decode(bytes, what);
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

// Every data object of `image` in the pool, by listing it (the remove path
// for images whose data limit spans too many indexes to try one by one).
Result<std::vector<std::string>> ListDataObjects(Pool& pool) {
  std::vector<std::string> found;
  try {  // librados' listing iterator reports errors by throwing
    for (auto it = pool.io.nobjects_begin(); it != pool.io.nobjects_end(); ++it) {
      if (IsDataObjectOf(it->get_oid(), pool.name.image)) found.push_back(it->get_oid());
    }
  } catch (const std::exception& e) {
    return Status::Internal(pool.name.ToString() + ": list pool '" + pool.name.pool +
                            "': " + e.what());
  }
  return found;
}

}  // namespace

Status CreateRados(const std::string& name, uint64_t size, uint64_t object_size) {
  auto pool = Connect(name);
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
  auto pool = Connect(name);
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
  // 3. Here the next increment takes the image's exclusive lock (cls lock
  //    on the header object, a watch, fencing a dead holder) for a
  //    read-write open, before step 4 writes anything. options.lock names
  //    the mode; it is not implemented yet.
  std::unique_ptr<RadosStorage> storage(new RadosStorage(std::move(pool->cluster),
                                                         std::move(pool->io), pool->name,
                                                         *header, options.read_only));
  // 4. Recovery: bytes between the durable size and the data limit may be
  //    stale (writes that landed before a crash, their size not flushed).
  //    Clear them before anything can grow the size over them.
  if (!options.read_only && header->data_limit > storage->RoundUpToObject(header->size)) {
    std::lock_guard<std::mutex> lock(storage->header_mu_);
    TD_RETURN_IF_ERROR(storage->ClearFromLocked(header->size).WithContext("recovery"));
    TD_RETURN_IF_ERROR(
        storage->WriteHeaderLocked(storage->RoundUpToObject(header->size)));
  }
  return std::unique_ptr<Storage>(std::move(storage));
}

Status RemoveRados(const std::string& name) {
  auto pool = Connect(name);
  if (!pool) return pool.error();
  // Refuses what is not a thindisk image (bad magic, newer version) before
  // touching anything.
  auto header = ReadHeader(*pool);
  if (!header) return header.error();
  const std::string what = pool->name.ToString();
  librados::IoCtx io;
  io.dup(pool->io);
  // A read-only storage: its helpers, and a destructor that writes nothing.
  RadosStorage storage(pool->cluster, std::move(io), pool->name, *header,
                       /*read_only=*/true);
  const uint64_t objects = header->data_limit >> header->object_order;
  if (objects <= RadosStorage::kMaxIndexRemove) {
    TD_RETURN_IF_ERROR(storage.RemoveObjects(0, objects));
  } else {
    auto found = ListDataObjects(*pool);
    if (!found) return found.error();
    TD_RETURN_IF_ERROR(rados_internal::RunAio(
        found->size(), RadosStorage::kMaxInFlight,
        [&](uint64_t i, rados_internal::AioSlot& s) {
          return pool->io.aio_remove((*found)[i], s.completion);
        },
        [&](uint64_t i, rados_internal::AioSlot&, int ret) {
          if (ret >= 0 || ret == -ENOENT) return Status::Ok();
          return Status::FromErrno(-ret, what + ": remove " + (*found)[i]);
        }));
  }
  // The header last: until it goes, the image exists and can be removed again.
  const int ret = pool->io.remove(pool->header_oid);
  if (ret < 0 && ret != -ENOENT) {
    return Status::FromErrno(-ret, what + ": remove header object " + pool->header_oid);
  }
  return Status::Ok();
}

}  // namespace thindisk::io
