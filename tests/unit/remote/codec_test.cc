#include "kvtier/codec.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/random_bytes.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

constexpr Codec kAll[] = {Codec::kNone, Codec::kLz4, Codec::kZstd, Codec::kShuffleLz4,
                          Codec::kShuffleZstd};

// bf16 values drawn like KV activations: normal, small magnitudes (upper 16 bits of a float).
std::vector<std::byte> Bf16Activations(size_t elements, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> value(0.0f, 0.5f);
  std::vector<std::byte> out(elements * 2);
  for (size_t i = 0; i < elements; ++i) {
    const float f = value(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    out[2 * i] = static_cast<std::byte>(bits >> 16);
    out[2 * i + 1] = static_cast<std::byte>(bits >> 24);
  }
  return out;
}

TEST(CodecTest, EveryCodecRoundTrips) {
  const std::vector<std::byte> kv = Bf16Activations(32768, 1);
  for (Codec c : kAll) {
    std::vector<std::byte> encoded;
    KVTIER_ASSERT_OK(Compress(c, kv, &encoded));
    std::vector<std::byte> back(kv.size());
    KVTIER_ASSERT_OK(Decompress(c, encoded, absl::MakeSpan(back)));
    EXPECT_TRUE(back == kv) << CodecName(c);
  }
}

TEST(CodecTest, ShuffleMakesBf16Compressible) {
  const std::vector<std::byte> kv = Bf16Activations(65536, 2);
  std::vector<std::byte> plain, shuffled;
  KVTIER_ASSERT_OK(Compress(Codec::kZstd, kv, &plain));
  KVTIER_ASSERT_OK(Compress(Codec::kShuffleZstd, kv, &shuffled));
  EXPECT_LT(shuffled.size(), plain.size()) << "the shuffle must help on bf16 activations";
  EXPECT_LT(shuffled.size(), kv.size() * 9 / 10);
}

TEST(CodecTest, CorruptOrWrongSizedInputIsDataLoss) {
  const std::vector<std::byte> kv = Bf16Activations(4096, 3);
  for (Codec c : {Codec::kLz4, Codec::kZstd, Codec::kShuffleLz4, Codec::kShuffleZstd}) {
    std::vector<std::byte> encoded;
    KVTIER_ASSERT_OK(Compress(c, kv, &encoded));
    std::vector<std::byte> back(kv.size() + 2);
    EXPECT_THAT(Decompress(c, encoded, absl::MakeSpan(back)),
                IsError(StatusCode::kDataLoss, "expected 8194"));
    const std::vector<std::byte> garbage = testing::RandomBytes(100, 9);
    std::vector<std::byte> out(kv.size());
    EXPECT_THAT(Decompress(c, garbage, absl::MakeSpan(out)), IsError(StatusCode::kDataLoss, ""));
  }
  std::vector<std::byte> out(10);
  EXPECT_THAT(Decompress(Codec::kNone, kv, absl::MakeSpan(out)),
              IsError(StatusCode::kDataLoss, "decoded 8192 bytes, expected 10"));
}

TEST(CodecTest, BadArguments) {
  std::vector<std::byte> out;
  const std::vector<std::byte> odd(7);
  EXPECT_THAT(Compress(Codec::kShuffleLz4, odd, &out),
              IsError(StatusCode::kInvalidArgument, "16-bit elements; got 7"));
  EXPECT_THAT(Compress(static_cast<Codec>(9), odd, &out),
              IsError(StatusCode::kInvalidArgument, "unknown codec 9"));
  EXPECT_THAT(Compress(Codec::kNone, odd, nullptr), IsError(StatusCode::kInvalidArgument, "null"));
  std::vector<std::byte> raw(4);
  EXPECT_THAT(Decompress(static_cast<Codec>(9), odd, absl::MakeSpan(raw)),
              IsError(StatusCode::kInvalidArgument, "unknown codec 9"));
  for (Codec c : kAll) EXPECT_EQ(*ParseCodec(CodecName(c)), c);
  EXPECT_THAT(ParseCodec("brotli"), IsError(StatusCode::kInvalidArgument, "\"brotli\""));
}

}  // namespace
}  // namespace kvtier
