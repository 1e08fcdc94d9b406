#include "cli/serve_open.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "cli/image_opts.h"
#include "cli/serve_devices.h"
#include "qcow2/bitmaps.h"
#include "qcow2/image.h"

namespace thindisk::cli {
namespace {

// A new empty file in $TMPDIR for the -s overlay; *path says where.
Result<std::unique_ptr<io::Storage>> MakeTempFile(std::string* path) {
  const char* dir = std::getenv("TMPDIR");
  std::string tmpl = std::string(dir && *dir ? dir : "/tmp") + "/thindisk-snapshot-XXXXXX";
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  int fd = ::mkstemp(name.data());
  if (fd < 0) return Status::FromErrno(errno, "-s/--snapshot: temporary file " + tmpl);
  ::close(fd);
  *path = name.data();
  io::OpenOptions io_options;  // a scratch file: no image lock
  auto storage = io::OpenFile(*path, io_options);
  if (!storage) ::unlink(path->c_str());
  return storage;
}

// -s: a temporary qcow2 overlay over `file`, opened, and already unlinked.
Result<std::unique_ptr<block::Device>> OpenTempOverlay(const std::string& file,
                                                       const block::OpenOptions& options) {
  // 1. The image, read-only, to learn its format and size (and that it opens).
  block::OpenOptions ro = options;
  ro.read_only = true;
  TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> image, block::Open(file, ro));
  const uint64_t size = image->size();
  const std::string format = image->info().format;
  TD_RETURN_IF_ERROR(image->Close());
  image.reset();
  // The overlay names its backing file absolutely (it lives in $TMPDIR);
  // a name realpath cannot resolve (an NBD URI) is used as given.
  char resolved[PATH_MAX];
  const std::string backing = ::realpath(file.c_str(), resolved) ? resolved : file;

  // 2. The overlay file; from here on every way out unlinks it.
  std::string path;
  TD_ASSIGN_OR_RETURN(std::unique_ptr<io::Storage> storage, MakeTempFile(&path));
  qcow2::CreateOptions create;
  create.size = size;
  create.backing_file = backing;
  create.backing_format = format;
  Status made = qcow2::Create(*storage, create);
  if (made.ok()) made = storage->Flush();
  storage.reset();
  if (!made.ok()) {
    ::unlink(path.c_str());
    return made.WithContext("-s/--snapshot: temporary overlay " + path);
  }

  // 3. Open it read-write over the read-only image, then unlink it: the
  //    open descriptor keeps it alive exactly as long as the server.
  block::OpenOptions overlay = options;
  overlay.format = "qcow2";
  overlay.read_only = false;
  overlay.snapshot = {};
  auto dev = block::Open(path, overlay);
  ::unlink(path.c_str());
  if (!dev) return dev.status().WithContext("-s/--snapshot");
  return dev;
}

}  // namespace

Result<OpenedExport> OpenExportDevice(const std::string& file, const ExportSettings& settings) {
  if (!settings.bitmaps.empty() &&
      (settings.temp_overlay || !settings.open.snapshot.empty() || settings.offset != 0 ||
       settings.size.has_value())) {
    return Status::InvalidArgument(
        "-B/--bitmap exports a bitmap of the whole image: not with -s, -l or an offset window");
  }
  // 1. The image, or the overlay that takes its writes.
  std::shared_ptr<block::Device> dev;
  if (settings.temp_overlay) {
    TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> d, OpenTempOverlay(file, settings.open));
    dev = std::move(d);
  } else {
    TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> d, block::Open(file, settings.open));
    dev = std::move(d);
  }
  // The bitmaps, from the image itself (the views below do not move bytes).
  OpenedExport out;
  out.image = dev;
  for (const std::string& name : settings.bitmaps) {
    auto bitmap = qcow2::ExportBitmap(dev, name);
    if (!bitmap) {
      (void)dev->Close();
      return bitmap.error().WithContext(file);
    }
    out.bitmaps.push_back(std::move(*bitmap));
  }

  // 2. The window, which must lie inside the image.
  if (settings.offset != 0 || settings.size.has_value()) {
    uint64_t image_size = dev->size();
    if (Status bad = CheckWindow(file, settings.offset, settings.size, image_size);
        !bad.ok()) {
      (void)dev->Close();
      return bad;
    }
    uint64_t length = settings.size.value_or(image_size - settings.offset);
    dev = std::make_shared<WindowDevice>(std::move(dev), settings.offset, length);
  }

  // 3. Durable writes, then the discard/detect-zeroes policy on top (so a
  //    write turned into write-zeroes is durable too).
  if (settings.write_through) dev = std::make_shared<WriteThroughDevice>(std::move(dev));
  if (!settings.filter.passthrough())
    dev = std::make_shared<nbd::FilterDevice>(std::move(dev), settings.filter);
  out.device = std::move(dev);
  return out;
}

}  // namespace thindisk::cli
