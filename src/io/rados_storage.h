// RadosStorage: io::Storage over Ceph RADOS objects (librados C++ API), so
// a thindisk image (qcow2 or raw) can live in a pool instead of a file.
//
// Layout of image IMAGE in pool POOL (name: io/rados_name.h):
//  - "IMAGE.header": the header object (io/rados_header.h): magic, version,
//    object size, byte size, data limit.
//  - "IMAGE.<index>": data object `index` (16 lower-case hex digits) holds
//    bytes [index * object_size, (index + 1) * object_size). Objects never
//    written do not exist; a missing object, or the part past a short
//    object's end, reads as zeros. Names cannot collide between images: a
//    data suffix is 17 characters that never end in "header".
//
// I/O: a request is split at object boundaries; the pieces of one call go
// out together as asynchronous librados operations (up to kMaxInFlight at a
// time) and the call returns when all have completed, with the first error.
// Each call is independent, so concurrent callers overlap freely; RADOS
// orders operations per object and client, nothing across objects.
//
// Write-back (io/write_back.h). The OSD's cost is per operation, not per
// byte, so writes under kMaxHeldWrite are held in memory and written back
// in batches: one compound operation per object carries every run held
// for it (4 KiB writes scattered over an object: one operation, not one
// each). A batch starts once 4 MiB are held or the oldest held byte is 1 s
// old; writers wait while 16 MiB are held. Reads see held bytes. Flush
// writes everything held back first, so the io::Storage contract holds:
// a write that completed before Flush is stored when Flush returns. A write
// is held only while the lock's watch is Confirmed (io/rados_lock.h): a
// holder that was paused long enough to be fenced writes through, and its
// writes fail at once. Larger writes, and every write of an open with
// cache mode none (serve --cache=none, as qemu's rbd driver then turns
// librbd's cache off), go to the OSDs directly, after held bytes they
// cover are dropped. A batch that fails makes every later write and Flush
// fail (the lost writes are never reported stored).
//
// Durability. A librados write completes when the OSDs have committed it
// (Ceph acks a write only once it is in every acting replica's store;
// there is no separate "in memory" ack since Luminous). So once the held
// bytes are written back, data needs nothing more at Flush. The byte
// size is the one thing kept in memory: WriteAt past the end raises it at
// once for readers, and Flush writes it into the header object (one write,
// only when it changed). Persisting it on every extending write would add a
// round trip to most first writes of a growing qcow2 file; a POSIX file's
// size is likewise durable at fdatasync, not before.
//
// No stale bytes after a crash (DESIGN.md P2): writes past the durable size
// may land before a crash and the size may not. The header's data_limit
// bounds them: it is raised (durably, before the data write is sent) in
// steps of kLimitStepObjects objects, so it changes once per 256 MiB of
// growth with 4 MiB objects. A read-write open whose header shows
// data_limit above the size zeroes and removes what lies in between (at
// most a step's worth of objects) before anything can grow over it; a clean
// close lowers data_limit to the size. Within a session every byte at or
// past Size() is zero, so Resize growing just records the new size.
//
// Space: PunchHole and ZeroRange remove whole objects and zero partial ones
// (the OSD cuts an object back when the zeroed range covers its end);
// neither ever creates or lengthens an object.
// Resize shrinking removes and truncates past the new end before it records
// the size. Allocate is kNotSupported (RADOS reserves nothing ahead).
// NextData/NextHole stat objects (bounded: kMaxStatObjects a call, then
// "data"); AllocatedBytes sums object sizes when the data limit spans at
// most kMaxStatObjects objects, else reports 0 (unknown).
//
// One writer per image across hosts: a read-write open takes the image's
// exclusive lock (io/rados_lock.h) before recovery writes anything, and
// holds it until the storage is destroyed; a second writer anywhere gets
// kBusy naming the holder. A holder that is gone is fenced first; the open
// says so on stderr ("thindisk: rados://p/i: fenced client.4123 ...").
// Requests of a client that was fenced fail with "fenced (blocklisted)".
//
// Thread safety: all methods may be called concurrently (storage.h).
// Lifetime: each storage holds its cluster connection (io/rados_cluster.h).
// Errors name the image, the object and librados' error:
// "rados://pool/disk: write disk.0000000000000003: No space left on device".
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "io/ceph_module.h"
#include "io/rados_cluster.h"
#include "io/rados_header.h"
#include "io/rados_lock.h"
#include "io/rados_name.h"
#include "io/storage.h"
#include "io/write_back.h"

