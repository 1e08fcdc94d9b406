#include "nbd/tls_authz.h"

#include <gtest/gtest.h>

namespace thindisk::nbd {
namespace {

TEST(TlsAuthzTest, NoRulesLetsEveryoneIn) {
  TlsAuthz open;
  EXPECT_TRUE(open.open());
  EXPECT_TRUE(open.Allows("CN=anyone"));
  EXPECT_TRUE(open.Allows(""));
}

TEST(TlsAuthzTest, AllowGlobsRefuseEveryoneElse) {
  TlsAuthz a;
  a.AllowGlob("CN=alice,*");
  a.AllowGlob("carol");
  EXPECT_FALSE(a.open());
  EXPECT_TRUE(a.Allows("CN=alice,O=thindisk test"));
  EXPECT_TRUE(a.Allows("carol"));
  EXPECT_FALSE(a.Allows("CN=bob,O=thindisk test"));
  EXPECT_FALSE(a.Allows("CN=alice"));  // the glob wants the comma
  EXPECT_FALSE(a.Allows(""));
}

// qemu's authz-list-file: first match decides, then the list's policy.
TEST(TlsAuthzTest, QemuListFileFirstMatchDecides) {
  auto a = TlsAuthz::ParseList(R"({"policy": "allow", "rules": [
      {"match": "CN=bob,O=Example", "policy": "deny"},
      {"match": "CN=*,O=Evil", "policy": "deny", "format": "glob"}]})",
                               "list.json");
  ASSERT_TRUE(a.has_value()) << a.status().message();
  EXPECT_FALSE(a->Allows("CN=bob,O=Example"));
  EXPECT_FALSE(a->Allows("CN=eve,O=Evil"));
  EXPECT_TRUE(a->Allows("CN=alice,O=Example"));
  // "exact" is the default format: a '*' in it is no pattern.
  auto exact = TlsAuthz::ParseList(R"({"rules": [{"match": "CN=*", "policy": "allow"}]})", "f");
  ASSERT_TRUE(exact.has_value());
  EXPECT_TRUE(exact->Allows("CN=*"));
  EXPECT_FALSE(exact->Allows("CN=alice"));  // and the default policy is deny
  // A file with no rules denies everyone (unlike no file at all).
  auto none = TlsAuthz::ParseList(R"({"policy": "deny"})", "f");
  ASSERT_TRUE(none.has_value());
  EXPECT_FALSE(none->open());
  EXPECT_FALSE(none->Allows("CN=alice"));
}

// An identity is several spellings (a DN in both orders): any matches.
TEST(TlsAuthzTest, AnySpellingOfTheIdentityMatches) {
  auto qemu_order = TlsAuthz::ParseList(
      R"({"rules": [{"match": "O=thindisk test,CN=alice", "policy": "allow"}]})", "f");
  ASSERT_TRUE(qemu_order.has_value());
  EXPECT_TRUE(qemu_order->AllowsAny({"CN=alice,O=thindisk test", "O=thindisk test,CN=alice"}));
  EXPECT_FALSE(qemu_order->AllowsAny({"CN=bob,O=thindisk test", "O=thindisk test,CN=bob"}));
  // A deny rule that matches either spelling denies.
  auto deny = TlsAuthz::ParseList(R"({"policy": "allow", "rules": [
      {"match": "CN=bob,*", "policy": "deny", "format": "glob"}]})",
                                  "f");
  ASSERT_TRUE(deny.has_value());
  EXPECT_FALSE(deny->AllowsAny({"CN=bob,O=x", "O=x,CN=bob"}));
  EXPECT_TRUE(deny->AllowsAny({"CN=alice,O=x", "O=x,CN=alice"}));
}

TEST(TlsAuthzTest, BadListsAreErrorsNamingTheFile) {
  for (const char* bad : {"", "[]", "{\"rules\": {}}", "{\"policy\": \"maybe\"}",
                          "{\"rules\": [{\"match\": \"x\"}]}",
                          "{\"rules\": [{\"match\": 1, \"policy\": \"allow\"}]}",
                          "{\"rules\": [{\"match\": \"x\", \"policy\": \"allow\", "
                          "\"format\": \"regex\"}]}",
                          "{\"rulez\": []}"}) {
    auto a = TlsAuthz::ParseList(bad, "authz.json");
    ASSERT_FALSE(a.has_value()) << bad;
    EXPECT_EQ(a.status().code(), Code::kInvalidArgument);
    EXPECT_NE(a.status().message().find("authz.json"), std::string::npos) << bad;
  }
  auto missing = TlsAuthz::LoadListFile("/nonexistent/authz.json");
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.status().message().find("/nonexistent/authz.json"), std::string::npos);
}

}  // namespace
}  // namespace thindisk::nbd
