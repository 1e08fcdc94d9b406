#include "cli/serve_tls.h"

#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <map>
#include <utility>

namespace thindisk::cli {
namespace {

// One --object: its type and key=value properties (qemu's syntax: a
// literal comma in a value is written twice).
struct QemuObject {
  std::string type;
  std::map<std::string, std::string> props;
};

Result<QemuObject> ParseQemuObject(const std::string& text) {
  std::vector<std::string> parts(1);
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == ',' && i + 1 < text.size() && text[i + 1] == ',') {
      parts.back() += ',';
      ++i;
    } else if (text[i] == ',') {
      parts.emplace_back();
    } else {
      parts.back() += text[i];
    }
  }
  QemuObject o;
  for (size_t i = 0; i < parts.size(); ++i) {
    const size_t eq = parts[i].find('=');
    if (i == 0 && eq == std::string::npos) {
      o.type = parts[i];
      continue;
    }
    if (eq == std::string::npos || eq == 0)
      return Status::InvalidArgument("--object '" + text + "': expected KEY=VALUE, not '" +
                                     parts[i] + "'");
    std::string key = parts[i].substr(0, eq);
    std::string value = parts[i].substr(eq + 1);
    if (key == "qom-type") {
      o.type = std::move(value);
    } else if (!o.props.emplace(std::move(key), std::move(value)).second) {
      return Status::InvalidArgument("--object '" + text + "': '" + parts[i].substr(0, eq) +
                                     "' given twice");
    }
  }
  if (o.type.empty() || !o.props.count("id"))
    return Status::InvalidArgument("--object '" + text + "': needs a type and id=ID");
  return o;
}

Result<bool> QemuBool(const QemuObject& o, const std::string& key, bool fallback) {
  auto it = o.props.find(key);
  if (it == o.props.end()) return fallback;
  const std::string& v = it->second;
  if (v == "on" || v == "yes" || v == "true") return true;
  if (v == "off" || v == "no" || v == "false") return false;
  return Status::InvalidArgument("--object " + o.type + ": " + key + "=" + v +
                                 ": expected on or off");
}

// Only the properties a server uses; anything else is refused by name, so
// nothing a user asked for is silently ignored.
Status OnlyProps(const QemuObject& o, std::initializer_list<const char*> known) {
  for (const auto& [key, value] : o.props) {
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    if (!ok)
      return Status::NotSupported("--object " + o.type + ",id=" + o.props.at("id") + ": '" + key +
                                  "' is not supported");
  }
  return Status::Ok();
}

// The --object options by id, only the types thindisk knows.
Result<std::map<std::string, QemuObject>> ParseObjects(const std::vector<std::string>& texts) {
  std::map<std::string, QemuObject> objects;
  for (const std::string& text : texts) {
    TD_ASSIGN_OR_RETURN(QemuObject o, ParseQemuObject(text));
    if (o.type != "tls-creds-x509" && o.type != "tls-creds-psk" && o.type != "authz-simple" &&
        o.type != "authz-list-file") {
      return Status::NotSupported("--object " + o.type +
                                  ": only tls-creds-x509, tls-creds-psk, authz-simple and "
                                  "authz-list-file objects are supported");
    }
    const std::string id = o.props["id"];
    if (!objects.emplace(id, std::move(o)).second)
      return Status::InvalidArgument("--object: two objects with id=" + id);
  }
  return objects;
}

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

void ServeTlsOptions::Register(CLI::App* sub) {
  sub->add_option("--tls-creds", creds_,
                  "TLS with X.509: DIR holds ca-cert.pem, server-cert.pem, server-key.pem "
                  "(and ca-crl.pem); or the id of an --object tls-creds-x509/tls-creds-psk");
  sub->add_option("--tls-psk", psk_, "TLS with pre-shared keys: FILE of username:hexkey lines");
  sub->add_option("--tls", mode_,
                  "off, on (STARTTLS offered) or require (the default with credentials: "
                  "nothing but STARTTLS before TLS)");
  sub->add_flag("--tls-verify-peer,!--no-tls-verify-peer", verify_peer_,
                "Require client certificates signed by ca-cert.pem (default: yes)");
  sub->add_option("--tls-authz", authz_,
                  "Who may connect: a qemu authz-list-file JSON FILE, or the id of an "
                  "--object authz-simple/authz-list-file");
  sub->add_option("--tls-allow", allow_,
                  "Allow the client certificate DN or PSK user matching this glob "
                  "(repeatable; everyone else is refused)")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_option("--tls-priority", priority_,
                  "GnuTLS priority string (default: GnuTLS's NORMAL, AES-128-GCM first)");
  sub->add_option("--object", objects_,
                  "qemu-nbd's TLS objects: tls-creds-x509, tls-creds-psk, authz-simple, "
                  "authz-list-file (repeatable)")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_option("--tls-hostname", hostname_,
                  "With -L: the name the server's certificate must carry (a client's option)");
}

