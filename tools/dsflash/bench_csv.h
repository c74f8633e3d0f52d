// Appending benchmark rows to bench/results.csv:
//   date,commit,machine,benchmark,configuration,metric,value,unit
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace dsflash::tools {

struct BenchRow {
  std::string metric;
  double value = 0;
  std::string unit;
};

// "host (N threads, arch)".
std::string machine_name();
// First line printed by a shell command ("" if none).
std::string shell_line(const char* cmd);
// One CSV field (RFC 4180): quoted where it holds a comma, quote or line break (or always),
// quotes inside doubled.
std::string csv_field(const std::string& text, bool always_quote = false);
double median(std::vector<double> v);
double percentile(std::vector<double> v, double p);  // p in [0, 1]
// Appends rows (writing the header to a new file) and prints them.
Status append_bench_rows(const std::string& csv, const std::string& benchmark, const std::string& configuration,
                         const std::vector<BenchRow>& rows, const std::string& machine = machine_name());

}  // namespace dsflash::tools
