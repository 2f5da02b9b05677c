// Status assertions for tests: the code must be the specific one, and the message must name
// the offending value.
#ifndef KVTIER_TESTS_TESTING_STATUS_MATCHERS_H_
#define KVTIER_TESTS_TESTING_STATUS_MATCHERS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

// EXPECT_THAT(f(), IsError(absl::StatusCode::kInvalidArgument, "tokens_per_block"))
MATCHER_P2(IsError, code, substring, "") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code && std::string(s.message()).find(substring) != std::string::npos;
}

MATCHER(IsOk, "") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.ok();
}

}  // namespace kvtier::testing

#define KVTIER_ASSERT_OK(expr) ASSERT_THAT((expr), ::kvtier::testing::IsOk())
#define KVTIER_EXPECT_OK(expr) EXPECT_THAT((expr), ::kvtier::testing::IsOk())

// `lhs = value of a StatusOr expression`, failing the test if it is not OK.
#define KVTIER_ASSERT_OK_AND_ASSIGN(lhs, expr) \
  KVTIER_ASSERT_OK_AND_ASSIGN_IMPL_(KVTIER_TEST_CONCAT_(kvtier_or_, __LINE__), lhs, expr)
#define KVTIER_TEST_CONCAT_INNER_(a, b) a##b
#define KVTIER_TEST_CONCAT_(a, b) KVTIER_TEST_CONCAT_INNER_(a, b)
#define KVTIER_ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                      \
  ASSERT_TRUE(tmp.ok()) << tmp.status().ToString();       \
  lhs = std::move(tmp).value()

#endif  // KVTIER_TESTS_TESTING_STATUS_MATCHERS_H_
