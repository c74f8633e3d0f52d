// Subcommands of the `dsflash` CLI. Each takes the arguments after its name and returns a
// process exit code (0 ok, 1 failure reported on stderr, 2 usage error).
#pragma once

#include <string>
#include <vector>

namespace dsflash::tools {

int inspect_main(const std::vector<std::string>& args);
int mkmodel_main(const std::vector<std::string>& args);
int tokenize_main(const std::vector<std::string>& args);
int detokenize_main(const std::vector<std::string>& args);
int logits_main(const std::vector<std::string>& args);
int bench_main(const std::vector<std::string>& args);
int generate_main(const std::vector<std::string>& args);
int loadgen_main(const std::vector<std::string>& args);

}  // namespace dsflash::tools
