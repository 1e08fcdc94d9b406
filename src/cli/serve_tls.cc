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

// What --tls-creds names, for a server or for a client (-L).
struct Credentials {
  std::string x509_dir;
  std::string psk_file;
  bool verify_peer = true;  // an x509 object's verify-peer, else the option's
  std::string priority;     // a server object's priority
  std::string username;     // a client's PSK user
};

// --tls-creds CREDS: the id of a tls-creds-x509/-psk --object of that
// endpoint (qemu's default endpoint is the client; a server takes a missing
// one as its own), else a directory of X.509 files.
Result<Credentials> ResolveCredentials(const std::map<std::string, QemuObject>& objects,
                                       const std::string& creds, bool verify_peer, bool client) {
  Credentials c;
  c.verify_peer = verify_peer;
  if (creds.empty()) return c;
  auto it = objects.find(creds);
  if (it == objects.end()) {
    if (!IsDirectory(creds))
      return Status::InvalidArgument("--tls-creds " + creds +
                                     ": not a directory, nor the id of an --object");
    c.x509_dir = creds;
    return c;
  }
  const QemuObject& o = it->second;
  const bool x509 = o.type == "tls-creds-x509";
  if (!x509 && o.type != "tls-creds-psk")
    return Status::InvalidArgument("--tls-creds " + creds + ": --object " + o.type +
                                   " holds no TLS credentials");
  const std::string what = "--object " + o.type + ",id=" + creds;
  if (!client) {
    TD_RETURN_IF_ERROR(OnlyProps(o, {"id", "dir", "endpoint", "verify-peer", "priority"}));
  } else if (x509) {
    TD_RETURN_IF_ERROR(OnlyProps(o, {"id", "dir", "endpoint", "verify-peer"}));
  } else {
    TD_RETURN_IF_ERROR(OnlyProps(o, {"id", "dir", "endpoint", "username"}));
  }
  if (auto p = o.props.find("priority"); p != o.props.end()) c.priority = p->second;
  if (auto endpoint = o.props.find("endpoint");
      endpoint != o.props.end() && endpoint->second != (client ? "client" : "server"))
    return Status::InvalidArgument(what + (client ? ": -L/--list is a client and needs "
                                                    "endpoint=client"
                                                  : ": a server needs endpoint=server"));
  auto dir = o.props.find("dir");
  if (dir == o.props.end()) return Status::InvalidArgument(what + ": needs dir=DIR");
  if (x509) {
    c.x509_dir = dir->second;
    TD_ASSIGN_OR_RETURN(c.verify_peer, QemuBool(o, "verify-peer", true));
  } else {
    c.psk_file = dir->second + "/keys.psk";  // qemu's name in the directory
    auto user = o.props.find("username");
    c.username = user == o.props.end() ? "qemu" : user->second;  // qemu's default user
  }
  return c;
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
  s.allow = allow_;
  s.priority = priority_;
  TD_ASSIGN_OR_RETURN(auto objects, ParseObjects(objects_));
  TD_ASSIGN_OR_RETURN(Credentials given,
                      ResolveCredentials(objects, creds_, verify_peer_, /*client=*/false));
  s.x509_dir = given.x509_dir;
  s.psk_file = given.psk_file;
  s.verify_peer = given.verify_peer;
  if (priority_.empty() && !given.priority.empty()) s.priority = given.priority;
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

Result<nbdclient::ListTls> ServeTlsOptions::ListSettings() const {
  if (!authz_.empty() || !allow_.empty() || !priority_.empty())
    return Status::InvalidArgument(
        "-L/--list is a client: --tls-authz, --tls-allow and --tls-priority are a server's "
        "options");
  TD_ASSIGN_OR_RETURN(auto objects, ParseObjects(objects_));
  TD_ASSIGN_OR_RETURN(Credentials given,
                      ResolveCredentials(objects, creds_, verify_peer_, /*client=*/true));
  nbdclient::ListTls t;
  t.x509_dir = given.x509_dir;
  t.psk_file = given.psk_file;
  t.username = given.username;
  t.verify_peer = given.verify_peer;
  t.hostname = hostname_;
  if (!psk_.empty())
    return Status::InvalidArgument(
        "-L/--list with a PSK names its user: --object tls-creds-psk,id=ID,dir=DIR,"
        "endpoint=client,username=USER --tls-creds ID (DIR/keys.psk)");
  const bool have = !t.x509_dir.empty() || !t.psk_file.empty();
  t.mode = have ? nbd::TlsMode::kRequire : nbd::TlsMode::kOff;
  if (!mode_.empty()) {
    TD_ASSIGN_OR_RETURN(t.mode, nbd::ParseTlsMode(mode_));
  }
  if (t.mode != nbd::TlsMode::kOff && !have)
    return Status::InvalidArgument("--tls=" + mode_ + " needs credentials: --tls-creds");
  if (!have && !t.hostname.empty())
    return Status::InvalidArgument("--tls-hostname needs TLS credentials: --tls-creds");
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
