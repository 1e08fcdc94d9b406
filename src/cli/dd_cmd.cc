// thindisk dd: qemu-img dd. Copies a byte range of an image into a new
// image, with dd(1)'s operands:
//
//   if=INPUT  of=OUTPUT  bs=BLOCK_SIZE (default 512)  skip=N  count=N
//
// The copy starts at input block `skip` and stops at input block `count`
// (or the input's end), as qemu-img dd 7.2 counts: the skipped blocks are
// part of `count` (count=4 skip=2 copies blocks 2 and 3). The output is
// created in -O's format (raw by default; an existing file is replaced, as
// qemu-img does) and holds exactly the copied bytes (a qcow2 output is
// rounded up to whole sectors). The copy is convert's (holes stay holes,
// reads run ahead).
//
// Refused before anything is made, each with its reason: an unknown or
// repeated operand, a missing if= or of=, bs=0, a skip past the input's end
// (qemu-img says so and still makes an empty image), an output that is the
// input.
#include <CLI/CLI.hpp>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "block/open.h"
#include "cli/common.h"
#include "cli/convert_copy.h"
#include "cli/image_create.h"
#include "cli/image_opts.h"
#include "cli/image_summary.h"
#include "cli/serve_devices.h"
#include "cli/writeback.h"

namespace thindisk::cli {
namespace {

// What the operands say.
struct DdOperands {
  std::string input, output;
  uint64_t block_size = 512;
  uint64_t skip = 0;   // blocks
  uint64_t count = 0;  // blocks, when has_count
  bool has_count = false;
};

Result<uint64_t> OperandNumber(const std::string& key, const std::string& value) {
  Result<uint64_t> n = ParseSize(value);
  if (!n)
    return Status::InvalidArgument("invalid " + key + "='" + value +
                                   "': " + n.error().message());
  return *n;
}

Result<DdOperands> ParseOperands(const std::vector<std::string>& args) {
  DdOperands ops;
  std::map<std::string, bool> seen;
  for (const std::string& arg : args) {
    const size_t eq = arg.find('=');
    if (eq == std::string::npos) {
      return Status::InvalidArgument("unrecognized operand '" + arg +
                                     "': give if=, of=, bs=, count= or skip=");
    }
    const std::string key = arg.substr(0, eq);
    const std::string value = arg.substr(eq + 1);
    if (seen[key]) return Status::InvalidArgument("operand " + key + "= given twice");
    seen[key] = true;
    if (key == "if") {
      ops.input = value;
    } else if (key == "of") {
      ops.output = value;
    } else if (key == "bs") {
      TD_ASSIGN_OR_RETURN(ops.block_size, OperandNumber(key, value));
      if (ops.block_size == 0)
        return Status::InvalidArgument("invalid bs=0: a block holds at least one byte");
    } else if (key == "skip") {
      TD_ASSIGN_OR_RETURN(ops.skip, OperandNumber(key, value));
    } else if (key == "count") {
      TD_ASSIGN_OR_RETURN(ops.count, OperandNumber(key, value));
      ops.has_count = true;
    } else {
      return Status::InvalidArgument("unrecognized operand '" + arg +
                                     "': give if=, of=, bs=, count= or skip=");
    }
  }
  if (ops.input.empty()) return Status::InvalidArgument("give the input image: if=INPUT");
  if (ops.output.empty())
    return Status::InvalidArgument("give the output image: of=OUTPUT");
  return ops;
}

// blocks * block_size, or UINT64_MAX past 64 bits (further than any input).
uint64_t BlockBytes(uint64_t blocks, uint64_t block_size) {
  if (blocks > std::numeric_limits<uint64_t>::max() / block_size) {
    return std::numeric_limits<uint64_t>::max();
  }
  return blocks * block_size;
}

class DdCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand(
        "dd",
        "Copy a range of an image into a new one, in dd's operands (as qemu-img dd)");
    sub->footer(
        "Operands: if=INPUT of=OUTPUT [bs=BLOCK_SIZE (default 512)] [skip=BLOCKS] "
        "[count=BLOCKS]\nThe copy starts at input block skip= and stops at input block "
        "count= (skipped blocks count, as in qemu-img dd) or the input's end.");
    sub->add_option("-f", format_, "Input format (default: probe)");
    sub->add_flag("--image-opts", image_opts_,
                  "if= is an option string, as qemu-img --image-opts");
    sub->add_option("-O", out_format_, "Output format: raw (default) or qcow2")
        ->check(CLI::IsMember({"raw", "qcow2"}));
    sub->add_flag(
        "-U,--force-share", force_share_,
        "Read the input even while another process writes it (ignores its lock)");
    sub->add_flag("-p", progress_, "Show progress");
    sub->add_option("operands", operands_, "if=INPUT of=OUTPUT bs= skip= count=")
        ->required();
    return sub;
  }

