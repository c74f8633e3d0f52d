// DSF_CHECK: aborts with file:line for broken *internal* invariants only (like GGML_ASSERT).
// Never use it on file bytes or request fields: those get a Status (status.h).
#pragma once

#include <cstdio>
#include <cstdlib>

#define DSF_CHECK(cond, ...)                                                     \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "%s:%d: DSF_CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, "" __VA_ARGS__);                                      \
      std::fputc('\n', stderr);                                                  \
      std::abort();                                                              \
    }                                                                            \
  } while (0)
