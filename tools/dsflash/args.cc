// Flag parsing for the dsflash CLI.
#include "tools/dsflash/args.h"

#include <cstdio>

#include "absl/strings/numbers.h"

namespace dsflash::tools {

StatusOr<Args> Args::parse(const std::vector<std::string>& argv, const std::set<std::string>& flags,
                           const std::set<std::string>& options) {
  Args a;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& s = argv[i];
    if (s.rfind("--", 0) != 0 || s == "--") {
      a.positional_.push_back(s);
      continue;
    }
    const size_t eq = s.find('=', 2);
    const std::string name = s.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    std::string value = eq == std::string::npos ? std::string() : s.substr(eq + 1);
    if (flags.count(name)) {
      a.values_[name] = "1";
      continue;
    }
    if (!options.count(name)) return absl::InvalidArgumentError(absl::StrCat("unknown option --", name));
    if (eq == std::string::npos) {
      if (i + 1 >= argv.size()) return absl::InvalidArgumentError(absl::StrCat("option --", name, " needs a value"));
      value = argv[++i];
    }
    a.values_[name] = value;
  }
  return a;
}

std::optional<std::string> Args::get(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::get_or(const std::string& name, const std::string& fallback) const {
  return get(name).value_or(fallback);
}

StatusOr<int64_t> Args::get_int(const std::string& name, int64_t fallback) const {
  const auto v = get(name);
  if (!v) return fallback;
  int64_t out;
  if (!absl::SimpleAtoi(*v, &out)) return absl::InvalidArgumentError(absl::StrCat("--", name, " = '", *v, "' is not an integer"));
  return out;
}

int exit_code(const Status& s) {
  if (s.ok()) return 0;
  std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace dsflash::tools