Result<nbd::TlsSettings> ServeTlsOptions::Settings() const {
  if (!hostname_.empty())
    return Status::InvalidArgument(
        "--tls-hostname checks the server's name on a client's side (-L/--list); a server does "
        "not use it");
  nbd::TlsSettings s;
  s.verify_peer = verify_peer_;
  s.allow = allow_;
  s.priority = priority_;
  TD_ASSIGN_OR_RETURN(auto objects, ParseObjects(objects_));
  // --tls-creds: an object's id, else a directory.
  if (auto it = objects.find(creds_); !creds_.empty() && it != objects.end()) {
    const QemuObject& o = it->second;
    if (o.type != "tls-creds-x509" && o.type != "tls-creds-psk")
      return Status::InvalidArgument("--tls-creds " + creds_ + ": --object " + o.type +
                                     " holds no TLS credentials");
    TD_RETURN_IF_ERROR(OnlyProps(o, {"id", "dir", "endpoint", "verify-peer", "priority"}));
    if (auto p = o.props.find("priority"); p != o.props.end() && priority_.empty())
      s.priority = p->second;
    auto endpoint = o.props.find("endpoint");
    if (endpoint != o.props.end() && endpoint->second != "server")
      return Status::InvalidArgument("--object " + o.type + ",id=" + creds_ +
                                     ": a server needs endpoint=server");
    auto dir = o.props.find("dir");
    if (dir == o.props.end())
      return Status::InvalidArgument("--object " + o.type + ",id=" + creds_ + ": needs dir=DIR");
    if (o.type == "tls-creds-x509") {
      s.x509_dir = dir->second;
      TD_ASSIGN_OR_RETURN(s.verify_peer, QemuBool(o, "verify-peer", true));
    } else {
      s.psk_file = dir->second + "/keys.psk";  // qemu's name in the directory
    }
  } else if (!creds_.empty()) {
    if (!IsDirectory(creds_))
      return Status::InvalidArgument("--tls-creds " + creds_ +
                                     ": not a directory, nor the id of an --object");
    s.x509_dir = creds_;
  }
  if (!psk_.empty()) {
    if (!s.x509_dir.empty() || !s.psk_file.empty())
      return Status::InvalidArgument("--tls-psk cannot be combined with --tls-creds");
    s.psk_file = psk_;
  }
  // --tls-authz: an object's id, else a file.
  if (auto it = objects.find(authz_); !authz_.empty() && it != objects.end()) {
    const QemuObject& o = it->second;
    if (o.type == "authz-simple") {
      TD_RETURN_IF_ERROR(OnlyProps(o, {"id", "identity"}));
      auto identity = o.props.find("identity");
      if (identity == o.props.end())
        return Status::InvalidArgument("--object authz-simple,id=" + authz_ +
                                       ": needs identity=NAME");
      // An exact name: escape what a glob would take for a pattern.
      std::string exact;
      for (char c : identity->second) {
        if (c == '*' || c == '?' || c == '[' || c == '\\') exact += '\\';
        exact += c;
      }
      s.allow.push_back(std::move(exact));
    } else if (o.type == "authz-list-file") {
      TD_RETURN_IF_ERROR(OnlyProps(o, {"id", "filename", "refresh"}));
      auto file = o.props.find("filename");
      if (file == o.props.end())
        return Status::InvalidArgument("--object authz-list-file,id=" + authz_ +
                                       ": needs filename=FILE");
      s.authz_file = file->second;  // re-read on SIGHUP (qemu's refresh=on: inotify)
    } else {
      return Status::InvalidArgument("--tls-authz " + authz_ + ": --object " + o.type +
                                     " is no authorization list");
    }
  } else {
    s.authz_file = authz_;
  }
  const bool creds = !s.x509_dir.empty() || !s.psk_file.empty();
  if (mode_.empty()) {
    s.mode = creds ? nbd::TlsMode::kRequire : nbd::TlsMode::kOff;
  } else {
    TD_ASSIGN_OR_RETURN(s.mode, nbd::ParseTlsMode(mode_));
  }
  if (s.mode != nbd::TlsMode::kOff && !creds)
    return Status::InvalidArgument("--tls=" + mode_ +
                                   " needs credentials: --tls-creds DIR or --tls-psk FILE");
  if (!creds && (!s.authz_file.empty() || !s.allow.empty()))
    return Status::InvalidArgument(
        "--tls-authz/--tls-allow need TLS credentials (--tls-creds DIR or --tls-psk FILE)");
  return s;
}

