#include "vmdk/descriptor.h"

#include <cstring>

namespace thindisk::vmdk {

namespace {

constexpr std::string_view kDescriptorSignature = "# Disk DescriptorFile";

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

std::string_view Unquote(std::string_view s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') return s.substr(1, s.size() - 2);
  return s;
}

// Splits off the next whitespace-delimited token of `s`.
std::string_view NextToken(std::string_view& s) {
  s = Trim(s);
  size_t end = s.find_first_of(" \t");
  std::string_view token = s.substr(0, end);
  s = end == std::string_view::npos ? std::string_view() : s.substr(end);
  return token;
}

bool ParseDecimal(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 19) return false;  // 19 digits always fit in uint64_t
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + uint64_t(c - '0');
  }
  *out = v;
  return true;
}

bool ParseHex32(std::string_view s, uint32_t* out) {
  if (s.empty() || s.size() > 8) return false;
  uint32_t v = 0;
  for (char c : s) {
    int d = (c >= '0' && c <= '9')   ? c - '0'
            : (c >= 'a' && c <= 'f') ? c - 'a' + 10
            : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                     : -1;
    if (d < 0) return false;
    v = v << 4 | uint32_t(d);
  }
  *out = v;
  return true;
}

bool IsExtentLine(std::string_view line) {
  for (std::string_view access : {"RW ", "RDONLY ", "NOACCESS "}) {
    if (line.substr(0, access.size()) == access) return true;
  }
  return false;
}

// RW 20480 FLAT "name with spaces.vmdk" 0
Result<ExtentLine> ParseExtentLine(std::string_view line) {
  const std::string bad = "vmdk descriptor: malformed extent line '" +
                          std::string(line.substr(0, 80)) + "'";
  ExtentLine e;
  std::string_view rest = line;
  e.access = std::string(NextToken(rest));
  if (!ParseDecimal(NextToken(rest), &e.sectors)) return Status::Corrupt(bad);
  e.type = std::string(NextToken(rest));
  if (e.type.empty()) return Status::Corrupt(bad);
  rest = Trim(rest);
  if (rest.empty()) return e;  // ZERO extents have no file
  if (rest.front() != '"') return Status::Corrupt(bad);
  size_t close = rest.find('"', 1);
  if (close == std::string_view::npos) return Status::Corrupt(bad);
  e.filename = std::string(rest.substr(1, close - 1));
  rest = Trim(rest.substr(close + 1));
  if (!rest.empty()) {
    std::string_view offset = NextToken(rest);
    if (!ParseDecimal(offset, &e.offset)) return Status::Corrupt(bad);
    // Anything after the offset (ESX partition UUIDs) is not ours to read.
  }
  return e;
}

}  // namespace

bool LooksLikeDescriptor(std::span<const uint8_t> head) {
  return head.size() >= kDescriptorSignature.size() &&
         std::memcmp(head.data(), kDescriptorSignature.data(), kDescriptorSignature.size()) == 0;
}

Result<Descriptor> ParseDescriptor(std::string_view text) {
  text = text.substr(0, text.find('\0'));
  Descriptor d;
  bool have_create_type = false;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = Trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (line.empty() || line.front() == '#') continue;
    if (IsExtentLine(line)) {
      if (d.extents.size() >= kMaxExtentLines) {
        return Status::Corrupt("vmdk descriptor has more than " +
                               std::to_string(kMaxExtentLines) + " extents");
      }
      TD_ASSIGN_OR_RETURN(ExtentLine e, ParseExtentLine(line));
      d.extents.push_back(std::move(e));
      continue;
    }
    size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;  // not ours to judge
    std::string_view key = Trim(line.substr(0, eq));
    std::string_view value = Unquote(Trim(line.substr(eq + 1)));
    if (key == "createType") {
      d.create_type = std::string(value);
      have_create_type = true;
    } else if (key == "CID" || key == "parentCID") {
      uint32_t* field = key == "CID" ? &d.cid : &d.parent_cid;
      if (!ParseHex32(value, field)) {
        return Status::Corrupt("vmdk descriptor: " + std::string(key) + " '" +
                               std::string(value.substr(0, 40)) + "' is not a 32-bit hex number");
      }
    }
  }
  if (!have_create_type) return Status::Corrupt("vmdk descriptor has no createType");
  return d;
}

bool IsSparseCreateType(const std::string& create_type) {
  return create_type == "monolithicSparse" || create_type == "streamOptimized";
}

Status CheckSupported(const Descriptor& d) {
  const std::string& t = d.create_type;
  bool flat = t == "monolithicFlat" || t == "vmfs";
  if (!IsSparseCreateType(t) && !flat) {
    if (t.rfind("twoGbMaxExtent", 0) == 0) {
      return Status::NotSupported("split vmdk images (createType " + t +
                                  ") are not supported; only monolithic ones");
    }
    return Status::NotSupported("vmdk createType '" + t.substr(0, 64) +
                                "' is not supported (monolithicSparse, streamOptimized, "
                                "monolithicFlat, vmfs are)");
  }
  if (d.extents.size() != 1) {
    return Status::NotSupported("vmdk with " + std::to_string(d.extents.size()) +
                                " extents is not supported; only single-extent images");
  }
  if (d.parent_cid != kNoParentCid) {
    return Status::NotSupported("vmdk delta links (parentCID set) are not supported");
  }
  const ExtentLine& e = d.extents.front();
  if (e.access == "NOACCESS") return Status::NotSupported("vmdk extent is marked NOACCESS");
  const char* want = IsSparseCreateType(t) ? "SPARSE" : (t == "vmfs" ? "VMFS" : "FLAT");
  if (e.type != want) {
    return Status::Corrupt("vmdk createType " + t + " has a " + e.type.substr(0, 16) +
                           " extent (expected " + want + ")");
  }
  if (e.filename.empty()) return Status::Corrupt("vmdk extent line names no file");
  return Status::Ok();
}

}  // namespace thindisk::vmdk
