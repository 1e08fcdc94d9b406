// TlsAuthz: which TLS clients may use the server once their handshake has
// succeeded: a list of rules matched against the client's identity, the
// distinguished name of its X.509 certificate (RFC 4514 order, CN first:
// "CN=alice,O=Example") or its PSK user name.
//
// The rules come from `--tls-allow PATTERN` (a glob, allow) and from a
// `--tls-authz FILE` in the format of qemu's authz-list-file object, so an
// operator's qemu-nbd file works as it is:
//
//   {"policy": "deny",
//    "rules": [{"match": "CN=alice,*", "policy": "allow", "format": "glob"},
//              {"match": "CN=bob,O=Example", "policy": "deny"}]}
//
// The first rule that matches decides; without a match the list's "policy"
// does (default deny). A certificate's DN is matched in both orders: RFC
// 4514's, CN first ("CN=alice,O=Example"), and the certificate's own, which
// qemu 7.2 matches ("O=Example,CN=alice"), so qemu-nbd's authz files work
// unchanged. "format" is "exact" (the default) or "glob" (fnmatch,
// no special meaning for '/'). An authz with no rules and no file lets
// everyone in (the handshake alone decides).
//
// Thread safety: immutable once built; const calls from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "util/result.h"

namespace thindisk::nbd {

class TlsAuthz {
 public:
  struct Rule {
    std::string match;
    bool allow = true;
    bool glob = false;
  };

  // Parses a qemu authz-list-file document; `origin` names it in errors.
  static Result<TlsAuthz> ParseList(std::string_view json, const std::string& origin);
  static Result<TlsAuthz> LoadListFile(const std::string& path);

  // Appends an allow rule for the glob `pattern`.
  void AllowGlob(std::string pattern);

  // True when no rule was given: everyone is allowed.
  bool open() const { return rules_.empty() && !from_file_; }
  bool Allows(std::string_view identity) const { return AllowsAny({std::string(identity)}); }
  // A rule matches when it matches any of `names` (one identity's spellings).
  bool AllowsAny(const std::vector<std::string>& names) const;
  const std::vector<Rule>& rules() const { return rules_; }

 private:
  std::vector<Rule> rules_;
  bool default_allow_ = false;
  bool from_file_ = false;
};

}  // namespace thindisk::nbd
