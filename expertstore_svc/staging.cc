// Staging ring and slice reader (see staging.h).
#include "expertstore_svc/staging.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace dsflash::expertstore {

StatusOr<std::unique_ptr<StagingRing>> StagingRing::create(size_t n, size_t bytes, Arena* pin_for) {
  std::unique_ptr<StagingRing> r(new StagingRing());
  r->bytes_ = (bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  r->pin_for_ = pin_for;
  for (size_t i = 0; i < n; ++i) {
    void* p = nullptr;
    if (posix_memalign(&p, kDirectAlign, r->bytes_) != 0) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a ", r->bytes_, "-byte staging buffer"));
    }
    r->buffers_.push_back(static_cast<uint8_t*>(p));
    std::memset(p, 0, r->bytes_);
    if (pin_for != nullptr) {
      if (const Status st = pin_for->pin(p, r->bytes_); !st.ok()) {
        return absl::ResourceExhaustedError(absl::StrCat("cannot page-lock the staging ring (", n, " x ", r->bytes_ / 1024,
                                                         " KiB): ", st.message(),
                                                         ". Raise the memlock limit (ulimit -l, or the container's) "
                                                         "or pass --pin-staging=false"));
      }
      r->pinned_count_ = i + 1;
    }
  }
  r->free_ = r->buffers_;
  return r;
}

StagingRing::~StagingRing() {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (i < pinned_count_) pin_for_->unpin(buffers_[i], bytes_);
    std::free(buffers_[i]);
  }
}

uint8_t* StagingRing::take() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return !free_.empty(); });
  uint8_t* p = free_.back();
  free_.pop_back();
  return p;
}

void StagingRing::give(uint8_t* buffer) {
  {
    std::lock_guard<std::mutex> l(mu_);
    free_.push_back(buffer);
  }
  cv_.notify_one();
}

size_t StagingRing::in_use() const {
  std::lock_guard<std::mutex> l(mu_);
  return buffers_.size() - free_.size();
}

StatusOr<std::unique_ptr<SliceReader>> SliceReader::open(const gguf::Model& model, bool direct) {
  std::unique_ptr<SliceReader> r(new SliceReader());
  r->model_ = &model;
  r->direct_ = direct;
  for (size_t i = 0; i < model.n_shards(); ++i) {
    int fd = -1;
    if (direct) {
      fd = ::open(model.shard(i).path().c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
      if (fd < 0) {
        log::warn("expert store: O_DIRECT unavailable for %s (%s); using buffered reads", model.shard(i).path().c_str(),
                  std::strerror(errno));
        r->direct_ = false;
      }
    }
    r->direct_fds_.push_back(fd);
  }
  return r;
}

SliceReader::~SliceReader() {
  for (int fd : direct_fds_) {
    if (fd >= 0) ::close(fd);
  }
}

Status SliceReader::read(uint32_t shard, uint64_t offset, uint64_t bytes, uint8_t* buffer, size_t buffer_bytes,
                         const uint8_t** data) const {
  const gguf::File& f = model_->shard(shard);
  if (offset + bytes > f.file_size()) {
    return absl::DataLossError(absl::StrCat(f.path(), ": expert slice [", offset, ", +", bytes, ") lies past the end of the ",
                                            f.file_size(), "-byte file (truncated shard?)"));
  }
  const int dfd = direct_fds_[shard];
  if (dfd >= 0) {
    const uint64_t start = offset / kDirectAlign * kDirectAlign;
    const uint64_t end = std::min<uint64_t>((offset + bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign,
                                            (f.file_size() + kDirectAlign - 1) / kDirectAlign * kDirectAlign);
    if (end - start > buffer_bytes) return absl::InternalError("staging buffer smaller than an aligned slice");
    uint64_t done = 0;
    while (start + done < offset + bytes) {
      const ssize_t n = ::pread(dfd, buffer + done, end - start - done, static_cast<off_t>(start + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return absl::DataLossError(absl::StrCat(f.path(), ": O_DIRECT read at ", start + done, ": ", std::strerror(errno)));
      if (n == 0) return absl::DataLossError(absl::StrCat(f.path(), ": unexpected end of file at ", start + done));
      done += static_cast<uint64_t>(n);
    }
    *data = buffer + (offset - start);
    return absl::OkStatus();
  }
  if (bytes > buffer_bytes) return absl::InternalError("staging buffer smaller than a slice");
  RETURN_IF_ERROR(f.pread(offset, buffer, bytes));
  (void)::posix_fadvise(f.fd(), static_cast<off_t>(offset), static_cast<off_t>(bytes), POSIX_FADV_DONTNEED);
  *data = buffer;
  return absl::OkStatus();
}

}  // namespace dsflash::expertstore
