#include "nbdclient/nbd_uri.h"

#include <array>
#include <cctype>

namespace thindisk::nbdclient {

namespace {

constexpr std::array<std::string_view, 4> kSchemes = {"nbd", "nbd+unix", "nbds", "nbds+unix"};

}  // namespace

std::string UriScheme(std::string_view name) {
  size_t colon = name.find("://");
  if (colon == std::string_view::npos || colon == 0) return "";
  if (!std::isalpha(static_cast<unsigned char>(name[0]))) return "";
  for (size_t i = 0; i < colon; ++i) {
    unsigned char c = static_cast<unsigned char>(name[i]);
    if (!std::isalnum(c) && c != '+' && c != '-' && c != '.') return "";
  }
  return std::string(name.substr(0, colon));
}

bool IsNbdUri(std::string_view name) {
  const std::string scheme = UriScheme(name);
  for (std::string_view s : kSchemes) {
    if (scheme == s) return true;
  }
  return false;
}

std::string UnknownProtocolMessage(std::string_view name) {
  return std::string(name) + ": unknown protocol '" + UriScheme(name) +
         "' (images are files, nbd://, nbd+unix://, nbds://, nbds+unix:// URIs or "
         "rados://POOL/IMAGE)";
}

}  // namespace thindisk::nbdclient
