// Status propagation helpers. Debian's abseil (20220623) lacks ABSL_RETURN_IF_ERROR, so kvtier
// keeps this one pair of macros of its own (STYLE rule 4).
#ifndef KVTIER_INTERNAL_STATUS_MACROS_H_
#define KVTIER_INTERNAL_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns the status of `expr` from the enclosing function if it is not OK.
#define KVTIER_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    const ::absl::Status kvtier_status_ = (expr);     \
    if (!kvtier_status_.ok()) return kvtier_status_;  \
  } while (false)

#define KVTIER_STATUS_CONCAT_INNER_(a, b) a##b
#define KVTIER_STATUS_CONCAT_(a, b) KVTIER_STATUS_CONCAT_INNER_(a, b)

// `lhs = value of statusor_expr`, or returns its status from the enclosing function.
#define KVTIER_ASSIGN_OR_RETURN(lhs, statusor_expr) \
  KVTIER_ASSIGN_OR_RETURN_IMPL_(KVTIER_STATUS_CONCAT_(kvtier_statusor_, __LINE__), lhs, statusor_expr)

#define KVTIER_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, statusor_expr) \
  auto tmp = (statusor_expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();               \
  lhs = std::move(tmp).value()

#endif  // KVTIER_INTERNAL_STATUS_MACROS_H_
