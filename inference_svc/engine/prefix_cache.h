// Sequences kept after their requests, so that a prompt which continues one of them (a chat's
// next turn re-sends the conversation so far: the earlier prompt, the reply, the new message)
// is prefilled only from where the kept state ends. A kept sequence's state covers exactly its
// token list (Sequence::n_past == tokens.size()); it serves a prompt of which that list is a
// proper prefix, so at least one token is left to run for the next logits. At most `capacity`
// sequences live at once, kept or running (their caches hold memory). Not thread-safe: the
// engine's scheduler thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "inference_svc/model/model.h"

namespace dsflash::engine {

class PrefixCache {
 public:
  struct Entry {
    std::unique_ptr<model::Sequence> seq;
    std::vector<int32_t> tokens;  // what seq's state covers, in order
  };

  explicit PrefixCache(size_t capacity) : capacity_(capacity) {}

  // Takes out the entry whose tokens are the longest proper prefix of `prompt`; nullopt if
  // none. After a miss, drops the least recently kept entries until a new sequence fits in
  // the capacity beside them and the `running` sequences (which are not kept here).
  std::optional<Entry> take(const std::vector<int32_t>& prompt, size_t running = 0);
  // Keeps `e` as the most recent (nothing with capacity 0). Its sequence must cover its tokens.
  void put(Entry e);
  // Drops the least recently kept entries until `live` more sequences fit in the capacity.
  void reserve(size_t live);
  // Drops the least recently kept entry (to free memory for a new sequence); false if none.
  bool drop_oldest();
  // Drops every kept entry.
  void clear() { entries_.clear(); }

  size_t capacity() const { return capacity_; }
  size_t size() const { return entries_.size(); }
  // Tokens held by the kept sequences.
  size_t tokens() const;

 private:
  size_t capacity_;
  std::deque<Entry> entries_;  // least recently kept first
};

}  // namespace dsflash::engine
