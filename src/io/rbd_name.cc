#include "io/rbd_name.h"

#include <cctype>
#include <vector>

namespace thindisk::io {
namespace {

Status Bad(std::string_view name, std::string_view why) {
  std::string m(name);
  m += ": ";
  m += why;
  return Status::InvalidArgument(std::move(m));
}

// Splits at unescaped ':' and turns "\:" (and "\\") into the character.
std::vector<std::string> SplitOptions(std::string_view s) {
  std::vector<std::string> parts(1);
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      parts.back() += s[++i];
    } else if (s[i] == ':') {
      parts.emplace_back();
    } else {
      parts.back() += s[i];
    }
  }
  return parts;
}

Status CheckPart(std::string_view name, std::string_view what, const std::string& part) {
  if (part.empty()) return Bad(name, "empty " + std::string(what) + " name");
  for (char c : part) {
    if (c == '/' || c == '@' || !std::isgraph(static_cast<unsigned char>(c))) {
      return Bad(name, std::string(what) +
                           " name contains a space, control character, '/' or '@'");
    }
  }
  return Status::Ok();
}

}  // namespace

std::string RbdName::ToString() const {
  std::string s(kRbdPrefix);
  s += pool + "/";
  if (!ns.empty()) s += ns + "/";
  s += image;
  if (!snap.empty()) s += "@" + snap;
  return s;
}

bool IsRbdName(std::string_view name) { return name.starts_with(kRbdPrefix); }

Result<RbdName> ParseRbdName(std::string_view name) {
  if (!IsRbdName(name)) return Bad(name, "not an rbd: name (want rbd:POOL/IMAGE)");
  std::vector<std::string> parts = SplitOptions(name.substr(kRbdPrefix.size()));
  RbdName out;
  std::string path = parts.front();
  const size_t at = path.find('@');
  if (at != std::string::npos) {
    out.snap = path.substr(at + 1);
    path.resize(at);
    TD_RETURN_IF_ERROR(CheckPart(name, "snapshot", out.snap));
  }
  std::vector<std::string> names;
  for (size_t from = 0;;) {
    const size_t slash = path.find('/', from);
    names.push_back(path.substr(from, slash - from));
    if (slash == std::string::npos) break;
    from = slash + 1;
  }
  if (names.size() < 2 || names.size() > 3) {
    return Bad(name, "want rbd:POOL/IMAGE or rbd:POOL/NAMESPACE/IMAGE");
  }
  out.pool = names.front();
  out.image = names.back();
  if (names.size() == 3) out.ns = names[1];
  TD_RETURN_IF_ERROR(CheckPart(name, "pool", out.pool));
  if (names.size() == 3) TD_RETURN_IF_ERROR(CheckPart(name, "namespace", out.ns));
  TD_RETURN_IF_ERROR(CheckPart(name, "image", out.image));
  bool seen_conf = false, seen_id = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& item = parts[i];
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq + 1 == item.size()) {
      return Bad(name, "option '" + item + "' is not key=value");
    }
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "conf" && !seen_conf) {
      seen_conf = true;
      out.conf = value;
    } else if (key == "id" && !seen_id) {
      seen_id = true;
      if (value.starts_with("client.")) {
        return Bad(name, "id is the client name without 'client.' (id=admin)");
      }
      out.id = value;
    } else if (key == "conf" || key == "id") {
      return Bad(name, "'" + key + "' given twice");
    } else {
      return Bad(name, "unknown option '" + key + "' (known: conf, id)");
    }
  }
  return out;
}

}  // namespace thindisk::io