  Result<Outcome> Run() override {
    TD_ASSIGN_OR_RETURN(DdOperands ops, ParseOperands(operands_));
    std::string format = format_;
    ImageWindow in_window;
    if (image_opts_) {
      TD_RETURN_IF_ERROR(ApplyImageOpts(&ops.input, &format, "-f", nullptr, "thindisk dd",
                                        ImageUse::kRead, &in_window));
    }
    block::OpenOptions in_options;
    in_options.format = format;
    in_options.read_only = true;
    in_options.force_share = force_share_;
    TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> opened,
                        block::Open(ops.input, in_options));
    TD_ASSIGN_OR_RETURN(opened, OpenWindow(ops.input, std::move(opened), in_window));
    std::shared_ptr<block::Device> input = std::move(opened);
    uint64_t end = input->size();
    if (ops.has_count) end = std::min(end, BlockBytes(ops.count, ops.block_size));
    const uint64_t start = BlockBytes(ops.skip, ops.block_size);
    if (start > end) {
      return Status::InvalidArgument(
          "cannot skip to byte " +
          (start == std::numeric_limits<uint64_t>::max() ? std::string("past 2^64")
                                                         : std::to_string(start)) +
          ": the input" + (ops.has_count ? " (cut at count=)" : "") + " ends at byte " +
          std::to_string(end));
    }
    TD_RETURN_IF_ERROR(RefuseSameFile(ops));
    TD_RETURN_IF_ERROR(RefuseTargetUnderSource(ops.input, format, ops.output));

    CreatePlan plan;
    plan.format = out_format_;
    plan.size = end - start;
    plan.have_size = true;
    TD_RETURN_IF_ERROR(CreateImageFile(ops.output, plan));
    Status s =
        Copy(std::make_shared<WindowDevice>(input, start, end - start), ops.output);
    if (!s.ok()) {
      RemoveCreatedImage(ops.output);
      return s;
    }
    (void)input->Close();
    return Outcome::kSuccess;
  }

 private:
  Status RefuseSameFile(const DdOperands& ops) const {
    if (SameImage(ops.input, ops.output) != nullptr) {
      return Status::InvalidArgument("the output is the input (" + ops.output +
                                     "): dd makes a new image");
    }
    return Status::Ok();
  }

  Status Copy(const std::shared_ptr<block::Device>& window, const std::string& output) {
    block::OpenOptions out_options;
    out_options.format = out_format_;
    TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> dst,
                        block::Open(output, out_options));
    Progress progress(progress_);
    BackgroundWriteback writeback(output);
    progress.Update(0, window->size());
    TD_RETURN_IF_ERROR(CopyPlain(*window, *dst, CopyOptions{}, progress, &writeback));
    progress.Finish();
    Status written_back = writeback.Finish();
    TD_RETURN_IF_ERROR(dst->Close());
    return written_back;
  }

  std::string format_;
  bool image_opts_ = false;
  std::string out_format_ = "raw";
  bool force_share_ = false;
  bool progress_ = false;
  std::vector<std::string> operands_;
};

}  // namespace

std::unique_ptr<Subcommand> NewDdCommand() { return std::make_unique<DdCommand>(); }

}  // namespace thindisk::cli
