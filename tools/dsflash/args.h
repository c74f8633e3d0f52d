// A small flag parser for the CLI: `--name value`, `--name=value`, `--flag`, positionals.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"

namespace dsflash::tools {

class Args {
 public:
  // `flags`: names that take no value; every other `--name` takes one.
  static StatusOr<Args> parse(const std::vector<std::string>& argv, const std::set<std::string>& flags,
                              const std::set<std::string>& options);
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::optional<std::string> get(const std::string& name) const;
  std::string get_or(const std::string& name, const std::string& fallback) const;
  StatusOr<int64_t> get_int(const std::string& name, int64_t fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

// Exit code of a command that ran: 0 when ok, else prints "error: ..." and returns 1.
int exit_code(const Status& s);

}  // namespace dsflash::tools
