// dsflash: command-line tools for DeepSeek-V4.1 GGUF files (inspect, mkmodel, tokenize,
// detokenize). Thin dispatch; each command lives in its own file.
#include <cstdio>
#include <string>
#include <vector>

#include "tools/dsflash/commands.h"

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: dsflash <command> [args]\n"
               "  inspect FILE [--tensors] [--all-keys]     metadata, tensors, family, config, validation\n"
               "  mkmodel --out PATH [--preset tiny|mid|perf] [--seed N] [--shards N] [--experts N]\n"
               "                                            write a synthetic DeepSeek-V4.1 GGUF\n"
               "  tokenize --model FILE [--special] [--chat] TEXT...   text -> token ids\n"
               "  detokenize --model FILE ID...             token ids -> text\n"
               "  logits --model FILE --tokens 1,2,3 [--decode N] --out FILE.npy\n"
               "                                            CPU logits [S + N, vocab]; prints the N greedy tokens\n"
               "  bench --model FILE [--prompt N] [--decode M] [--runs R] [--csv PATH] [--backend cpu|cuda]\n"
               "                                            CPU prefill/decode tokens/s -> bench/results.csv\n"
               "  generate [--server ADDR] [--chat] [--max-tokens N] [--temperature T] [--seed N] [--json] PROMPT...\n"
               "                                            stream text from a running dsflash-inference\n"
               "  loadgen [--server ADDR] [--mode fresh|same|turns] [--requests N] [--concurrency C] [--prompt-tokens P]\n"
               "          [--max-tokens M] [--think] [--wait-ready S]\n"
               "                                            TTFT / time per token through the API -> bench/results.csv\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage();
    return 2;
  }
  const std::string cmd = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "inspect") return dsflash::tools::inspect_main(args);
  if (cmd == "mkmodel") return dsflash::tools::mkmodel_main(args);
  if (cmd == "tokenize") return dsflash::tools::tokenize_main(args);
  if (cmd == "detokenize") return dsflash::tools::detokenize_main(args);
  if (cmd == "logits") return dsflash::tools::logits_main(args);
  if (cmd == "bench") return dsflash::tools::bench_main(args);
  if (cmd == "generate") return dsflash::tools::generate_main(args);
  if (cmd == "loadgen") return dsflash::tools::loadgen_main(args);
  if (cmd == "help" || cmd == "--help" || cmd == "-h") {
    usage();
    return 0;
  }
  std::fprintf(stderr, "dsflash: unknown command '%s'\n", cmd.c_str());
  usage();
  return 2;
}
