// Rows in bench/results.csv's format (date, commit, machine, benchmark, configuration, metric,
// value, unit) appended to a file, for the standalone CUDA benchmarks (icache_bench,
// chain_bench). The commit comes from DSF_COMMIT, the machine from DSF_MACHINE or the caller's
// default (the device's name); an empty path writes nothing.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

class CsvRows {
 public:
  CsvRows(const std::string& path, const char* benchmark, const char* default_machine)
      : benchmark_(benchmark), machine_(default_machine) {
    if (path.empty()) return;
    f_ = std::fopen(path.c_str(), "a");
    if (f_ == nullptr) {
      std::fprintf(stderr, "%s: cannot append to %s\n", benchmark, path.c_str());
      std::exit(1);
    }
    const std::time_t now = std::time(nullptr);
    std::strftime(date_, sizeof date_, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    if (const char* c = std::getenv("DSF_COMMIT")) commit_ = c;
    if (const char* m = std::getenv("DSF_MACHINE")) machine_ = m;
  }
  ~CsvRows() {
    if (f_ != nullptr) std::fclose(f_);
  }
  CsvRows(const CsvRows&) = delete;
  CsvRows& operator=(const CsvRows&) = delete;

  void add(const std::string& config, const char* metric, double value, const char* unit) {
    if (f_ == nullptr) return;
    std::fprintf(f_, "%s,%s,\"%s\",%s,\"%s\",%s,%.3f,%s\n", date_, commit_.c_str(), machine_.c_str(),
                 benchmark_.c_str(), config.c_str(), metric, value, unit);
  }

 private:
  FILE* f_ = nullptr;
  char date_[32] = {};
  std::string benchmark_, commit_ = "unknown", machine_;
};
