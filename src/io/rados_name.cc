#include "io/rados_name.h"

#include <cctype>
#include <cstdio>

namespace thindisk::io {
namespace {

Status Bad(std::string_view name, std::string_view why) {
  std::string m(name);
  m += ": ";
  m += why;
  return Status::InvalidArgument(std::move(m));
}

// 'c' quoted, or \xNN when it does not print.
std::string Shown(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (std::isprint(u)) return std::string("'") + c + "'";
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", u);
  return buf;
}

bool ImageChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
         c == '-' || c == '+' || c == '=' || c == '@' || c == ',';
}

// Pools may hold more than images may, but never what would make the URI
// ambiguous (separators) or unprintable.
bool PoolChar(char c) {
  return std::isgraph(static_cast<unsigned char>(c)) && c != '/' && c != '?' &&
         c != '&' && c != '#' && c != '%';
}

Status CheckImage(std::string_view name, std::string_view image) {
  if (image.empty()) return Bad(name, "no image name (want rados://POOL/IMAGE)");
  if (image.size() > RadosName::kMaxImageLength) {
    return Bad(name, "image name longer than " +
                         std::to_string(RadosName::kMaxImageLength) + " characters");
  }
  if (image.find('/') != std::string_view::npos) {
    return Bad(name, "image name contains '/' (want rados://POOL/IMAGE)");
  }
  for (char c : image) {
    if (!ImageChar(c)) {
      return Bad(name, "image name contains " + Shown(c) +
                           " (allowed: letters, digits and . _ - + = @ ,)");
    }
  }
  if (image.front() == '.') return Bad(name, "image name starts with '.'");
  return Status::Ok();
}

Status CheckPool(std::string_view name, std::string_view pool) {
  if (pool.empty()) return Bad(name, "no pool name (want rados://POOL/IMAGE)");
  if (pool.size() > RadosName::kMaxPoolLength) {
    return Bad(name, "pool name longer than " +
                         std::to_string(RadosName::kMaxPoolLength) + " characters");
  }
  for (char c : pool) {
    if (!PoolChar(c))
      return Bad(name, "pool name contains a space, control or URI character");
  }
  return Status::Ok();
}

// Parses "key=value&key=value" into `out`.
Status ParseQuery(std::string_view name, std::string_view query, RadosName& out) {
  if (query.empty()) return Bad(name, "empty query after '?'");
  bool seen_conf = false, seen_id = false;
  while (true) {
    const size_t amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return Bad(name, "query item '" + std::string(item) + "' is not key=value");
    }
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    if (value.empty()) return Bad(name, "empty value for '" + std::string(key) + "'");
    if (key == "conf") {
      if (seen_conf) return Bad(name, "'conf' given twice");
      seen_conf = true;
      out.conf = value;
    } else if (key == "id") {
      if (seen_id) return Bad(name, "'id' given twice");
      seen_id = true;
      if (value.starts_with("client.")) {
        return Bad(
            name, "id is the client name without 'client.' (id=admin, not client.admin)");
      }
      for (char c : value) {
        if (!std::isgraph(static_cast<unsigned char>(c))) {
          return Bad(name, "id contains a space or control character");
        }
      }
      out.id = value;
    } else {
      return Bad(name, "unknown key '" + std::string(key) + "' (known: conf, id)");
    }
    if (amp == std::string_view::npos) return Status::Ok();
    query.remove_prefix(amp + 1);
  }
}

}  // namespace

std::string RadosName::ToString() const {
  return std::string(kRadosScheme) + pool + "/" + image;
}

std::string RadosName::PoolUri() const { return std::string(kRadosScheme) + pool; }

std::string RadosName::Uri() const {
  std::string uri = ToString();
  char sep = '?';
  if (!conf.empty()) {
    uri.append(1, sep).append("conf=").append(conf);
    sep = '&';
  }
  if (!id.empty()) uri.append(1, sep).append("id=").append(id);
  return uri;
}

bool IsRadosName(std::string_view name) { return name.starts_with(kRadosScheme); }

namespace {

// The part between "rados://" and the query, with the query parsed into `out`.
Result<std::string_view> SplitQuery(std::string_view name, RadosName& out) {
  if (!IsRadosName(name))
    return Bad(name, "not a rados:// name (want rados://POOL/IMAGE)");
  if (name.find('#') != std::string_view::npos) return Bad(name, "'#' is not allowed");
  std::string_view rest = name.substr(kRadosScheme.size());
  const size_t q = rest.find('?');
  if (q != std::string_view::npos) {
    TD_RETURN_IF_ERROR(ParseQuery(name, rest.substr(q + 1), out));
    rest = rest.substr(0, q);
  }
  return rest;
}

}  // namespace

Result<RadosName> ParseRadosPool(std::string_view name) {
  RadosName out;
  TD_ASSIGN_OR_RETURN(std::string_view rest, SplitQuery(name, out));
  if (rest.ends_with('/')) rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos) {
    return Bad(name, "names an image, not a pool (want rados://POOL)");
  }
  TD_RETURN_IF_ERROR(CheckPool(name, rest));
  out.pool = rest;
  return out;
}

Result<RadosName> ParseRadosName(std::string_view name) {
  RadosName out;
  TD_ASSIGN_OR_RETURN(std::string_view rest, SplitQuery(name, out));
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos) {
    TD_RETURN_IF_ERROR(CheckPool(name, rest));
    return Bad(name, "no image name (want rados://POOL/IMAGE)");
  }
  out.pool = rest.substr(0, slash);
  out.image = rest.substr(slash + 1);
  TD_RETURN_IF_ERROR(CheckPool(name, out.pool));
  TD_RETURN_IF_ERROR(CheckImage(name, out.image));
  return out;
}

}  // namespace thindisk::io
