// Shared memory and file-descriptor passing between the dsflash processes: anonymous
// memfd regions (the CPU expert arena and the slot table) and SCM_RIGHTS transfer of their
// fds over a Unix socket. Errors name the system call and errno.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace dsflash::ipc {

// A mapped memfd region; owns the fd and the mapping.
class SharedRegion {
 public:
  // Creates a sealed-size memfd of `bytes` (zeroed) and maps it read-write.
  static StatusOr<SharedRegion> create(const std::string& name, size_t bytes);
  // Maps an fd received from another process (read-only or read-write); takes ownership.
  static StatusOr<SharedRegion> map(int fd, bool writable);
  SharedRegion() = default;
  SharedRegion(SharedRegion&& o) noexcept;
  SharedRegion& operator=(SharedRegion&& o) noexcept;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// A new read-only descriptor of the same memfd (via /proc/self/fd): a peer given it cannot
// map the region writable. The caller owns the returned fd.
StatusOr<int> reopen_read_only(int fd);

// A listening Unix stream socket at `path` (an existing socket file there is replaced).
StatusOr<int> listen_unix(const std::string& path);
// A connected Unix stream socket to `path`.
StatusOr<int> connect_unix(const std::string& path);

// Sends `fds` (and a small payload) over a connected Unix socket.
Status send_fds(int sock, const std::vector<int>& fds, const std::string& payload);
// Receives up to `max_fds` fds and the payload; the caller owns the returned fds.
Status recv_fds(int sock, size_t max_fds, std::vector<int>* fds, std::string* payload);

}  // namespace dsflash::ipc
