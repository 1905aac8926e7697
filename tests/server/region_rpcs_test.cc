// Who may use shared-memory regions: gRPC's peer strings of local and
// remote callers.

#include "server/service/region_rpcs.h"

#include "gtest/gtest.h"

namespace klserve::server {
namespace {

TEST(IsLocalPeer, UnixSocketsAndLoopbackAreLocal) {
  for (const char* peer :
       {"unix:/run/klserve/klserve.sock", "unix:", "unix-abstract:klserve",
        "ipv4:127.0.0.1:50123", "ipv4:127.8.9.10:1", "ipv6:[::1]:50123",
        "ipv6:%5B::1%5D:50123", "ipv6:[::ffff:127.0.0.1]:9"}) {
    EXPECT_TRUE(IsLocalPeer(peer)) << peer;
  }
}

TEST(IsLocalPeer, OtherAddressesAreNot) {
  for (const char* peer :
       {"ipv4:10.0.0.7:50123", "ipv4:128.0.0.1:1", "ipv4:1.127.0.0:1",
        "ipv6:[::2]:50123", "ipv6:[::10]:1", "ipv6:%5B::ffff:10.0.0.1%5D:2",
        "ipv6:[fe80::1]:5", "", "127.0.0.1:5", "unknown"}) {
    EXPECT_FALSE(IsLocalPeer(peer)) << peer;
  }
}

}  // namespace
}  // namespace klserve::server
