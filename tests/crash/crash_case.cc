#include "crash/crash_case.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "crash/content_model.h"
#include "crash/workload.h"
#include "io/faulty_storage.h"
#include "io/memory_storage.h"
#include "qcow2/bitmaps.h"
#include "qcow2/check.h"
#include "qcow2/image.h"
#include "qcow2/image_test_util.h"

namespace thindisk::crash {
namespace {

using io::MemoryStorage;

uint64_t Mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 29);
}

qcow2::OpenOptions OpenOptionsFor(const Geometry& g, const std::vector<uint8_t>& backing,
                                  uint64_t cache_bytes, uint64_t mark_ahead = 0) {
  qcow2::OpenOptions o;
  if (g.backing_size) {
    // BackingBytes lives as long as the process: the backing devices share
    // it without owning it (an empty owner), and nothing is copied.
    using qcow2::testing::SharedBytes;
    o = qcow2::testing::BackedBy(SharedBytes(SharedBytes(), &backing));
  }
  o.cache_bytes = cache_bytes;
  o.bitmap_mark_ahead = mark_ahead;
  return o;
}

// Adds the workload's bitmaps to the image on `base` (before the faults).
Status AddBitmaps(io::Storage& base, uint64_t seed, const qcow2::OpenOptions& o) {
  const std::vector<BitmapSpec> specs = BitmapsFor(seed);
  if (specs.empty()) return Status::Ok();
  std::shared_ptr<io::Storage> shared(&base, [](io::Storage*) {});
  auto wrapper = io::NewFaultyStorage(shared);  // a non-owning view; no fault armed
  if (!wrapper) return wrapper.error();
  TD_ASSIGN_OR_RETURN(auto img, qcow2::Image::Open(std::move(*wrapper), o));
  for (const BitmapSpec& b : specs) {
    TD_RETURN_IF_ERROR(qcow2::AddBitmap(*img, {b.name, b.granularity_bits, true}));
  }
  return img->Close();
}

// (e) Every bitmap is consistent and marks every granule whose content
// differs from what it was when the bitmap was added (the workload's
// start): "" when so.
std::string CheckBitmaps(qcow2::Image& img, uint64_t seed, std::span<const uint8_t> content,
                         const std::vector<uint8_t>& initial) {
  const std::vector<BitmapSpec> specs = BitmapsFor(seed);
  if (specs.empty()) return "";
  if (!(img.header().autoclear_features & qcow2::kAutoclearBitmaps) || !img.header().bitmaps) {
    return "the bitmaps extension is gone or inconsistent (autoclear bit clear)";
  }
  auto list = qcow2::ListBitmaps(img);
  if (!list) return "bitmaps cannot be listed: " + list.error().ToString();
  if (list->size() != specs.size()) return "bitmaps: " + std::to_string(list->size()) + " listed";
  for (const BitmapSpec& spec : specs) {
    auto it = std::find_if(list->begin(), list->end(),
                           [&](const qcow2::BitmapInfo& b) { return b.name == spec.name; });
    if (it == list->end()) return "bitmap " + spec.name + " is gone";
    if (!it->consistent() || !it->enabled) {
      return "bitmap " + spec.name + " is not consistent and enabled: " + it->problem;
    }
    auto bits = qcow2::ReadBitmap(img, spec.name);
    if (!bits) return "bitmap " + spec.name + " does not read: " + bits.error().ToString();
    const uint64_t g = uint64_t{1} << spec.granularity_bits;
    for (uint64_t off = 0; off < content.size(); ++off) {
      const uint8_t was = off < initial.size() ? initial[off] : 0;
      if (content[off] == was || bits->Test(off / g)) continue;
      char msg[160];
      snprintf(msg, sizeof msg, "bitmap %s misses a change: byte 0x%llx differs, granule %llu clear",
               spec.name.c_str(), static_cast<unsigned long long>(off),
               static_cast<unsigned long long>(off / g));
      return msg;
    }
  }
  return "";
}

std::string CheckSummary(const qcow2::CheckReport& r) {
  std::string s = std::to_string(r.corruptions) + " corruptions, " + std::to_string(r.leaks) +
                  " leaks, " + std::to_string(r.check_errors) + " check errors";
  for (size_t i = 0; i < r.messages.size() && i < 6; ++i) s += "\n    " + r.messages[i];
  return s;
}

