// Block codecs (codec.h): byte-plane shuffle, lz4, zstd and fp8 for the remote tier.
#include "kvtier/codec.h"

#include <lz4.h>
#include <zstd.h>

#include <cstring>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "internal/strings.h"
#include "remote/fp8.h"

namespace kvtier {
namespace {

using internal::ToAbsl;

constexpr int kZstdLevel = 1;  // fast; KV compresses little better at higher levels

// [l0 h0 l1 h1 ...] -> [l0 l1 ... | h0 h1 ...] for 16-bit little-endian elements (l: low byte).
void Shuffle(absl::Span<const std::byte> in, std::byte* out) {
  const size_t n = in.size() / 2;
  for (size_t i = 0; i < n; ++i) {
    out[i] = in[2 * i];
    out[n + i] = in[2 * i + 1];
  }
}

void Unshuffle(const std::byte* in, absl::Span<std::byte> out) {
  const size_t n = out.size() / 2;
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = in[i];
    out[2 * i + 1] = in[n + i];
  }
}

bool Shuffled(Codec c) { return c == Codec::kShuffleLz4 || c == Codec::kShuffleZstd; }
bool UsesLz4(Codec c) { return c == Codec::kLz4 || c == Codec::kShuffleLz4; }
bool Known(Codec c) { return static_cast<uint8_t>(c) <= static_cast<uint8_t>(Codec::kFp8E4m3); }
// Codecs that read the block as 16-bit elements.
bool Elementwise(Codec c) { return Shuffled(c) || c == Codec::kFp8E4m3; }

}  // namespace

std::string_view CodecName(Codec codec) {
  switch (codec) {
    case Codec::kNone:
      return "none";
    case Codec::kLz4:
      return "lz4";
    case Codec::kZstd:
      return "zstd";
    case Codec::kShuffleLz4:
      return "shuffle_lz4";
    case Codec::kShuffleZstd:
      return "shuffle_zstd";
    case Codec::kFp8E4m3:
      return "fp8_e4m3";
  }
  return "unknown";
}

absl::StatusOr<Codec> ParseCodec(std::string_view name) {
  for (Codec c : {Codec::kNone, Codec::kLz4, Codec::kZstd, Codec::kShuffleLz4, Codec::kShuffleZstd,
                  Codec::kFp8E4m3}) {
    if (absl::AsciiStrToLower(ToAbsl(name)) == ToAbsl(CodecName(c))) return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown codec \"", ToAbsl(name),
                   "\" (none, lz4, zstd, shuffle_lz4, shuffle_zstd, fp8_e4m3)"));
}

absl::Status Compress(Codec codec, absl::Span<const std::byte> raw, std::vector<std::byte>* out) {
  if (out == nullptr) return absl::InvalidArgumentError("Compress: out is null");
  if (!Known(codec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Compress: unknown codec ", static_cast<int>(codec)));
  }
  if (codec == Codec::kNone) {
    out->assign(raw.begin(), raw.end());
    return absl::OkStatus();
  }
  if (raw.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("Compress: ", raw.size(), " bytes is too large"));
  }
  if (Elementwise(codec) && raw.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("Compress: ", ToAbsl(CodecName(codec)),
                                                   " needs 16-bit elements; got ", raw.size(),
                                                   " bytes"));
  }
  if (codec == Codec::kFp8E4m3) {
    out->resize(4 + raw.size() / 2);
    internal::EncodeBf16AsFp8E4m3(raw, out->data());
    return absl::OkStatus();
  }
  std::vector<std::byte> shuffled;
  absl::Span<const std::byte> input = raw;
  if (Shuffled(codec)) {
    shuffled.resize(raw.size());
    Shuffle(raw, shuffled.data());
    input = shuffled;
  }
  if (UsesLz4(codec)) {
    const int bound = LZ4_compressBound(static_cast<int>(input.size()));
    out->resize(static_cast<size_t>(bound));
    const int n = LZ4_compress_default(reinterpret_cast<const char*>(input.data()),
                                       reinterpret_cast<char*>(out->data()),
                                       static_cast<int>(input.size()), bound);
    if (n <= 0) return absl::InternalError("LZ4_compress_default failed");
    out->resize(static_cast<size_t>(n));
    return absl::OkStatus();
  }
  out->resize(ZSTD_compressBound(input.size()));
  const size_t n = ZSTD_compress(out->data(), out->size(), input.data(), input.size(), kZstdLevel);
  if (ZSTD_isError(n)) {
    return absl::InternalError(absl::StrCat("ZSTD_compress: ", ZSTD_getErrorName(n)));
  }
  out->resize(n);
  return absl::OkStatus();
}

absl::Status Decompress(Codec codec, absl::Span<const std::byte> encoded,
                        absl::Span<std::byte> raw) {
  if (!Known(codec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Decompress: unknown codec ", static_cast<int>(codec)));
  }
  auto wrong_size = [&](int64_t got) {
    return absl::DataLossError(absl::StrCat("Decompress(", ToAbsl(CodecName(codec)), "): decoded ",
                                            got, " bytes, expected ", raw.size()));
  };
  if (codec == Codec::kNone) {
    if (encoded.size() != raw.size()) return wrong_size(static_cast<int64_t>(encoded.size()));
    std::memcpy(raw.data(), encoded.data(), raw.size());
    return absl::OkStatus();
  }
  if (codec == Codec::kFp8E4m3) return internal::DecodeFp8E4m3AsBf16(encoded, raw);
  if (raw.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      encoded.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      (Shuffled(codec) && raw.size() % 2 != 0)) {
    return wrong_size(-1);
  }
  std::vector<std::byte> shuffled(Shuffled(codec) ? raw.size() : 0);
  std::byte* target = Shuffled(codec) ? shuffled.data() : raw.data();
  int64_t got = 0;
  if (UsesLz4(codec)) {
    got = LZ4_decompress_safe(reinterpret_cast<const char*>(encoded.data()),
                              reinterpret_cast<char*>(target), static_cast<int>(encoded.size()),
                              static_cast<int>(raw.size()));
  } else {
    const size_t n = ZSTD_decompress(target, raw.size(), encoded.data(), encoded.size());
    got = ZSTD_isError(n) ? -1 : static_cast<int64_t>(n);
  }
  if (got != static_cast<int64_t>(raw.size())) return wrong_size(got);
  if (Shuffled(codec)) Unshuffle(shuffled.data(), raw);
  return absl::OkStatus();
}

}  // namespace kvtier
