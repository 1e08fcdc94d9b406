// --image-opts for the image tools, as qemu-img reads it: the image argument
// is a set of block options ("driver=qcow2,file.filename=disk.qcow2,
// cache.direct=on") instead of a file name. The keys are ParseImageOpts's
// (serve_options.h); what each means to a tool that opens an image once:
//
//  - driver= is the format (none: probed), so -f is refused beside it, as
//    qemu-img refuses it ("--image-opts and --format are mutually
//    exclusive");
//  - cache.direct=on and cache.no-flush=on set the tool's cache mode (its
//    -t or -T) to none and unsafe; the option string wins over the flag;
//  - read-only=on, discard= and detect-zeroes= change nothing for a tool
//    that only reads; one that writes refuses them rather than ignore them;
//  - offset= and size= (driver=raw) make the tool see that byte window of
//    the file, where the tool reads through a block::Device (convert's
//    sources, compare, dd); the others refuse them;
//  - file.aio= is accepted (every mode runs on threads).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "block/device.h"
#include "util/result.h"

namespace thindisk::cli {

// --image-opts's help, the same for every tool.
inline constexpr char kImageOptsHelp[] =
    "The image arguments are option strings (driver=qcow2,file.filename=F,...), as "
    "qemu-img "
    "--image-opts";

enum class ImageUse { kRead, kWrite };

// driver=raw's offset= and size=: the window of the file the tool sees.
struct ImageWindow {
  uint64_t offset = 0;
  std::optional<uint64_t> size;  // nullopt: to the end of the file
  bool whole() const { return offset == 0 && !size.has_value(); }
};

// Rewrites `*name` (an option string) into the file name it names,
// `*format` into its driver's format and `*cache` (a cache mode option's
// text; null when the tool takes none) as the header says. `tool` names the
// command in refusals ("thindisk commit"); `format_flag` the format option
// ("-f"). `window` null: offset=/size= are refused. Errors:
// kInvalidArgument naming the key or the clash; nothing is opened.
Status ApplyImageOpts(std::string* name, std::string* format,
                      std::string_view format_flag, std::string* cache,
                      std::string_view tool, ImageUse use, ImageWindow* window = nullptr);

// kInvalidArgument, naming `file` and the sizes, unless [offset, offset +
// size) (size nullopt: to the end) lies inside an image of image_size bytes.
Status CheckWindow(const std::string& file, uint64_t offset, std::optional<uint64_t> size,
                   uint64_t image_size);

// `dev` (the image `file`) as the window shows it: itself when
// window.whole(); else closed and CheckWindow's error when it does not fit.
Result<std::unique_ptr<block::Device>> OpenWindow(const std::string& file,
                                                  std::unique_ptr<block::Device> dev,
                                                  const ImageWindow& window);

}  // namespace thindisk::cli
