// Status and error propagation for all of dsflash (host code). Re-exports absl::Status /
// absl::StatusOr and defines RETURN_IF_ERROR / ASSIGN_OR_RETURN. Code that reads untrusted
// bytes (files, requests) returns a Status naming what was wrong; it never asserts on them.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dsflash {

using Status = absl::Status;
template <typename T>
using StatusOr = absl::StatusOr<T>;

}  // namespace dsflash

#define DSF_STATUS_CONCAT_INNER_(a, b) a##b
#define DSF_STATUS_CONCAT_(a, b) DSF_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define RETURN_IF_ERROR(expr)                 \
  do {                                        \
    ::absl::Status dsf_status_ = (expr);      \
    if (!dsf_status_.ok()) return dsf_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, f())`: evaluates f() (a StatusOr), returns its error or binds x.
#define ASSIGN_OR_RETURN(lhs, expr) \
  DSF_ASSIGN_OR_RETURN_IMPL_(DSF_STATUS_CONCAT_(dsf_statusor_, __LINE__), lhs, expr)
#define DSF_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
