// The lossy fp8_e4m3 codec: exact values of the OCP E4M3 format, rounding, saturation, and the
// error bound on KV-like blocks.
#include "remote/fp8.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/codec.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using internal::FloatToFp8E4m3;
using internal::Fp8E4m3ToFloat;

TEST(Fp8E4m3Test, KnownCodesOfTheOcpSpecification) {
  EXPECT_EQ(FloatToFp8E4m3(0.0f), 0x00);
  EXPECT_EQ(FloatToFp8E4m3(-0.0f), 0x80);
  EXPECT_EQ(FloatToFp8E4m3(1.0f), 0x38);  // exponent 7 (bias 7), mantissa 0
  EXPECT_EQ(FloatToFp8E4m3(-2.0f), 0xC0);
  EXPECT_EQ(FloatToFp8E4m3(448.0f), 0x7E);                // the largest finite value
  EXPECT_EQ(FloatToFp8E4m3(0.015625f), 0x08);             // 2^-6, the smallest normal
  EXPECT_EQ(FloatToFp8E4m3(std::ldexp(1.0f, -9)), 0x01);  // the smallest subnormal
  EXPECT_EQ(FloatToFp8E4m3(std::nanf("")) & 0x7F, 0x7F);
  EXPECT_EQ(Fp8E4m3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp8E4m3ToFloat(0xB8), -1.0f);
  EXPECT_TRUE(std::isnan(Fp8E4m3ToFloat(0x7F)));
  // Every finite code decodes and encodes back to itself.
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(FloatToFp8E4m3(Fp8E4m3ToFloat(static_cast<uint8_t>(c))), c) << c;
  }
}

TEST(Fp8E4m3Test, RoundsToNearestEvenAndSaturates) {
  // Between 1.0 (0x38) and 1.125 (0x39): the midpoint goes to the even code 0x38.
  EXPECT_EQ(FloatToFp8E4m3(1.0625f), 0x38);
  EXPECT_EQ(FloatToFp8E4m3(1.0626f), 0x39);
  // Between 1.125 (0x39) and 1.25 (0x3A): the midpoint goes to 0x3A.
  EXPECT_EQ(FloatToFp8E4m3(1.1875f), 0x3A);
  // Carry into the exponent: just under 2 rounds to 2.
  EXPECT_EQ(FloatToFp8E4m3(1.97f), 0x40);
  // Subnormal midpoint 1.5 * 2^-9 -> 2 * 2^-9 (even).
  EXPECT_EQ(FloatToFp8E4m3(1.5f * std::ldexp(1.0f, -9)), 0x02);
  EXPECT_EQ(FloatToFp8E4m3(0.5f * std::ldexp(1.0f, -9)), 0x00);
  // No infinity in E4M3fn: everything beyond saturates to +-448.
  EXPECT_EQ(FloatToFp8E4m3(470.0f), 0x7E);
  EXPECT_EQ(FloatToFp8E4m3(1e30f), 0x7E);
  EXPECT_EQ(FloatToFp8E4m3(-INFINITY), 0xFE);
}

std::vector<std::byte> Bf16(const std::vector<float>& values) {
  std::vector<std::byte> out(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(values[i]);
    const auto b = static_cast<uint16_t>(bits >> 16);  // truncation: values are bf16-exact here
    std::memcpy(out.data() + 2 * i, &b, 2);
  }
  return out;
}

float At(const std::vector<std::byte>& bf16, size_t i) {
  uint16_t b;
  std::memcpy(&b, bf16.data() + 2 * i, 2);
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

TEST(Fp8E4m3Test, CodecIsLossyWithinTheFormatsBound) {
  EXPECT_TRUE(CodecIsLossy(Codec::kFp8E4m3));
  EXPECT_FALSE(CodecIsLossy(Codec::kShuffleZstd));
  EXPECT_EQ(*ParseCodec("fp8_e4m3"), Codec::kFp8E4m3);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(8192);
  for (float& v : values) v = std::ldexp(1.0f, -7) * std::round(normal(rng) * 128.0f * 4.0f) / 4.0f;
  values[17] = 60.0f;  // an outlier sets the scale
  const std::vector<std::byte> raw = Bf16(values);
  std::vector<std::byte> encoded;
  KVTIER_ASSERT_OK(Compress(Codec::kFp8E4m3, raw, &encoded));
  EXPECT_EQ(encoded.size(), 4 + raw.size() / 2);
  std::vector<std::byte> decoded(raw.size());
  KVTIER_ASSERT_OK(Decompress(Codec::kFp8E4m3, encoded, absl::MakeSpan(decoded)));
  EXPECT_EQ(At(decoded, 17), 60.0f) << "the block maximum maps to 448 * scale exactly";
  const float scale = 60.0f / 448.0f;
  for (size_t i = 0; i < values.size(); ++i) {
    const float x = At(raw, i);
    const float y = At(decoded, i);
    // 3 mantissa bits: relative error <= 2^-4 for normals; absolute 2^-10 * scale in the
    // subnormal range; plus bf16's own rounding of the result (2^-8 relative).
    const float bound = std::max(std::fabs(x) * (0.0625f + 0.0079f), std::ldexp(scale, -10));
    ASSERT_LE(std::fabs(x - y), bound) << "element " << i << ": " << x << " -> " << y;
  }
  // A corrupt payload (bad size, bad scale) is kDataLoss, not garbage KV.
  EXPECT_FALSE(
      Decompress(Codec::kFp8E4m3, absl::MakeSpan(encoded).subspan(1), absl::MakeSpan(decoded))
          .ok());
  encoded[3] = std::byte{0xFF};  // scale becomes NaN
  encoded[2] = std::byte{0xFF};
  EXPECT_TRUE(absl::IsDataLoss(Decompress(Codec::kFp8E4m3, encoded, absl::MakeSpan(decoded))));
  EXPECT_TRUE(
      absl::IsInvalidArgument(Compress(Codec::kFp8E4m3, absl::MakeSpan(raw).subspan(1), &encoded)));
}

TEST(Fp8E4m3Test, AllZeroBlockRoundTrips) {
  const std::vector<std::byte> raw(512, std::byte{0});
  std::vector<std::byte> encoded;
  KVTIER_ASSERT_OK(Compress(Codec::kFp8E4m3, raw, &encoded));
  std::vector<std::byte> decoded(raw.size(), std::byte{1});
  KVTIER_ASSERT_OK(Decompress(Codec::kFp8E4m3, encoded, absl::MakeSpan(decoded)));
  EXPECT_EQ(decoded, raw);
}

}  // namespace
}  // namespace kvtier
