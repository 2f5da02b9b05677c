// The frame around a block stored outside this process (remote stores, shared directories): it
// says whose block it is and proves the bytes are the ones written. Layout in docs/formats.md
// ("Remote value frame"): magic, format version, codec, flags, namespace digest, block key, raw
// length, payload length, a 32-byte checksum, then the (possibly compressed) payload.
//
// The checksum is XXH3-128 over the header fields and the payload, or, with a per-deployment
// secret, HMAC-SHA256 (OpenSSL) over the same bytes, so a store shared with other parties
// cannot inject KV: a value without the right MAC is never a block. A reader with a secret
// refuses unkeyed frames, and one without a secret refuses keyed frames. Frames are not
// encrypted: the store sees the KV.
//
// Thread-safety: the functions are thread-safe.
#ifndef KVTIER_VALUE_FRAME_H_
#define KVTIER_VALUE_FRAME_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtier/block_key.h"
#include "kvtier/codec.h"

namespace kvtier {

inline constexpr size_t kFrameHeaderBytes = 88;
inline constexpr uint16_t kFrameVersion = 1;

// Frames `block` (block_bytes, block-contiguous) as block `key` of the namespace `ns_digest`,
// compressed with `codec`, into `*out` (replacing its contents). An empty `hmac_secret` means an
// XXH3-128 checksum. Errors: the codec's (kInvalidArgument, kInternal); kInternal if OpenSSL
// fails.
absl::Status EncodeFrame(const std::array<uint8_t, 16>& ns_digest, const BlockKey& key,
                         absl::Span<const std::byte> block, Codec codec,
                         std::string_view hmac_secret, std::vector<std::byte>* out);

// The same frame in two parts, so a transport can send them without joining them (no copy of
// the block for Codec::kNone): `*header` gets the frame's first kFrameHeaderBytes, and the
// returned span is the payload, which is `block` itself for Codec::kNone and the encoded bytes
// in `*payload_storage` otherwise (valid as long as those are). Header then payload is, byte for
// byte, what EncodeFrame writes. Errors: as EncodeFrame; kInvalidArgument for a null output.
absl::StatusOr<absl::Span<const std::byte>> EncodeFrameParts(
    const std::array<uint8_t, 16>& ns_digest, const BlockKey& key,
    absl::Span<const std::byte> block, Codec codec, std::string_view hmac_secret,
    std::array<std::byte, kFrameHeaderBytes>* header, std::vector<std::byte>* payload_storage);

// Checks every field of `frame` against what the reader expects and decodes its payload into
// `block`, which must be exactly the original size. Errors: kDataLoss naming the first field
// that is wrong (too short, magic, version, flags, namespace, key, length, checksum or MAC,
// payload that does not decode): a corrupt or foreign value, never a block. `block` must be
// ignored on error. `accept_lossy` false: a frame encoded with a lossy codec (CodecIsLossy) is
// kDataLoss too, so a reader that did not opt into one never gets approximate KV from a writer
// that did (the namespace does not include the codec). Lossless codecs are always accepted.
absl::Status DecodeFrame(absl::Span<const std::byte> frame,
                         const std::array<uint8_t, 16>& ns_digest, const BlockKey& key,
                         std::string_view hmac_secret, absl::Span<std::byte> block,
                         bool accept_lossy = true);

// DecodeFrame for a frame received in two pieces: `header` (kFrameHeaderBytes) and `payload`,
// which may be `block` itself (a payload received straight into the block: checked in place,
// and decoded from a copy if it is encoded). Errors and `accept_lossy`: as DecodeFrame.
absl::Status DecodeFrameParts(absl::Span<const std::byte> header,
                              absl::Span<const std::byte> payload,
                              const std::array<uint8_t, 16>& ns_digest, const BlockKey& key,
                              std::string_view hmac_secret, absl::Span<std::byte> block,
                              bool accept_lossy = true);

// DecodeFrameParts for a frame that arrives in pieces (a transport receiving it straight into
// the block): Header once the header has arrived, Payload with each payload piece in order while
// it is still in cache, then Finish with the whole payload (which may be `block` itself). The
// checksum is computed from the pieces, so a payload received into the block is not read again.
// Same checks, errors and `accept_lossy` as DecodeFrameParts. Not thread-safe; one frame per
// verifier.
class FrameVerifier {
 public:
  FrameVerifier(const std::array<uint8_t, 16>& ns_digest, const BlockKey& key,
                std::string_view hmac_secret, absl::Span<std::byte> block,
                bool accept_lossy = true);
  ~FrameVerifier();
  FrameVerifier(const FrameVerifier&) = delete;
  FrameVerifier& operator=(const FrameVerifier&) = delete;

  // Checks the header's fields against a payload of `payload_bytes`. Errors: kDataLoss.
  absl::Status Header(absl::Span<const std::byte> header, size_t payload_bytes);
  void Payload(absl::Span<const std::byte> piece);
  // Checks the checksum or MAC over what Payload saw (which must be all of `payload`) and
  // decodes `payload` into the block. Errors: kDataLoss; the first error of Header if it failed.
  absl::Status Finish(absl::Span<const std::byte> payload);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace kvtier

#endif  // KVTIER_VALUE_FRAME_H_
