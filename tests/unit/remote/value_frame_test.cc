#include "kvtier/value_frame.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/random_bytes.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

constexpr std::array<uint8_t, 16> kNs = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
constexpr BlockKey kKey{0x1111, 0x2222};

std::vector<std::byte> Frame(const std::vector<std::byte>& block, Codec codec,
                             std::string_view secret = "") {
  std::vector<std::byte> f;
  EXPECT_TRUE(EncodeFrame(kNs, kKey, block, codec, secret, &f).ok());
  return f;
}

TEST(ValueFrameTest, RoundTripsWithEveryCodecAndKeyed) {
  const std::vector<std::byte> block = testing::RandomBytes(6144, 1);
  for (Codec c : {Codec::kNone, Codec::kLz4, Codec::kZstd, Codec::kShuffleLz4,
                  Codec::kShuffleZstd}) {
    for (std::string_view secret : {"", "deployment-secret"}) {
      const std::vector<std::byte> f = Frame(block, c, secret);
      std::vector<std::byte> back(block.size());
      KVTIER_ASSERT_OK(DecodeFrame(f, kNs, kKey, secret, absl::MakeSpan(back)));
      EXPECT_TRUE(back == block) << CodecName(c) << " keyed=" << !secret.empty();
    }
  }
  EXPECT_EQ(Frame(block, Codec::kNone).size(), kFrameHeaderBytes + block.size());
}

TEST(ValueFrameTest, EveryFlippedBitIsDataLoss) {
  const std::vector<std::byte> block = testing::RandomBytes(512, 2);
  const std::vector<std::byte> good = Frame(block, Codec::kNone);
  std::vector<std::byte> back(block.size());
  for (size_t byte = 0; byte < good.size(); ++byte) {
    std::vector<std::byte> bad = good;
    bad[byte] ^= std::byte{0x04};
    EXPECT_EQ(DecodeFrame(bad, kNs, kKey, "", absl::MakeSpan(back)).code(),
              StatusCode::kDataLoss)
        << "flipped byte " << byte;
  }
}

TEST(ValueFrameTest, ForeignValuesAreNamed) {
  const std::vector<std::byte> block = testing::RandomBytes(512, 3);
  std::vector<std::byte> back(block.size());
  std::array<uint8_t, 16> other_ns = kNs;
  other_ns[0] ^= 1;
  EXPECT_THAT(DecodeFrame(Frame(block, Codec::kNone), other_ns, kKey, "", absl::MakeSpan(back)),
              IsError(StatusCode::kDataLoss, "another namespace"));
  EXPECT_THAT(DecodeFrame(Frame(block, Codec::kNone), kNs, BlockKey{1, 1}, "", absl::MakeSpan(back)),
              IsError(StatusCode::kDataLoss, "another block key"));
  EXPECT_THAT(DecodeFrame(Frame(block, Codec::kNone), kNs, kKey, "secret", absl::MakeSpan(back)),
              IsError(StatusCode::kDataLoss, "requires an HMAC"));
  EXPECT_THAT(DecodeFrame(Frame(block, Codec::kNone, "secret"), kNs, kKey, "", absl::MakeSpan(back)),
              IsError(StatusCode::kDataLoss, "has no secret"));
  EXPECT_THAT(DecodeFrame(Frame(block, Codec::kNone, "secret"), kNs, kKey, "other-secret",
                          absl::MakeSpan(back)),
              IsError(StatusCode::kDataLoss, "HMAC mismatch"));
  std::vector<std::byte> small(100);
  EXPECT_THAT(DecodeFrame(Frame(block, Codec::kNone), kNs, kKey, "", absl::MakeSpan(small)),
              IsError(StatusCode::kDataLoss, "a block of 512 bytes, expected 100"));
  std::vector<std::byte> truncated = Frame(block, Codec::kNone);
  truncated.resize(50);
  EXPECT_THAT(DecodeFrame(truncated, kNs, kKey, "", absl::MakeSpan(back)),
              IsError(StatusCode::kDataLoss, "shorter than a frame header"));
}

}  // namespace
}  // namespace kvtier
