// memfd regions and SCM_RIGHTS fd passing (Linux).
#include "common/ipc/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dsflash::ipc {
namespace {

Status sys_error(const char* what) { return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno))); }

}  // namespace

StatusOr<SharedRegion> SharedRegion::create(const std::string& name, size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("shared region of 0 bytes");
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return sys_error("memfd_create");
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const Status s = absl::ResourceExhaustedError(absl::StrCat("ftruncate of a ", bytes, "-byte memfd: ", std::strerror(errno)));
    ::close(fd);
    return s;
  }
  // Reserve the memory now: a budget the machine cannot back fails here, with a message,
  // rather than as SIGBUS on a later write; and slots are never first-touch faulted on the
  // load path.
  if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    const Status s = absl::ResourceExhaustedError(
        absl::StrCat("cannot reserve ", bytes, " bytes of shared memory for '", name, "': ", std::strerror(err)));
    ::close(fd);
    return s;
  }
  (void)::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  return map(fd, true);
}

StatusOr<SharedRegion> SharedRegion::map(int fd, bool writable) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const Status s = sys_error("fstat of a shared region");
    ::close(fd);
    return s;
  }
  SharedRegion r;
  r.fd_ = fd;
  r.size_ = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, r.size_, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return sys_error("mmap of a shared region");
  r.data_ = static_cast<uint8_t*>(p);
  return r;
}

SharedRegion::SharedRegion(SharedRegion&& o) noexcept { *this = std::move(o); }

SharedRegion& SharedRegion::operator=(SharedRegion&& o) noexcept {
  if (this != &o) {
    this->~SharedRegion();
    fd_ = o.fd_;
    data_ = o.data_;
    size_ = o.size_;
    o.fd_ = -1;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

SharedRegion::~SharedRegion() {
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  fd_ = -1;
}

StatusOr<int> reopen_read_only(int fd) {
  const std::string path = absl::StrCat("/proc/self/fd/", fd);
  const int ro = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (ro < 0) return sys_error("open(/proc/self/fd, O_RDONLY)");
  return ro;
}

namespace {

// A socket and the address of `path` (callers close the socket on failure).
StatusOr<std::pair<int, sockaddr_un>> unix_socket(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", path));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return sys_error("socket(AF_UNIX)");
  return std::make_pair(fd, addr);
}

}  // namespace

StatusOr<int> listen_unix(const std::string& path) {
  ASSIGN_OR_RETURN(auto s, unix_socket(path));
  ::unlink(path.c_str());
  if (::bind(s.first, reinterpret_cast<sockaddr*>(&s.second), sizeof(s.second)) != 0 || ::listen(s.first, 16) != 0) {
    const Status st = absl::UnavailableError(absl::StrCat("bind/listen on ", path, ": ", std::strerror(errno)));
    ::close(s.first);
    return st;
  }
  return s.first;
}

StatusOr<int> connect_unix(const std::string& path) {
  ASSIGN_OR_RETURN(auto s, unix_socket(path));
  if (::connect(s.first, reinterpret_cast<sockaddr*>(&s.second), sizeof(s.second)) != 0) {
    const Status st = absl::UnavailableError(absl::StrCat("connect to ", path, ": ", std::strerror(errno)));
    ::close(s.first);
    return st;
  }
  return s.first;
}

Status send_fds(int sock, const std::vector<int>& fds, const std::string& payload) {
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  std::string body = payload.empty() ? std::string(1, '\0') : payload;
  iovec iov{body.data(), body.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  if (::sendmsg(sock, &msg, MSG_NOSIGNAL) < 0) return sys_error("sendmsg(SCM_RIGHTS)");
  return absl::OkStatus();
}

Status recv_fds(int sock, size_t max_fds, std::vector<int>* fds, std::string* payload) {
  std::vector<char> control(CMSG_SPACE(sizeof(int) * max_fds));
  std::vector<char> body(4096);
  iovec iov{body.data(), body.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  const ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  if (n < 0) return sys_error("recvmsg(SCM_RIGHTS)");
  if (n == 0) return absl::UnavailableError("the peer closed the fd socket");
  if (msg.msg_flags & MSG_CTRUNC) return absl::InternalError("recvmsg: more fds than expected");
  fds->clear();
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const int* p = reinterpret_cast<const int*>(CMSG_DATA(c));
      fds->insert(fds->end(), p, p + k);
    }
  }
  payload->assign(body.data(), static_cast<size_t>(n));
  return absl::OkStatus();
}

}  // namespace dsflash::ipc
