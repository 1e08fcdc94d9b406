// TLS modes, and TlsServer::Create through the TLS module (nbd/tls.h).
#include "nbd/tls.h"

#include <string>
#include <utility>

#include "nbd/tls_module_abi.h"
#include "util/module_loader.h"

namespace thindisk::nbd {
namespace {

const util::ModuleSpec& Spec() {
  static const util::ModuleSpec spec{
      .file = tls_module::kModuleFile,
      .entry = tls_module::kModuleEntry,
      .kind = "TLS",
      .libraries = {"libgnutls", "libnettle", "libhogweed", "libgmp", "libp11-kit", "libtasn1",
                    "libidn2", "libunistring"},
      .install = "apt-get install libgnutls30",
  };
  return spec;
}

// The module, loaded by the first caller.
const Result<const tls_module::ModuleTable*>& Module() {
  static const Result<const tls_module::ModuleTable*> loaded =
      util::LoadModuleTable<tls_module::ModuleTable, tls_module::ModuleLayout>(Spec());
  return loaded;
}

}  // namespace

Result<TlsMode> ParseTlsMode(std::string_view text) {
  if (text == "off" || text == "no") return TlsMode::kOff;
  if (text == "on" || text == "yes") return TlsMode::kOn;
  if (text == "require") return TlsMode::kRequire;
  return Status::InvalidArgument("--tls: expected off, on or require, not '" + std::string(text) +
                                 "'");
}

std::string_view TlsModeName(TlsMode mode) {
  switch (mode) {
    case TlsMode::kOff:
      return "off";
    case TlsMode::kOn:
      return "on";
    case TlsMode::kRequire:
      return "require";
  }
  return "?";
}

Result<std::shared_ptr<TlsServer>> TlsServer::Create(TlsSettings settings) {
  if (settings.mode == TlsMode::kOff) return Status::InvalidArgument("TLS is off");
  if (settings.x509_dir.empty() == settings.psk_file.empty())
    return Status::InvalidArgument("TLS needs exactly one of --tls-creds DIR and --tls-psk FILE");
  TD_ASSIGN_OR_RETURN(const tls_module::ModuleTable* m, Module());
  return m->create_server(std::move(settings));
}

}  // namespace thindisk::nbd
