// Runs on every build: where CUDA was not built or no device answers, each test skips with the
// exact reason (the CUDA error text); on a GPU machine it runs a kernel and checks its bytes.
#include "kvtier/cuda_device.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

TEST(CudaDeviceTest, ProbeReportsDeviceOrSaysWhyNot) {
  absl::StatusOr<CudaDeviceInfo> info = ProbeCudaDevices();
  if (!BuiltWithCuda()) {
    EXPECT_THAT(info, IsError(StatusCode::kUnimplemented, "built without CUDA"));
    GTEST_SKIP() << info.status().message();
  }
  if (!info.ok()) {
    EXPECT_EQ(info.status().code(), StatusCode::kUnavailable);
    EXPECT_THAT(std::string(info.status().message()), ::testing::HasSubstr("cudaError"));
    GTEST_SKIP() << "no CUDA device: " << info.status().message();
  }
  EXPECT_GE(info->device_count, 1);
  EXPECT_GT(info->total_memory_bytes, 0);
  EXPECT_FALSE(info->name.empty());
  EXPECT_GE(info->runtime_version, 12000);
}

TEST(CudaDeviceTest, KernelWritesExpectedBytes) {
  EXPECT_THAT(RunCudaSelfTest(0), IsError(StatusCode::kInvalidArgument, "num_bytes = 0"));
  absl::StatusOr<CudaDeviceInfo> info = ProbeCudaDevices();
  if (!info.ok()) GTEST_SKIP() << info.status().message();
  // 64 MiB + 3 bytes: many grid-stride iterations and a ragged end.
  KVTIER_EXPECT_OK(RunCudaSelfTest((int64_t{64} << 20) + 3));
}

}  // namespace
}  // namespace kvtier
