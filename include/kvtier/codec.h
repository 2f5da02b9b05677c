// Codecs for KV blocks in the lower tiers (remote values, optionally NVMe later): lossless lz4
// and zstd, each optionally after a byte-plane shuffle of 16-bit elements. A bf16/fp16 element's
// high byte (sign, exponent, top mantissa bits) varies little between neighbours while its low
// byte is noise; storing all low bytes, then all high bytes (little-endian elements), lets a
// general compressor find the redundancy, which it cannot in interleaved form (the idea of
// Blosc's shuffle filter). Inputs are limited to LZ4_MAX_INPUT_SIZE (about 2 GiB).
//
// fp8_e4m3 is LOSSY and opt-in: bf16 elements become OCP FP8 E4M3 with one float32 scale per
// block (half the bytes; relative error up to 2^-4 per value; details in src/remote/fp8.h and
// docs/formats.md). A block read back is close to, not equal to, the block written, so it fits
// only a deployment that accepts FP8 KV (as vLLM's kv_cache_dtype=fp8_e4m3 does).
//
// Thread-safety: the functions are thread-safe (no shared state).
#ifndef KVTIER_CODEC_H_
#define KVTIER_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvtier {

enum class Codec : uint8_t {
  kNone = 0,
  kLz4 = 1,           // LZ4 block format (liblz4), fast
  kZstd = 2,          // zstd level 1 (libzstd)
  kShuffleLz4 = 3,    // byte-plane shuffle of 16-bit elements, then LZ4
  kShuffleZstd = 4,   // byte-plane shuffle of 16-bit elements, then zstd level 1
  kFp8E4m3 = 5,       // LOSSY: bf16 -> FP8 E4M3 with a per-block scale
};

// True for codecs whose decoded block may differ from the one encoded.
inline bool CodecIsLossy(Codec codec) { return codec == Codec::kFp8E4m3; }

// "none", "lz4", "zstd", "shuffle_lz4", "shuffle_zstd", "fp8_e4m3"; "unknown" otherwise.
std::string_view CodecName(Codec codec);
// The inverse of CodecName. Errors: kInvalidArgument naming the text.
absl::StatusOr<Codec> ParseCodec(std::string_view name);

// Encodes `raw` with `codec` into `*out` (replacing its contents).
// Errors: kInvalidArgument for an unknown codec, a null `out`, or a shuffle or fp8 codec on an
// odd number of bytes; kInternal if the compression library fails.
absl::Status Compress(Codec codec, absl::Span<const std::byte> raw, std::vector<std::byte>* out);

// Decodes `encoded` into `raw`, which must be exactly the original size.
// Errors: kInvalidArgument for an unknown codec; kDataLoss if `encoded` does not decode to
// exactly raw.size() bytes (corrupt, truncated, or another codec's output).
absl::Status Decompress(Codec codec, absl::Span<const std::byte> encoded, absl::Span<std::byte> raw);

}  // namespace kvtier

#endif  // KVTIER_CODEC_H_
