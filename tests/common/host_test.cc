// common/host: /proc/meminfo parsing (this machine's file and crafted texts) and byte sizes.
#include "common/host/host.h"

#include "gtest/gtest.h"

namespace dsflash::host {
namespace {

TEST(MemInfo, ParsesTheKernelsFormat) {
  const auto m = parse_meminfo(
      "MemTotal:       131072000 kB\nMemFree:         1000 kB\nMemAvailable:    65536000 kB\nBuffers: 1 kB\n");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->total, 131072000ull * 1024);
  EXPECT_EQ(m->available, 65536000ull * 1024);
  const auto here = read_meminfo();
  ASSERT_TRUE(here.ok()) << here.status();
  EXPECT_GT(here->total, 0u);
  EXPECT_LE(here->available, here->total);
}

TEST(MemInfo, NamesWhatIsMissingOrMalformed) {
  const auto no_avail = parse_meminfo("MemTotal: 100 kB\nMemFree: 5 kB\n");
  ASSERT_FALSE(no_avail.ok());
  EXPECT_NE(no_avail.status().message().find("MemAvailable"), std::string::npos);
  for (const char* bad : {"MemTotal: 100 kB\nMemAvailable: x kB\n", "MemTotal: 100\nMemAvailable: 5 kB\n",
                          "MemTotal: -1 kB\nMemAvailable: 5 kB\n", "MemTotal: 99999999999999999999 kB\nMemAvailable: 5 kB\n"}) {
    const auto m = parse_meminfo(bad);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << bad;
  }
  EXPECT_EQ(read_meminfo("/nonexistent/meminfo").status().code(), absl::StatusCode::kNotFound);
}

TEST(ParseSize, UnitsAndRefusals) {
  uint64_t v = 0;
  EXPECT_TRUE(parse_size("4G", &v));
  EXPECT_EQ(v, 4ull << 30);
  EXPECT_TRUE(parse_size("512m", &v));
  EXPECT_EQ(v, 512ull << 20);
  EXPECT_TRUE(parse_size("1.5T", &v));
  EXPECT_EQ(v, 3ull << 39);
  EXPECT_TRUE(parse_size("1000", &v));
  EXPECT_EQ(v, 1000u);
  for (const char* bad : {"", "G", "-1G", "0", "abc", "1X", "nanG", "99999999T"}) EXPECT_FALSE(parse_size(bad, &v)) << bad;
}

}  // namespace
}  // namespace dsflash::host
