// placeholder
#include "tools/dsflash/commands.h"
namespace dsflash::tools {
int mkmodel_main(const std::vector<std::string>&) { return 2; }
int tokenize_main(const std::vector<std::string>&) { return 2; }
int detokenize_main(const std::vector<std::string>&) { return 2; }
}
