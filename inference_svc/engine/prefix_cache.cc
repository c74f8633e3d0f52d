// Prefix reuse of kept sequences (see prefix_cache.h).
#include "inference_svc/engine/prefix_cache.h"

#include <algorithm>

namespace dsflash::engine {

std::optional<PrefixCache::Entry> PrefixCache::take(const std::vector<int32_t>& prompt, size_t running) {
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const std::vector<int32_t>& t = it->tokens;
    if (t.empty() || t.size() >= prompt.size() || !std::equal(t.begin(), t.end(), prompt.begin())) continue;
    if (best == entries_.end() || t.size() > best->tokens.size()) best = it;
  }
  if (best != entries_.end()) {
    Entry e = std::move(*best);
    entries_.erase(best);
    return e;
  }
  reserve(running + 1);
  return std::nullopt;
}

void PrefixCache::reserve(size_t live) {
  while (!entries_.empty() && entries_.size() + live > capacity_) drop_oldest();
}

void PrefixCache::put(Entry e) {
  if (capacity_ == 0 || e.seq == nullptr || e.seq->n_past != static_cast<int64_t>(e.tokens.size())) return;
  entries_.push_back(std::move(e));
  while (entries_.size() > capacity_) drop_oldest();
}

bool PrefixCache::drop_oldest() {
  if (entries_.empty()) return false;
  entries_.pop_front();
  return true;
}

size_t PrefixCache::tokens() const {
  size_t n = 0;
  for (const Entry& e : entries_) n += e.tokens.size();
  return n;
}

}  // namespace dsflash::engine
