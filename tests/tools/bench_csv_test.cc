// bench/results.csv rows: eight fields whatever the text of a unit or configuration holds.
#include "tools/dsflash/bench_csv.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dsflash::tools {
namespace {

// The fields of one RFC 4180 line (quoted fields may hold commas and doubled quotes).
std::vector<std::string> parse_line(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      fields.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  return fields;
}

TEST(BenchCsv, FieldsQuotedOnlyWhereNeeded) {
  EXPECT_EQ(csv_field("ms"), "ms");
  EXPECT_EQ(csv_field("ms", true), "\"ms\"");
  EXPECT_EQ(csv_field("ms per token (eager, GPU time)"), "\"ms per token (eager, GPU time)\"");
  EXPECT_EQ(csv_field("a \"b\""), "\"a \"\"b\"\"\"");
}

TEST(BenchCsv, RowsWithCommasInTheUnitKeepEightFields) {
  const std::string csv = ::testing::TempDir() + "/bench_csv_test_" + std::to_string(::getpid()) + ".csv";
  std::remove(csv.c_str());
  ::setenv("DSF_COMMIT", "abc1234", 1);
  const std::vector<BenchRow> rows = {{"decode_ms", 7.5, "ms"},
                                      {"kernels_total_ms", 16.0, "ms per token (eager, GPU time of every kernel)"},
                                      {"odd \"metric\"", 1.0, "a, \"b\""}};
  ASSERT_TRUE(append_bench_rows(csv, "cuda_forward", "perf prompt=64, decode=64", rows, "H200 (16 threads, x86_64)").ok());
  std::ifstream in(csv);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line, "date,commit,machine,benchmark,configuration,metric,value,unit");
  for (const BenchRow& r : rows) {
    ASSERT_TRUE(std::getline(in, line));
    const std::vector<std::string> f = parse_line(line);
    ASSERT_EQ(f.size(), 8u) << line;
    EXPECT_EQ(f[1], "abc1234");
    EXPECT_EQ(f[2], "H200 (16 threads, x86_64)");
    EXPECT_EQ(f[3], "cuda_forward");
    EXPECT_EQ(f[4], "perf prompt=64, decode=64");
    EXPECT_EQ(f[5], r.metric);
    EXPECT_DOUBLE_EQ(std::strtod(f[6].c_str(), nullptr), r.value);
    EXPECT_EQ(f[7], r.unit);
  }
  EXPECT_FALSE(std::getline(in, line));
  std::remove(csv.c_str());
}

}  // namespace
}  // namespace dsflash::tools
