#include "cli/image_opts.h"

#include <utility>

#include "cli/serve_devices.h"
#include "cli/serve_options.h"

namespace thindisk::cli {

Status ApplyImageOpts(std::string* name, std::string* format,
                      std::string_view format_flag, std::string* cache,
                      std::string_view tool, ImageUse use, ImageWindow* window) {
  if (!format->empty())
    return Status::InvalidArgument("--image-opts and " + std::string(format_flag) +
                                   " are mutually exclusive (give driver= instead)");
  TD_ASSIGN_OR_RETURN(ImageOpts o, ParseImageOpts(*name));
  const std::string who(tool);
  if (use == ImageUse::kWrite) {
    if (o.read_only.value_or(false))
      return Status::InvalidArgument("--image-opts: read-only=on, but " + who +
                                     " writes the image");
    if (o.discard || o.detect_zeroes)
      return Status::InvalidArgument("--image-opts: discard= and detect-zeroes= are " +
                                     std::string("thindisk serve's; ") + who +
                                     " would not honour them");
  }
  if (o.offset != 0 || o.size.has_value()) {
    if (!window)
      return Status::InvalidArgument(
          "--image-opts: offset= and size= are not supported by " + who +
          " (they are where an image is read: convert's "
          "sources, compare, dd, measure; and by serve)");
    window->offset = o.offset;
    window->size = o.size;
  }
  const bool direct = o.cache_direct.value_or(false);
  const bool no_flush = o.cache_no_flush.value_or(false);
  if (direct && no_flush)
    return Status::NotSupported("--image-opts: cache.direct=on with cache.no-flush=on");
  if ((o.cache_direct || o.cache_no_flush) && !cache)
    return Status::InvalidArgument("--image-opts: " + who +
                                   " takes no cache mode (cache.*)");
  if (direct) {
    *cache = "none";
  } else if (no_flush) {
    *cache = "unsafe";
  } else if (o.cache_direct || o.cache_no_flush) {
    *cache = "writeback";  // both given as off
  }
  *name = std::move(o.filename);
  *format = std::move(o.format);
  return Status::Ok();
}

Status CheckWindow(const std::string& file, uint64_t offset, std::optional<uint64_t> size,
                   uint64_t image_size) {
  if (offset > image_size)
    return Status::InvalidArgument(file + ": offset " + std::to_string(offset) +
                                   " is past the image size " +
                                   std::to_string(image_size));
  if (size && *size > image_size - offset)
    return Status::InvalidArgument(
        file + ": offset " + std::to_string(offset) + " + size " + std::to_string(*size) +
        " is past the image size " + std::to_string(image_size));
  return Status::Ok();
}

Result<std::unique_ptr<block::Device>> OpenWindow(const std::string& file,
                                                  std::unique_ptr<block::Device> dev,
                                                  const ImageWindow& window) {
  if (window.whole()) return dev;
  const uint64_t image_size = dev->size();
  if (Status bad = CheckWindow(file, window.offset, window.size, image_size); !bad.ok()) {
    (void)dev->Close();
    return bad;
  }
  const uint64_t length = window.size.value_or(image_size - window.offset);
  return std::unique_ptr<block::Device>(std::make_unique<WindowDevice>(
      std::shared_ptr<block::Device>(std::move(dev)), window.offset, length));
}

}  // namespace thindisk::cli