Result<std::shared_ptr<nbd::TlsServer>> ServeTlsOptions::Build() const {
  TD_ASSIGN_OR_RETURN(nbd::TlsSettings s, Settings());
  if (s.mode == nbd::TlsMode::kOff) return std::shared_ptr<nbd::TlsServer>();
  return nbd::TlsServer::Create(std::move(s));
}

Result<ListTls> ServeTlsOptions::ListSettings() const {
  if (!authz_.empty() || !allow_.empty() || !priority_.empty())
    return Status::InvalidArgument(
        "-L/--list is a client: --tls-authz, --tls-allow and --tls-priority are a server's "
        "options");
  ListTls t;
  t.hostname = hostname_;
  t.verify_peer = verify_peer_;
  TD_ASSIGN_OR_RETURN(auto objects, ParseObjects(objects_));
  if (auto it = objects.find(creds_); !creds_.empty() && it != objects.end()) {
    const QemuObject& o = it->second;
    const std::string what = "--object " + o.type + ",id=" + creds_;
    if (o.type == "tls-creds-x509") {
      TD_RETURN_IF_ERROR(OnlyProps(o, {"id", "dir", "endpoint", "verify-peer"}));
    } else if (o.type == "tls-creds-psk") {
      TD_RETURN_IF_ERROR(OnlyProps(o, {"id", "dir", "endpoint", "username"}));
    } else {
      return Status::InvalidArgument("--tls-creds " + creds_ + ": --object " + o.type +
                                     " holds no TLS credentials");
    }
    // qemu's default endpoint is the client.
    if (auto endpoint = o.props.find("endpoint");
        endpoint != o.props.end() && endpoint->second != "client")
      return Status::InvalidArgument(what + ": -L/--list is a client and needs endpoint=client");
    auto dir = o.props.find("dir");
    if (dir == o.props.end()) return Status::InvalidArgument(what + ": needs dir=DIR");
    if (o.type == "tls-creds-x509") {
      t.x509_dir = dir->second;
      TD_ASSIGN_OR_RETURN(t.verify_peer, QemuBool(o, "verify-peer", true));
    } else {
      t.psk_file = dir->second + "/keys.psk";  // qemu's name in the directory
      auto user = o.props.find("username");
      t.username = user == o.props.end() ? "qemu" : user->second;  // qemu's default user
    }
  } else if (!creds_.empty()) {
    if (!IsDirectory(creds_))
      return Status::InvalidArgument("--tls-creds " + creds_ +
                                     ": not a directory, nor the id of an --object");
    t.x509_dir = creds_;
  }
  if (!psk_.empty())
    return Status::InvalidArgument(
        "-L/--list with a PSK names its user: --object tls-creds-psk,id=ID,dir=DIR,"
        "endpoint=client,username=USER --tls-creds ID (DIR/keys.psk)");
  const bool creds = !t.x509_dir.empty() || !t.psk_file.empty();
  nbd::TlsMode mode = creds ? nbd::TlsMode::kRequire : nbd::TlsMode::kOff;
  if (!mode_.empty()) {
    TD_ASSIGN_OR_RETURN(mode, nbd::ParseTlsMode(mode_));
  }
  if (mode != nbd::TlsMode::kOff && !creds)
    return Status::InvalidArgument("--tls=" + mode_ + " needs credentials: --tls-creds");
  if (!creds && !t.hostname.empty())
    return Status::InvalidArgument("--tls-hostname needs TLS credentials: --tls-creds");
  t.on = mode != nbd::TlsMode::kOff;
  t.require = mode == nbd::TlsMode::kRequire;
  return t;
}

std::string ServeTlsOptions::Describe(const nbd::TlsServer& tls) {
  const nbd::TlsSettings& s = tls.settings();
  std::string out = s.mode == nbd::TlsMode::kRequire ? "TLS required" : "TLS offered";
  if (!s.psk_file.empty()) return out + " (PSK users of " + s.psk_file + ")";
  out += " (X.509 from " + s.x509_dir;
  out += s.verify_peer ? ", client certificates verified)" : ", no client certificates)";
  return out;
}

}  // namespace thindisk::cli
