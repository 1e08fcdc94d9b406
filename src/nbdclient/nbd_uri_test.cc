#include "nbdclient/nbd_uri.h"

#include <gtest/gtest.h>

namespace thindisk::nbdclient {
namespace {

TEST(NbdUriTest, RecognizesTheFourNbdSchemes) {
  EXPECT_TRUE(IsNbdUri("nbd://localhost:10809/disk"));
  EXPECT_TRUE(IsNbdUri("nbd+unix:///?socket=/tmp/s"));
  EXPECT_TRUE(IsNbdUri("nbds://host/x"));
  EXPECT_TRUE(IsNbdUri("nbds+unix:///x?socket=/s"));
}

TEST(NbdUriTest, FileNamesAndOtherSchemesAreNotNbd) {
  EXPECT_FALSE(IsNbdUri("disk.qcow2"));
  EXPECT_FALSE(IsNbdUri("/var/lib/nbd://x"));  // a path with "://" inside
  EXPECT_FALSE(IsNbdUri("nbdx://host/x"));
  EXPECT_FALSE(IsNbdUri("nbd:/host"));
  EXPECT_FALSE(IsNbdUri("nbd"));
  EXPECT_FALSE(IsNbdUri(""));
  EXPECT_FALSE(IsNbdUri("rbd:pool/image"));
}

TEST(NbdUriTest, SchemeOfUriShapedNames) {
  EXPECT_EQ(UriScheme("nbdx://host/x"), "nbdx");
  EXPECT_EQ(UriScheme("nbd+unix:///?socket=s"), "nbd+unix");
  EXPECT_EQ(UriScheme("dir/file"), "");
  EXPECT_EQ(UriScheme("./a://b"), "");
  EXPECT_EQ(UriScheme("://x"), "");
  EXPECT_NE(UnknownProtocolMessage("nbdx://h/x").find("unknown protocol 'nbdx'"),
            std::string::npos);
}

}  // namespace
}  // namespace thindisk::nbdclient
