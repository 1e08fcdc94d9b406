#include "nbdclient/dirty_map.h"

#include <libnbd.h>

#include <cstdlib>
#include <memory>

#include "nbdclient/connection.h"

namespace thindisk::nbdclient {
namespace {

// Block status asks for at most this much at a time (the count is 32 bits).
constexpr uint64_t kMaxQuery = 1ull << 30;

struct Collector {
  const std::string* context;
  uint64_t offset = 0;  // where the reply starts
  DirtyMap* map;
  uint64_t covered = 0;  // bytes the reply described for our context
};

int OnExtents(void* user, const char* metacontext, uint64_t offset, uint32_t* entries,
              size_t n, int* error) {
  auto* c = static_cast<Collector*>(user);
  if (*error != 0 || *c->context != metacontext) return 0;
  uint64_t pos = offset;
  for (size_t i = 0; i + 1 < n; i += 2) {
    const uint64_t len = entries[i];
    if ((entries[i + 1] & 1) != 0 && len != 0) {
      std::vector<DirtyRange>& d = c->map->dirty;
      if (!d.empty() && d.back().offset + d.back().length == pos) {
        d.back().length += len;
      } else {
        d.push_back({pos, len});
      }
    }
    pos += len;
  }
  c->covered = pos - offset;
  return 0;
}

}  // namespace

Result<DirtyMap> ReadDirtyMap(const std::string& uri, const std::string& bitmap) {
  std::unique_ptr<nbd_handle, decltype(&nbd_close)> h(nbd_create(), &nbd_close);
  if (!h) return LibnbdError(uri);
  const std::string context = "qemu:dirty-bitmap:" + bitmap;
  if (nbd_add_meta_context(h.get(), context.c_str()) == -1 ||
      nbd_set_uri_allow_local_file(h.get(), true) == -1 ||
      nbd_connect_uri(h.get(), uri.c_str()) == -1) {
    return LibnbdError(uri);
  }
  const int64_t size = nbd_get_size(h.get());
  if (size < 0) return LibnbdError(uri);
  DirtyMap map;
  map.export_size = uint64_t(size);
  if (char* name = nbd_get_export_name(h.get())) {
    map.export_name = name;
    free(name);
  }
  map.offered = nbd_can_meta_context(h.get(), context.c_str()) == 1;
  if (!map.offered) return map;
  for (uint64_t pos = 0; pos < map.export_size;) {
    Collector c{&context, pos, &map};
    const uint64_t want = std::min(kMaxQuery, map.export_size - pos);
    nbd_extent_callback cb{.callback = OnExtents, .user_data = &c, .free = nullptr};
    if (nbd_block_status(h.get(), want, pos, cb, 0) == -1) return LibnbdError(uri);
    if (c.covered == 0) {
      return Status(Code::kIoError, uri + ": block status of '" + context + "' at " +
                                        std::to_string(pos) + " described nothing");
    }
    pos += c.covered;
  }
  // A last extent may run past the end (a granule the disk cuts): clip it.
  while (!map.dirty.empty() && map.dirty.back().offset >= map.export_size) map.dirty.pop_back();
  if (!map.dirty.empty()) {
    DirtyRange& last = map.dirty.back();
    last.length = std::min(last.length, map.export_size - last.offset);
  }
  (void)nbd_shutdown(h.get(), 0);
  return map;
}

}  // namespace thindisk::nbdclient
