#include "io/rados_name.h"

#include <gtest/gtest.h>

namespace thindisk::io {
namespace {

TEST(RadosName, PoolAndImage) {
  auto n = ParseRadosName("rados://rbd/vm-disk_1.qcow2");
  ASSERT_TRUE(n) << n.status().ToString();
  EXPECT_EQ(n->pool, "rbd");
  EXPECT_EQ(n->image, "vm-disk_1.qcow2");
  EXPECT_EQ(n->conf, "");
  EXPECT_EQ(n->id, "");
  EXPECT_EQ(n->ToString(), "rados://rbd/vm-disk_1.qcow2");
  EXPECT_EQ(n->PoolUri(), "rados://rbd");
}

TEST(RadosName, ConfAndId) {
  auto n = ParseRadosName("rados://p/i?conf=/etc/ceph/other.conf&id=thindisk");
  ASSERT_TRUE(n) << n.status().ToString();
  EXPECT_EQ(n->pool, "p");
  EXPECT_EQ(n->image, "i");
  EXPECT_EQ(n->conf, "/etc/ceph/other.conf");
  EXPECT_EQ(n->id, "thindisk");
  // The name in messages leaves out where to connect.
  EXPECT_EQ(n->ToString(), "rados://p/i");
  auto swapped = ParseRadosName("rados://p/i?id=x&conf=c.conf");
  ASSERT_TRUE(swapped);
  EXPECT_EQ(swapped->id, "x");
  EXPECT_EQ(swapped->conf, "c.conf");
}

TEST(RadosName, IsRadosName) {
  EXPECT_TRUE(IsRadosName("rados://p/i"));
  EXPECT_TRUE(IsRadosName("rados://"));
  EXPECT_FALSE(IsRadosName("disk.qcow2"));
  EXPECT_FALSE(IsRadosName("rbd:pool/img"));
  EXPECT_FALSE(IsRadosName("RADOS://p/i"));
}

// Every malformed name: one clear error that quotes the name and says why.
TEST(RadosName, BadNames) {
  struct Case {
    const char* name;
    const char* why;
  } cases[] = {
      {"disk.qcow2", "not a rados:// name"},
      {"rados:/p/i", "not a rados:// name"},
      {"rados://", "no pool name"},
      {"rados:///img", "no pool name"},
      {"rados://pool", "no image name"},
      {"rados://pool/", "no image name"},
      {"rados://pool/a/b", "contains '/'"},
      {"rados://pool/a b", "contains ' '"},
      {"rados://pool/a\tb", "contains \\x09"},
      {"rados://pool/.hidden", "starts with '.'"},
      {"rados://pool/..", "starts with '.'"},
      {"rados://po ol/i", "pool name contains"},
      {"rados://pool/i#frag", "'#' is not allowed"},
      {"rados://pool/i?", "empty query"},
      {"rados://pool/i?conf", "not key=value"},
      {"rados://pool/i?conf=", "empty value for 'conf'"},
      {"rados://pool/i?conf=a&conf=b", "'conf' given twice"},
      {"rados://pool/i?id=a&id=b", "'id' given twice"},
      {"rados://pool/i?id=client.admin", "without 'client.'"},
      {"rados://pool/i?user=admin", "unknown key 'user' (known: conf, id)"},
      {"rados://pool/i?conf=x&", "not key=value"},
  };
  for (const Case& c : cases) {
    auto n = ParseRadosName(c.name);
    ASSERT_FALSE(n) << c.name << " parsed";
    EXPECT_EQ(n.status().code(), Code::kInvalidArgument) << c.name;
    EXPECT_NE(n.status().message().find(c.name), std::string::npos)
        << c.name << ": " << n.status().message();
    EXPECT_NE(n.status().message().find(c.why), std::string::npos)
        << c.name << ": " << n.status().message();
  }
}

TEST(RadosName, Limits) {
  const std::string longest(RadosName::kMaxImageLength, 'a');
  EXPECT_TRUE(ParseRadosName("rados://p/" + longest));
  auto too_long = ParseRadosName("rados://p/" + longest + "a");
  ASSERT_FALSE(too_long);
  EXPECT_NE(too_long.status().message().find("longer than 200"), std::string::npos);
  const std::string pool(RadosName::kMaxPoolLength + 1, 'p');
  auto long_pool = ParseRadosName("rados://" + pool + "/i");
  ASSERT_FALSE(long_pool);
  EXPECT_NE(long_pool.status().message().find("pool name longer"), std::string::npos);
}

TEST(RadosName, UriRoundTrips) {
  for (const char* text : {"rados://p/i", "rados://p/i?conf=/etc/c.conf",
                           "rados://p/i?id=backup", "rados://p/i?conf=/c&id=backup"}) {
    auto n = ParseRadosName(text);
    ASSERT_TRUE(n) << text << ": " << n.status().message();
    EXPECT_EQ(n->Uri(), text);
    auto again = ParseRadosName(n->Uri());
    ASSERT_TRUE(again);
    EXPECT_EQ(again->conf, n->conf);
    EXPECT_EQ(again->id, n->id);
  }
  // The query's order does not matter; Uri() puts conf first.
  auto swapped = ParseRadosName("rados://p/i?id=x&conf=/c");
  ASSERT_TRUE(swapped);
  EXPECT_EQ(swapped->Uri(), "rados://p/i?conf=/c&id=x");
}

TEST(RadosName, Pools) {
  for (const char* text : {"rados://pool", "rados://pool/", "rados://pool?conf=/c"}) {
    auto n = ParseRadosPool(text);
    ASSERT_TRUE(n) << text << ": " << n.status().message();
    EXPECT_EQ(n->pool, "pool");
    EXPECT_TRUE(n->image.empty());
  }
  EXPECT_EQ(ParseRadosPool("rados://pool?conf=/c")->conf, "/c");
  struct Case {
    const char* name;
    const char* why;
  };
  for (const Case& c : {Case{"rados://pool/img", "names an image, not a pool"},
                        Case{"rados://", "no pool name"}, Case{"rados:///", "no pool name"},
                        Case{"rados://pool?x=1", "unknown key 'x'"},
                        Case{"nbd://pool", "not a rados:// name"}}) {
    auto n = ParseRadosPool(c.name);
    ASSERT_FALSE(n) << c.name;
    EXPECT_NE(n.status().message().find(c.why), std::string::npos)
        << c.name << ": " << n.status().message();
  }
}

}  // namespace
}  // namespace thindisk::io
