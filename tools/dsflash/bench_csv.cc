#include "tools/dsflash/bench_csv.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/parallel.h"

namespace dsflash::tools {

std::string shell_line(const char* cmd) {
  std::string out;
  if (FILE* p = ::popen(cmd, "r")) {
    char buf[256];
    if (std::fgets(buf, sizeof(buf), p)) out = buf;
    ::pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::string machine_name() {
  if (const char* m = std::getenv("DSF_MACHINE"); m != nullptr && *m != '\0') return m;
  char host[128] = "unknown";
  ::gethostname(host, sizeof(host));
  return absl::StrCat(host, " (", kernels::cpu::n_threads(), " threads, ", shell_line("uname -m"), ")");
}

std::string csv_field(const std::string& text, bool always_quote) {
  if (!always_quote && text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"') out += '"';  // a quote inside a quoted field is doubled
    out += c;
  }
  return out + '"';
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

Status append_bench_rows(const std::string& csv, const std::string& benchmark, const std::string& configuration,
                         const std::vector<BenchRow>& rows, const std::string& machine) {
  const std::string date = shell_line("date -u +%Y-%m-%dT%H:%M:%SZ");
  const char* env_commit = std::getenv("DSF_COMMIT");  // a bundle run outside the checkout
  const std::string commit =
      env_commit != nullptr && *env_commit != '\0' ? env_commit : shell_line("git rev-parse --short HEAD 2>/dev/null");
  const bool fresh = !std::ifstream(csv).good();
  std::ofstream out(csv, std::ios::app);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot append to '", csv, "'"));
  if (fresh) out << "date,commit,machine,benchmark,configuration,metric,value,unit\n";
  for (const BenchRow& r : rows) {
    out << date << ',' << commit << ',' << csv_field(machine, true) << ',' << csv_field(benchmark) << ','
        << csv_field(configuration, true) << ',' << csv_field(r.metric) << ',' << r.value << ',' << csv_field(r.unit)
        << '\n';
    std::printf("%-36s %14.4f %s\n", r.metric.c_str(), r.value, r.unit.c_str());
  }
  std::printf("appended %zu rows to %s (%s)\n", rows.size(), csv.c_str(), machine.c_str());
  return absl::OkStatus();
}

}  // namespace dsflash::tools
