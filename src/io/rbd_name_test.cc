#include "io/rbd_name.h"

#include <gtest/gtest.h>

namespace thindisk::io {
namespace {

TEST(RbdName, PoolImageSnapAndOptions) {
  auto n = ParseRbdName("rbd:rbd/golden");
  ASSERT_TRUE(n) << n.status().message();
  EXPECT_EQ(n->pool, "rbd");
  EXPECT_EQ(n->image, "golden");
  EXPECT_TRUE(n->ns.empty() && n->snap.empty() && n->conf.empty() && n->id.empty());
  EXPECT_EQ(n->ToString(), "rbd:rbd/golden");

  auto full =
      ParseRbdName("rbd:vms/tenant1/disk@daily:conf=/etc/ceph/a\\:b.conf:id=backup");
  ASSERT_TRUE(full) << full.status().message();
  EXPECT_EQ(full->pool, "vms");
  EXPECT_EQ(full->ns, "tenant1");
  EXPECT_EQ(full->image, "disk");
  EXPECT_EQ(full->snap, "daily");
  EXPECT_EQ(full->conf, "/etc/ceph/a:b.conf");
  EXPECT_EQ(full->id, "backup");
  EXPECT_EQ(full->ToString(), "rbd:vms/tenant1/disk@daily");
  EXPECT_TRUE(IsRbdName("rbd:x"));
  EXPECT_FALSE(IsRbdName("rados://p/i"));
}

TEST(RbdName, BadNames) {
  struct Case {
    const char* name;
    const char* why;
  };
  for (const Case& c :
       {Case{"rbd:", "want rbd:POOL/IMAGE"}, Case{"rbd:pool", "want rbd:POOL/IMAGE"},
        Case{"rbd:a/b/c/d", "want rbd:POOL/IMAGE"}, Case{"rbd:/img", "empty pool name"},
        Case{"rbd:p/", "empty image name"}, Case{"rbd:p/i@", "empty snapshot name"},
        Case{"rbd:p/i:conf", "is not key=value"},
        Case{"rbd:p/i:conf=", "is not key=value"},
        Case{"rbd:p/i:user=x", "unknown option 'user'"},
        Case{"rbd:p/i:id=a:id=b", "'id' given twice"},
        Case{"rbd:p/i:id=client.admin", "without 'client.'"},
        Case{"rbd:p/i j", "image name contains a space"}}) {
    auto n = ParseRbdName(c.name);
    ASSERT_FALSE(n) << c.name;
    EXPECT_EQ(n.status().code(), Code::kInvalidArgument);
    EXPECT_NE(n.status().message().find(c.why), std::string::npos)
        << c.name << ": " << n.status().message();
    EXPECT_EQ(n.status().message().rfind(c.name, 0), 0u) << n.status().message();
  }
}

}  // namespace
}  // namespace thindisk::io
