// `dsflash inspect FILE`: header, metadata, tensor table, detected family, configuration and
// validation result. Exit code 1 when the file is not a usable V4.1 model.
#include <cstdio>

#include "absl/strings/str_format.h"
#include "common/config/config.h"
#include "common/gguf/gguf.h"
#include "tools/dsflash/args.h"
#include "tools/dsflash/commands.h"

namespace dsflash::tools {
namespace {

void print_metadata(const gguf::Model& m, bool all_keys) {
  std::printf("metadata (%zu keys)\n", m.metadata().size());
  for (const auto& [k, v] : m.metadata()) {
    const size_t max = all_keys ? 64 : 6;
    std::printf("  %-48s %s\n", k.c_str(), v.to_string(max).c_str());
  }
}

void print_tensors(const gguf::Model& m, bool full) {
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // type -> (count, bytes)
  for (const auto& t : m.tensors()) {
    auto& e = by_type[quant::type_name(static_cast<uint32_t>(t.type))];
    e.first += 1;
    e.second += t.n_bytes;
  }
  std::printf("tensors (%zu, %.2f MiB in %zu file%s)\n", m.tensors().size(), m.total_bytes() / 1048576.0, m.n_shards(),
              m.n_shards() > 1 ? "s" : "");
  for (const auto& [type, e] : by_type) std::printf("  %-8s %6llu tensors %12.2f MiB\n", type.c_str(),
                                                    static_cast<unsigned long long>(e.first), e.second / 1048576.0);
  if (!full) return;
  for (const auto& t : m.tensors()) {
    std::printf("  %-40s %-8s %-24s shard %u  offset %llu\n", t.name.c_str(),
                quant::type_name(static_cast<uint32_t>(t.type)).c_str(), t.shape_string().c_str(), t.shard,
                static_cast<unsigned long long>(t.file_offset));
  }
}

}  // namespace

int inspect_main(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"tensors", "all-keys"}, {});
  if (!args.ok() || args->positional().size() != 1) {
    std::fprintf(stderr, "usage: dsflash inspect FILE [--tensors] [--all-keys]\n%s\n",
                 args.ok() ? "" : std::string(args.status().message()).c_str());
    return 2;
  }
  const std::string path = args->positional()[0];
  auto model = gguf::Model::open(path);
  if (!model.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  const gguf::Model& m = **model;
  std::printf("file             %s (GGUF v%u, alignment %llu, %zu shard%s)\n", path.c_str(), m.shard(0).version(),
              static_cast<unsigned long long>(m.shard(0).alignment()), m.n_shards(), m.n_shards() > 1 ? "s" : "");
  print_metadata(m, args->has("all-keys"));
  print_tensors(m, args->has("tensors"));
  auto cfg = config::from_gguf(m);
  if (!cfg.ok()) {
    std::printf("configuration    INVALID\n");
    std::fprintf(stderr, "error: %s\n", std::string(cfg.status().message()).c_str());
    return 1;
  }
  std::printf("configuration    DeepSeek-V4.1\n%s", config::describe(*cfg).c_str());
  const Status inv = config::validate_tensors(*cfg, m);
  if (!inv.ok()) {
    std::printf("validation       FAILED\n");
    std::fprintf(stderr, "error: %s\n", std::string(inv.message()).c_str());
    return 1;
  }
  std::printf("validation       OK: every tensor the configuration needs is present with its shape and a usable type\n");
  return 0;
}

}  // namespace dsflash::tools
