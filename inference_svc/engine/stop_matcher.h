// Stop-string matching over streamed text: text that could still be the start of a stop
// string is held back, so a stop spanning token boundaries is found and never streamed
// (unless the request asks for it). One per request; not thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace dsflash::engine {

class StopMatcher {
 public:
  StopMatcher(std::vector<std::string> stops, bool include_stop) : stops_(std::move(stops)), include_(include_stop) {}
  struct Out {
    std::string text;                  // safe to stream now
    std::optional<std::string> match;  // the stop string that ended the generation
  };
  // Appends generated text; with `check` false (before min_new_tokens) stops are not matched.
  Out push(const std::string& piece, bool check = true);
  // End of generation: everything held back.
  std::string flush();

 private:
  std::vector<std::string> stops_;
  bool include_;
  std::string text_;
  size_t emitted_ = 0;
};

}  // namespace dsflash::engine