// Writes the image (and its raw backing file) to a fresh temporary
// directory and runs `qemu-img check`; "" when it exits 0 (clean) or 3
// (leaks only).
std::string QemuImgCheck(const std::string& qemu_img, MemoryStorage& image,
                         const std::vector<uint8_t>& backing,
                         const std::vector<BitmapSpec>& bitmaps) {
  char tmpl[] = "/tmp/thindisk-crash-XXXXXX";
  if (!mkdtemp(tmpl)) return "mkdtemp failed";
  std::filesystem::path dir(tmpl);
  auto write = [](const std::filesystem::path& p, const std::vector<uint8_t>& bytes) {
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    return bool(f);
  };
  std::string result;
  if (!write(dir / "img.qcow2", image.Contents()) || (!backing.empty() && !write(dir / "base", backing))) {
    result = "cannot write temporary image";
  } else {
    std::string cmd = qemu_img + " check -q -f qcow2 '" + (dir / "img.qcow2").string() +
                      "' >'" + (dir / "out").string() + "' 2>&1";
    int rc = system(cmd.c_str());
    int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    if (code != 0 && code != 3) {
      std::ifstream f(dir / "out");
      std::string out((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      result = "qemu-img check exited " + std::to_string(code) + ":\n" + out.substr(0, 2000);
    } else if (!bitmaps.empty()) {
      // qemu lists each bitmap, none in use: qemu-nbd -B would export it.
      cmd = qemu_img + " info --output=json -f qcow2 '" + (dir / "img.qcow2").string() +
            "' >'" + (dir / "out").string() + "' 2>&1";
      rc = system(cmd.c_str());
      std::ifstream f(dir / "out");
      std::string out((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      bool ok = WIFEXITED(rc) && WEXITSTATUS(rc) == 0 && out.find("in-use") == std::string::npos;
      for (const BitmapSpec& b : bitmaps) ok = ok && out.find("\"" + b.name + "\"") != std::string::npos;
      if (!ok) result = "qemu-img info does not list the bitmaps consistent:\n" + out.substr(0, 2000);
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return result;
}

class Case {
 public:
  Case(const CaseSpec& spec, const RunOptions& options, bool verify)
      : spec_(spec),
        options_(options),
        verify_(verify),
        g_(GeometryFor(spec.workload_seed)),
        backing_(BackingBytes(g_)),
        model_(g_.size, backing_) {}

  // Runs the workload with the fault armed at the nth announcement of the
  // step (0: no fault), then verifies what it left (unless a dry run).
  CaseResult Run(uint64_t nth);

 private:
  // Checks one state the crash left (`label` names it in failures).
  void Verify(const std::string& label, std::unique_ptr<MemoryStorage> state);
  void Fail(const std::string& label, const std::string& what) {
    if (result_.failure.empty()) result_.failure = label + ": " + what;
  }

  const CaseSpec spec_;
  const RunOptions& options_;
  const bool verify_;
  const Geometry& g_;
  const std::vector<uint8_t>& backing_;
  ContentModel model_;
  CaseResult result_;
};

void Case::Verify(const std::string& label, std::unique_ptr<MemoryStorage> state) {
  // (a) no corruption; leaks are allowed.
  auto report = qcow2::Check(*state, qcow2::RepairMode::kNone);
  if (!report) return Fail(label, "check failed: " + report.error().ToString());
  if (report->corruptions || report->check_errors) {
    return Fail(label, "check finds " + CheckSummary(*report));
  }
  if (!options_.qemu_img.empty()) {
    result_.qemu_img_checked = true;
    std::string q = QemuImgCheck(options_.qemu_img, *state, backing_,
                                 BitmapsFor(spec_.workload_seed));
    if (!q.empty()) return Fail(label, q);
  }
  // (b) + (c): the content, read through a read-only open.
  {
    auto opts = OpenOptionsFor(g_, backing_, 4 << 20);
    opts.read_only = true;
    auto img = qcow2::Image::Open(state->Clone(), opts);
    if (!img) return Fail(label, "does not open: " + img.error().ToString());
    uint64_t size = (*img)->size();
    if (size != g_.size && size != model_.size()) {
      return Fail(label, "virtual size " + std::to_string(size) + " is neither the old nor new");
    }
    thread_local std::vector<uint8_t> content;  // reused: big, and one per worker
    content.resize(size);
    for (uint64_t off = 0; off < size; off += 1 << 20) {
      uint64_t n = std::min<uint64_t>(1 << 20, size - off);
      Status s = (*img)->Read(off, std::span<uint8_t>(content.data() + off, n));
      if (!s.ok()) return Fail(label, "read fails: " + s.ToString());
    }
    std::string bad = model_.Verify(content);
    if (bad.empty()) {
      std::string bitmaps = CheckBitmaps(**img, spec_.workload_seed,
                                         std::span<const uint8_t>(content.data(), size), backing_);
      if (!bitmaps.empty()) return Fail(label, bitmaps);
    }
    if (!bad.empty()) {
      // Where the first bad byte maps to, for the failure message.
      uint64_t at = strtoull(bad.substr(bad.find("byte 0x") + 5).c_str(), nullptr, 16);
      auto ext = (*img)->GetStatus(at, 1);
      if (ext) {
        bad += "mapping there: data=" + std::to_string(ext->data) +
               " zero=" + std::to_string(ext->zero) + " depth=" + std::to_string(ext->depth) +
               " host=" + (ext->has_host_offset ? std::to_string(ext->host_offset) : "-") + "\n";
      }
      return Fail(label, "content:\n" + bad);
    }
  }
  // (d) repair leaves it clean, and usable.
  auto repaired = qcow2::Check(*state, qcow2::RepairMode::kAll);
  if (!repaired) return Fail(label, "repair failed: " + repaired.error().ToString());
  auto after = qcow2::Check(*state, qcow2::RepairMode::kNone);
  if (!after) return Fail(label, "check after repair failed: " + after.error().ToString());
  if (after->corruptions || after->leaks || after->check_errors) {
    return Fail(label, "after repair, check finds " + CheckSummary(*after));
  }
  auto img = qcow2::Image::Open(std::move(state), OpenOptionsFor(g_, backing_, 4 << 20));
  if (!img) return Fail(label, "repaired image does not open: " + img.error().ToString());
  std::vector<uint8_t> one(g_.cluster_size + 7, 0x5a);
  uint64_t at = Mix(spec_.workload_seed) % ((*img)->size() - one.size());
  Status s = (*img)->Write(at, one, {});
  if (s.ok()) s = (*img)->Close();
  if (!s.ok()) return Fail(label, "repaired image does not take a write: " + s.ToString());
  auto final_check = qcow2::Check((*img)->storage(), qcow2::RepairMode::kNone);
  if (!final_check || final_check->corruptions || final_check->leaks) {
    return Fail(label, "write after repair leaves " +
                           (final_check ? CheckSummary(*final_check) : final_check.error().ToString()));
  }
}

// A copy of what `base` holds now, to check without touching it.
Result<std::unique_ptr<MemoryStorage>> Snapshot(io::Storage& base) {
  if (auto* memory = dynamic_cast<MemoryStorage*>(&base)) return memory->Clone();
  auto copy = io::NewMemoryStorage(base.name());
  TD_ASSIGN_OR_RETURN(uint64_t size, base.Size());
  std::vector<uint8_t> chunk(1 << 20);
  for (uint64_t off = 0; off < size; off += chunk.size()) {
    std::span<uint8_t> part(chunk.data(), std::min<uint64_t>(chunk.size(), size - off));
    TD_RETURN_IF_ERROR(base.ReadAt(off, part));
    TD_RETURN_IF_ERROR(copy->WriteAt(off, part));
  }
  return copy;
}

CaseResult Case::Run(uint64_t nth) {
  std::shared_ptr<io::Storage> base;
  if (options_.make_base) {
    auto made = options_.make_base();
    if (!made) return {.failure = "base storage: " + made.error().ToString()};
    base = std::move(*made);
  } else {
    base = io::NewMemoryStorage("crash.qcow2");
  }
  Status s = qcow2::Create(*base, CreateOptionsFor(g_));
  if (!s.ok()) return {.failure = "create: " + s.ToString()};
  s = AddBitmaps(*base, spec_.workload_seed, OpenOptionsFor(g_, backing_, 4 << 20));
  if (!s.ok()) return {.failure = "adding bitmaps: " + s.ToString()};
  auto faulty_or = io::NewFaultyStorage(base);
  if (!faulty_or) return {.failure = "faulty storage: " + faulty_or.error().ToString()};
  io::FaultyStorage* faulty = faulty_or->get();

  const bool power = spec_.fault == FaultKind::kPowerDrop ||
                     spec_.fault == FaultKind::kPowerSubset || spec_.fault == FaultKind::kPowerTear;
  if (nth != 0) {
    io::FaultyStorage::EventFault f;
    f.event = spec_.event;
    f.nth = nth;
    f.error = spec_.fault == FaultKind::kEnospc ? ENOSPC : EIO;
    f.persistent = spec_.fault == FaultKind::kEnospc ||
                   (spec_.fault == FaultKind::kEio && spec_.workload_seed % 2 == 1);
    f.freeze = power;
    // A torn or partial power loss may keep part of the step's own write.
    f.freeze_after_next = spec_.fault == FaultKind::kPowerSubset ||
                          spec_.fault == FaultKind::kPowerTear;
    faulty->FailAtEvent(f);
  }
  auto img = qcow2::Image::Open(std::move(*faulty_or),
                                OpenOptionsFor(g_, backing_, CacheBytesFor(spec_.workload_seed),
                                               MarkAheadFor(spec_.workload_seed)));
  if (!img) return {.failure = "open: " + img.error().ToString()};

  // A power cut ends the workload at the step; errors let it run on.
  RunWorkload(spec_.workload_seed, **img, model_,
              [&] { return power && faulty->event_fault_fired(); });
  // Closed as a careful user would; after a power cut at the step this
  // fails, and the close itself may hold the step.
  uint64_t token = model_.FlushBegin();
  Status closed = (*img)->Close();
  model_.FlushEnd(token, closed.ok());
  for (int e = 0; e < io::kEventCount; ++e) result_.events[e] = faulty->event_count(io::Event(e));
  result_.fault_fired = faulty->event_fault_fired();
  if (!verify_) return result_;

  if (power) {
    io::PowerLossMode mode = spec_.fault == FaultKind::kPowerDrop
                                 ? io::PowerLossMode::kDropUnflushed
                             : spec_.fault == FaultKind::kPowerSubset
                                 ? io::PowerLossMode::kKeepRandomSubset
                                 : io::PowerLossMode::kTearLast;
    auto state = faulty->SimulatePowerLoss(mode, Mix(CaseId(spec_)));
    if (!state) return {.failure = "power loss: " + state.error().ToString()};
    Verify("after power loss", std::move(*state));
    return result_;
  }
  // Errors: both the live state and the state after a later power cut
  // must hold up.
  auto live = Snapshot(faulty->base());
  if (!live) return {.failure = "reading the live image: " + live.error().ToString()};
  Verify("live image after close (" + std::string(closed.ok() ? "ok" : closed.ToString()) + ")",
         std::move(*live));
  auto state = faulty->SimulatePowerLoss(io::PowerLossMode::kKeepRandomSubset,
                                         Mix(CaseId(spec_)));
  if (!state) return {.failure = "power loss: " + state.error().ToString()};
  Verify("after close and power loss", std::move(*state));
  return result_;
}

}  // namespace

const char* FaultName(FaultKind k) {
  switch (k) {
    case FaultKind::kNone: return "none";
    case FaultKind::kEio: return "eio";
    case FaultKind::kEnospc: return "enospc";
    case FaultKind::kPowerDrop: return "power-drop";
    case FaultKind::kPowerSubset: return "power-subset";
    case FaultKind::kPowerTear: return "power-tear";
  }
  return "?";
}

uint64_t CaseId(const CaseSpec& spec) {
  return spec.workload_seed << 16 | uint64_t(spec.event) << 8 | uint64_t(spec.fault);
}

std::optional<CaseSpec> CaseFromId(uint64_t id) {
  const uint64_t seed = id >> 16, event = (id >> 8) & 0xff, fault = id & 0xff;
  if (seed > kMaxWorkloadSeed || event >= uint64_t(io::kEventCount) ||
      fault >= uint64_t(kFaultKinds)) {
    return std::nullopt;
  }
  return CaseSpec{seed, io::Event(event), FaultKind(fault)};
}

std::string Describe(const CaseSpec& spec) {
  return "workload " + std::to_string(spec.workload_seed) + " (" +
         GeometryFor(spec.workload_seed).name + ", " +
         std::to_string(ThreadsFor(spec.workload_seed)) + " thread(s)), fault " +
         FaultName(spec.fault) + " at " + io::EventName(spec.event);
}

CaseResult CountEvents(uint64_t workload_seed, const RunOptions& options) {
  CaseSpec dry;
  dry.workload_seed = workload_seed;
  RunOptions counting;
  counting.make_base = options.make_base;  // the same storage, the same steps
  return Case(dry, counting, false).Run(0);
}

CaseResult RunCase(const CaseSpec& spec, const RunOptions& options,
                   const std::array<uint64_t, io::kEventCount>* counts) {
  if (spec.fault == FaultKind::kNone) return Case(spec, options, true).Run(0);
  CaseResult counted;
  if (!counts) {
    counted = CountEvents(spec.workload_seed, options);
    if (!counted.failure.empty()) return counted;
    counts = &counted.events;
  }
  uint64_t count = (*counts)[int(spec.event)];
  if (count == 0) return CaseResult{};  // the step never happens: no case
  uint64_t nth = 1 + Mix(CaseId(spec)) % count;
  return Case(spec, options, true).Run(nth);
}

}  // namespace thindisk::crash
