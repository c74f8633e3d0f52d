#include "inference_svc/engine/stop_matcher.h"

#include <algorithm>

#include "common/tokenizer/tokenizer.h"

namespace dsflash::engine {

StopMatcher::Out StopMatcher::push(const std::string& piece, bool check) {
  text_ += piece;
  Out out;
  if (check) {
    size_t best = std::string::npos;
    const std::string* hit = nullptr;
    for (const std::string& s : stops_) {
      const size_t at = text_.find(s, emitted_);
      if (at != std::string::npos && (at < best || (at == best && s.size() > hit->size()))) {
        best = at;
        hit = &s;
      }
    }
    if (hit != nullptr) {
      const size_t end = best + (include_ ? hit->size() : 0);
      out.text = text_.substr(emitted_, end - emitted_);
      emitted_ = text_.size();
      out.match = *hit;
      return out;
    }
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - 1, text_.size() - emitted_); k > hold; --k) {
      if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  size_t end = text_.size() - hold;
  // Never cut a UTF-8 character in two.
  end = emitted_ + tok::complete_utf8_prefix(std::string_view(text_).substr(emitted_, end - emitted_));
  out.text = text_.substr(emitted_, end - emitted_);
  emitted_ = end;
  return out;
}

std::string StopMatcher::flush() {
  std::string rest = text_.substr(emitted_);
  emitted_ = text_.size();
  return rest;
}

}  // namespace dsflash::engine
