#include "nbd/tls_authz.h"

#include <fnmatch.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace thindisk::nbd {
namespace {

Status Bad(const std::string& origin, const std::string& what) {
  return Status::InvalidArgument(origin + ": " + what);
}

// "allow" -> true, "deny" -> false.
Result<bool> ParsePolicy(const nlohmann::json& v, const std::string& origin,
                         const std::string& where) {
  if (!v.is_string()) return Bad(origin, where + " \"policy\" must be \"allow\" or \"deny\"");
  const std::string s = v.get<std::string>();
  if (s == "allow") return true;
  if (s == "deny") return false;
  return Bad(origin, where + " \"policy\" must be \"allow\" or \"deny\", not \"" + s + "\"");
}

}  // namespace

Result<TlsAuthz> TlsAuthz::ParseList(std::string_view json, const std::string& origin) {
  nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Bad(origin, "not valid JSON");
  if (!doc.is_object()) return Bad(origin, "expected a JSON object with \"rules\" and \"policy\"");
  TlsAuthz authz;
  authz.from_file_ = true;
  for (const auto& [key, value] : doc.items()) {
    if (key == "policy") {
      TD_ASSIGN_OR_RETURN(authz.default_allow_, ParsePolicy(value, origin, "the list's"));
    } else if (key != "rules") {
      return Bad(origin, "unknown key \"" + key + "\" (expected \"rules\" and \"policy\")");
    }
  }
  if (!doc.contains("rules")) return authz;
  const nlohmann::json& rules = doc["rules"];
  if (!rules.is_array()) return Bad(origin, "\"rules\" must be an array");
  for (size_t i = 0; i < rules.size(); ++i) {
    const std::string where = "rule " + std::to_string(i + 1);
    const nlohmann::json& r = rules[i];
    if (!r.is_object()) return Bad(origin, where + " must be an object");
    Rule rule;
    bool have_match = false, have_policy = false;
    for (const auto& [key, value] : r.items()) {
      if (key == "match") {
        if (!value.is_string()) return Bad(origin, where + " \"match\" must be a string");
        rule.match = value.get<std::string>();
        have_match = true;
      } else if (key == "policy") {
        TD_ASSIGN_OR_RETURN(rule.allow, ParsePolicy(value, origin, where));
        have_policy = true;
      } else if (key == "format") {
        const std::string f = value.is_string() ? value.get<std::string>() : "";
        if (f != "exact" && f != "glob")
          return Bad(origin, where + " \"format\" must be \"exact\" or \"glob\"");
        rule.glob = f == "glob";
      } else {
        return Bad(origin, where + ": unknown key \"" + key + "\"");
      }
    }
    if (!have_match || !have_policy) return Bad(origin, where + " needs \"match\" and \"policy\"");
    authz.rules_.push_back(std::move(rule));
  }
  return authz;
}

Result<TlsAuthz> TlsAuthz::LoadListFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::FromErrno(errno, path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::FromErrno(errno, path);
  return ParseList(text.str(), path);
}

void TlsAuthz::AllowGlob(std::string pattern) {
  rules_.push_back({std::move(pattern), /*allow=*/true, /*glob=*/true});
}

bool TlsAuthz::AllowsAny(const std::vector<std::string>& names) const {
  if (open()) return true;
  for (const Rule& r : rules_) {
    for (const std::string& id : names) {
      const bool hit = r.glob ? fnmatch(r.match.c_str(), id.c_str(), 0) == 0 : r.match == id;
      if (hit) return r.allow;
    }
  }
  return default_allow_;
}

}  // namespace thindisk::nbd