namespace thindisk::io {

// Creates image `name` (rados://POOL/IMAGE...) of `size` bytes, with data
// objects of `object_size` bytes (a power of two, 4 KiB..128 MiB). Writes
// only the header object, so any size takes one round trip. kBusy (EEXIST)
// if the image exists; kNotFound if the pool does not.
Status CreateRados(const std::string& name, uint64_t size,
                   uint64_t object_size = uint64_t(1)
                                          << RadosHeader::kDefaultObjectOrder);

// Creates image `name` as CreateRados does (its errors, kBusy for one that
// exists, are returned as they are), then writes its format with `format`
// through a read-write open of it, flushes and closes it. A failure after
// the header object was made removes the image again and is returned with
// the name as context. (`thindisk create` and `bench` on a pool.)
Status CreateRadosFormatted(const std::string& name, uint64_t object_size,
                            const std::function<Status(Storage&)>& format);

// Opens an existing image. options.read_only refuses writes; options.create
// creates a missing image (size 0, 4 MiB objects) and with exclusive fails
// if it exists. options.cache kNone turns the write-back off (above); the
// other modes keep it. options.lock is ignored: a read-write open always takes the
// image's lock, a read-only one never (see above); kBusy when another
// writer holds it.
Result<std::unique_ptr<Storage>> OpenRados(const std::string& name,
                                           const OpenOptions& options);

// Removes the image: its data objects, then its header (so an interrupted
// remove leaves an image that can be removed again). Takes the image's lock
// first, as a writer does: kBusy while another writer holds it. Costs one remove per
// object index below the data limit when that is at most kMaxIndexRemove
// objects, else one listing of the pool: it grows with what was written,
// never with the virtual size. kNotFound when there is no such image.
// `progress`, when set, hears of every batch of objects removed.
Status RemoveRados(const std::string& name, const RemoveProgress& progress = nullptr);

// The thindisk images in pool `pool` (rados://POOL[?conf=..&id=..]), by
// name: one listing of the pool and one header read per image. Objects
// named like headers that do not decode as thindisk's are not images and
// are left out; an image removed during the listing is left out too.
Result<std::vector<RadosImageEntry>> ListRados(const std::string& pool);

class RadosStorage final : public Storage {
 public:
  static constexpr size_t kMaxInFlight = 64;         // aio ops per call at a time
  static constexpr uint64_t kLimitStepObjects = 64;  // data_limit grows in these steps
  static constexpr uint64_t kMaxStatObjects = 4096;  // NextData/Hole, AllocatedBytes
  static constexpr uint64_t kMaxIndexRemove = 4096;  // RemoveRados by index, else list
  static constexpr uint64_t kMaxHeldWrite = uint64_t(1) << 20;  // larger: written through

  ~RadosStorage() override;
  RadosStorage(const RadosStorage&) = delete;
  RadosStorage& operator=(const RadosStorage&) = delete;

  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override;
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override;
  Status Flush() override;
  Result<uint64_t> Size() override { return size_.load(); }
  Status Resize(uint64_t size) override;
  Status Allocate(uint64_t offset, uint64_t length) override;
  Status PunchHole(uint64_t offset, uint64_t length) override;
  Status ZeroRange(uint64_t offset, uint64_t length) override;
  Result<uint64_t> NextData(uint64_t offset) override;
  Result<uint64_t> NextHole(uint64_t offset) override;
  Result<uint64_t> AllocatedBytes() override;
  uint64_t bytes_written() const override { return bytes_written_.load(); }
  const std::string& name() const override { return uri_; }

  uint64_t object_size() const { return object_size_; }
  // "IMAGE.<16 hex digits>", the data object holding byte index * object_size.
  std::string ObjectName(uint64_t index) const;

 private:
  friend Result<std::unique_ptr<Storage>> OpenRados(const std::string&,
                                                    const OpenOptions&);
  friend Status RemoveRados(const std::string&, const RemoveProgress&);

  RadosStorage(std::shared_ptr<RadosCluster> cluster, librados::IoCtx io,
               const RadosName& name, const RadosHeader& header, bool read_only);

  Status Error(int ret, const std::string& op) const;
  Status CheckWritable() const;
  // Writes the header with the current size and `data_limit`; the caller
  // holds header_mu_. Updates durable_size_ and data_limit_.
  Status WriteHeaderLocked(uint64_t data_limit);
  // Makes every byte in [from, data_limit_) zero: cuts the object holding
  // `from` back to it and removes those after it. Caller holds header_mu_.
  Status ClearFromLocked(uint64_t from);
  // Zeroes [offset, offset + length) inside objects without creating any.
  Status ClearRange(uint64_t offset, uint64_t length);
  // Removes data objects [first, last) (missing ones are fine).
  Status RemoveObjects(uint64_t first, uint64_t last);
  // Sizes of objects [first, first + count), -1 for missing ones.
  Status StatObjects(uint64_t first, uint64_t count, std::vector<int64_t>& sizes);
  // Writes a batch of held runs: one compound operation per object.
  Status WriteHeld(const WriteBack::Extents& extents);
  // Writes everything held back (before asking the OSDs where data is).
  Status DrainHeld() { return write_back_ ? write_back_->Drain() : Status::Ok(); }
  // Drops held bytes in the range before it is written, punched or cut
  // around the write-back (io/write_back.h Forget).
  void ForgetHeld(uint64_t offset, uint64_t length) {
    if (write_back_) write_back_->Forget(offset, length);
  }
  // Raises the in-memory size to at least `end`, and the durable data limit
  // over it when needed (before the caller's data write is sent).
  Status ExtendTo(uint64_t end);

  uint64_t RoundUpToObject(uint64_t v) const {
    return (v + object_size_ - 1) & ~(object_size_ - 1);
  }

  // Declaration order = destruction order reversed: io_ goes before the
  // connection it belongs to.
  const std::shared_ptr<RadosCluster> cluster_;
  librados::IoCtx io_;
  // Read-write opens: held until after the destructor's last header write.
  std::unique_ptr<RadosLock> lock_;
  const RadosName rname_;
  const std::string uri_;
  const std::string header_oid_;
  const uint32_t object_order_;
  const uint64_t object_size_;
  const bool read_only_;

  std::atomic<uint64_t> size_;        // what Size() says; may be ahead of the header
  std::atomic<uint64_t> data_limit_;  // as in the header (raised before writes past it)
  std::atomic<uint64_t> bytes_written_{0};
  // Serializes header writes and the size changes that need one (Flush,
  // Resize, raising data_limit).
  std::mutex header_mu_;
  uint64_t durable_size_;  // the size in the header object; guarded by header_mu_
  // Held writes (read-write opens unless cache mode none). Last: its thread
  // writes through io_, so it goes first.
  std::unique_ptr<WriteBack> write_back_;
};

}  // namespace thindisk::io
