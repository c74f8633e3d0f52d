// Host memory and byte sizes (see host.h).
#include "common/host/host.h"

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dsflash::host {

StatusOr<MemInfo> parse_meminfo(absl::string_view text) {
  MemInfo m;
  bool total = false, available = false;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const bool is_total = absl::ConsumePrefix(&line, "MemTotal:");
    const bool is_available = !is_total && absl::ConsumePrefix(&line, "MemAvailable:");
    if (!is_total && !is_available) continue;
    line = absl::StripAsciiWhitespace(line);
    uint64_t kb = 0;
    if (!absl::ConsumeSuffix(&line, "kB") || !absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kb) ||
        kb > (uint64_t{1} << 53)) {
      return absl::DataLossError(absl::StrCat("meminfo: malformed ", is_total ? "MemTotal" : "MemAvailable", " line"));
    }
    (is_total ? m.total : m.available) = kb * 1024;
    (is_total ? total : available) = true;
  }
  if (!total || !available) {
    return absl::DataLossError(absl::StrCat("meminfo: no ", total ? "MemAvailable" : "MemTotal", " line"));
  }
  return m;
}

StatusOr<MemInfo> read_meminfo(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  auto m = parse_meminfo(ss.str());
  if (!m.ok()) return absl::Status(m.status().code(), absl::StrCat(path, ": ", m.status().message()));
  return m;
}

bool parse_size(const std::string& v, uint64_t* out) {
  if (v.empty()) return false;
  uint64_t mul = 1;
  std::string n = v;
  switch (v.back()) {
    case 'K': case 'k': mul = uint64_t{1} << 10; break;
    case 'M': case 'm': mul = uint64_t{1} << 20; break;
    case 'G': case 'g': mul = uint64_t{1} << 30; break;
    case 'T': case 't': mul = uint64_t{1} << 40; break;
    default: break;
  }
  if (mul != 1) n.pop_back();
  double x = 0;
  if (!absl::SimpleAtod(n, &x) || !(x > 0) || x * static_cast<double>(mul) >= 1.8e19) return false;
  *out = static_cast<uint64_t>(x * static_cast<double>(mul));
  return true;
}

}  // namespace dsflash::host
