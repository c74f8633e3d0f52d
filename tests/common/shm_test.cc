// memfd regions and SCM_RIGHTS fd passing between two real processes: a child receives the
// region's fd over a Unix socket, maps it and writes; the parent sees the bytes.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "common/ipc/shm.h"
#include "gtest/gtest.h"

namespace dsflash::ipc {
namespace {

TEST(Shm, RegionCrossesProcessesBySCMRights) {
  auto region = SharedRegion::create("dsf-test", 1 << 20);
  ASSERT_TRUE(region.ok()) << region.status();
  std::memset(region->data(), 0, region->size());
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(sv[0]);
    std::vector<int> fds;
    std::string payload;
    if (!recv_fds(sv[1], 4, &fds, &payload).ok() || fds.size() != 1 || payload != "arena") _exit(1);
    auto mapped = SharedRegion::map(fds[0], /*writable=*/true);
    if (!mapped.ok() || mapped->size() != (1u << 20)) _exit(2);
    std::memcpy(mapped->data() + 4096, "hello from the child", 21);
    _exit(0);
  }
  ::close(sv[1]);
  ASSERT_TRUE(send_fds(sv[0], {region->fd()}, "arena").ok());
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_STREQ(reinterpret_cast<const char*>(region->data() + 4096), "hello from the child");
  ::close(sv[0]);
}

TEST(Shm, ErrorsAreReported) {
  EXPECT_FALSE(SharedRegion::create("dsf-test", 0).ok());
  EXPECT_FALSE(SharedRegion::map(-1, false).ok());
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  ::close(sv[1]);
  std::vector<int> fds;
  std::string payload;
  EXPECT_EQ(recv_fds(sv[0], 1, &fds, &payload).code(), absl::StatusCode::kUnavailable);  // peer gone
  ::close(sv[0]);
}

}  // namespace
}  // namespace dsflash::ipc
