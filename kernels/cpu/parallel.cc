// The CPU backend's thread pool (see parallel.h).
#include "kernels/cpu/parallel.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace dsflash::kernels::cpu {
namespace {

class Pool {
 public:
  Pool() {
    int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (const char* env = std::getenv("DSF_THREADS")) n = std::max(1, std::atoi(env));
    n_ = n;
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return n_; }

  void run(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
    const int64_t parts = std::min<int64_t>(n_, std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk)));
    if (parts <= 1) {
      fn(0, n);
      return;
    }
    std::lock_guard<std::mutex> serial(run_mu_);
    {
      std::lock_guard<std::mutex> l(mu_);
      fn_ = &fn;
      n_items_ = n;
      parts_ = parts;
      pending_ = static_cast<int>(parts - 1);
      ++generation_;
    }
    cv_.notify_all();
    chunk(0);
    std::unique_lock<std::mutex> l(mu_);
    done_cv_.wait(l, [this] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  void chunk(int64_t part) {
    const int64_t b = n_items_ * part / parts_, e = n_items_ * (part + 1) / parts_;
    if (b < e) (*fn_)(b, e);
  }
  void loop(int id) {
    uint64_t seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (id >= parts_) continue;
      l.unlock();
      chunk(id);
      l.lock();
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  int n_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_items_ = 0, parts_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
  if (n <= 0) return;
  pool().run(n, fn, min_chunk);
}

int n_threads() { return pool().size(); }

}  // namespace dsflash::kernels::cpu
