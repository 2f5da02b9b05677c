// Value frames (value_frame.h): the remote value layout, written and verified.
#include "kvtier/value_frame.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/byte_writer.h"
#include "internal/status_macros.h"
#include "internal/strings.h"
#include "internal/xxh3_update.h"

namespace kvtier {
namespace {

constexpr uint32_t kMagic = 0x5254564b;  // bytes "KVTR"
constexpr size_t kChecksumOffset = 56;
constexpr size_t kChecksumBytes = 32;
constexpr uint8_t kFlagKeyed = 0x01;

uint64_t LoadLe(const std::byte* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// The checksum field's value, computed incrementally over the header's first kChecksumOffset
// bytes and then the payload: XXH3-128, or HMAC-SHA256 with a secret.
class FrameDigest {
 public:
  explicit FrameDigest(std::string_view secret) {
    if (secret.empty()) {
      XXH3_128bits_reset(&xxh_);
      avx2_ = internal::Xxh3Avx2Usable();
      return;
    }
    keyed_ = true;  // what the caller asked for, whether OpenSSL provides it or not
    mac_ = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    ctx_ = mac_ != nullptr ? EVP_MAC_CTX_new(mac_) : nullptr;
    char digest[] = "SHA256";
    const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                                 OSSL_PARAM_construct_end()};
    ok_ =
        ctx_ != nullptr && EVP_MAC_init(ctx_, reinterpret_cast<const unsigned char*>(secret.data()),
                                        secret.size(), params) == 1;
  }
  ~FrameDigest() {
    EVP_MAC_CTX_free(ctx_);
    EVP_MAC_free(mac_);
  }
  FrameDigest(const FrameDigest&) = delete;
  FrameDigest& operator=(const FrameDigest&) = delete;

  void Update(const std::byte* data, size_t n) {
    if (n == 0) return;
    if (!keyed_) {
      internal::Xxh3_128Update(&xxh_, data, n, avx2_);
    } else {
      ok_ = ok_ && EVP_MAC_update(ctx_, reinterpret_cast<const unsigned char*>(data), n) == 1;
    }
  }
  absl::Status Final(std::array<std::byte, kChecksumBytes>* out) {
    out->fill(std::byte{0});
    if (!keyed_) {
      const XXH128_hash_t h = XXH3_128bits_digest(&xxh_);
      internal::StoreU64Be(reinterpret_cast<uint8_t*>(out->data()), h.high64);
      internal::StoreU64Be(reinterpret_cast<uint8_t*>(out->data()) + 8, h.low64);
      return absl::OkStatus();
    }
    size_t len = 0;
    ok_ = ok_ &&
          EVP_MAC_final(ctx_, reinterpret_cast<unsigned char*>(out->data()), &len, out->size()) ==
              1 &&
          len == kChecksumBytes;
    return ok_ ? absl::OkStatus() : absl::InternalError("OpenSSL: HMAC-SHA256 failed");
  }

 private:
  // Keyed by the secret, not by whether OpenSSL's HMAC loaded: a missing HMAC (a restricted
  // provider configuration) must fail the frame, not fall back to an XXH3 state never reset.
  bool keyed_ = false;
  XXH3_state_t xxh_;
  bool avx2_ = false;
  EVP_MAC* mac_ = nullptr;
  EVP_MAC_CTX* ctx_ = nullptr;
  bool ok_ = true;
};

// Copy and digest together, a cache-sized piece at a time: the digest reads what was just
// written while it is still in cache, so the payload crosses memory once, as a plain copy does.
constexpr size_t kCopyChunk = 64 * 1024;

absl::Status Corrupt(const BlockKey& key, std::string_view why) {
  return absl::DataLossError(absl::StrCat("remote value for block ", key.ToHex(), ": ",
                                          absl::string_view(why.data(), why.size())));
}

}  // namespace

absl::StatusOr<absl::Span<const std::byte>> EncodeFrameParts(
    const std::array<uint8_t, 16>& ns_digest, const BlockKey& key,
    absl::Span<const std::byte> block, Codec codec, std::string_view hmac_secret,
    std::array<std::byte, kFrameHeaderBytes>* header, std::vector<std::byte>* payload_storage) {
  if (header == nullptr || payload_storage == nullptr) {
    return absl::InvalidArgumentError("EncodeFrameParts: null output");
  }
  absl::Span<const std::byte> payload = block;  // codec none: the block itself, no copy
  if (codec != Codec::kNone) {
    KVTIER_RETURN_IF_ERROR(Compress(codec, block, payload_storage));
    payload = *payload_storage;
  }
  std::vector<uint8_t> fields;
  internal::ByteWriter w(&fields);
  w.U32(kMagic);
  w.U8(static_cast<uint8_t>(kFrameVersion));
  w.U8(static_cast<uint8_t>(kFrameVersion >> 8));
  w.U8(static_cast<uint8_t>(codec));
  w.U8(hmac_secret.empty() ? 0 : kFlagKeyed);
  w.Bytes(ns_digest.data(), ns_digest.size());
  const std::array<uint8_t, 16> key_bytes = key.ToBytes();
  w.Bytes(key_bytes.data(), key_bytes.size());
  w.U64(block.size());
  w.U64(payload.size());
  std::memcpy(header->data(), fields.data(), kChecksumOffset);
  FrameDigest digest(hmac_secret);
  digest.Update(header->data(), kChecksumOffset);
  digest.Update(payload.data(), payload.size());
  std::array<std::byte, kChecksumBytes> sum;
  KVTIER_RETURN_IF_ERROR(digest.Final(&sum));
  std::memcpy(header->data() + kChecksumOffset, sum.data(), sum.size());
  return payload;
}

absl::Status EncodeFrame(const std::array<uint8_t, 16>& ns_digest, const BlockKey& key,
                         absl::Span<const std::byte> block, Codec codec,
                         std::string_view hmac_secret, std::vector<std::byte>* out) {
  if (out == nullptr) return absl::InvalidArgumentError("EncodeFrame: out is null");
  std::array<std::byte, kFrameHeaderBytes> header;
  std::vector<std::byte> storage;
  KVTIER_ASSIGN_OR_RETURN(
      absl::Span<const std::byte> payload,
      EncodeFrameParts(ns_digest, key, block, codec, hmac_secret, &header, &storage));
  out->resize(kFrameHeaderBytes + payload.size());
  std::memcpy(out->data(), header.data(), header.size());
  if (!payload.empty())
    std::memcpy(out->data() + kFrameHeaderBytes, payload.data(), payload.size());
  return absl::OkStatus();
}

absl::Status DecodeFrame(absl::Span<const std::byte> frame,
                         const std::array<uint8_t, 16>& ns_digest, const BlockKey& key,
                         std::string_view hmac_secret, absl::Span<std::byte> block,
                         bool accept_lossy) {
  if (frame.size() < kFrameHeaderBytes) {
    return Corrupt(key, absl::StrCat(frame.size(), " bytes, shorter than a frame header"));
  }
  return DecodeFrameParts(frame.first(kFrameHeaderBytes), frame.subspan(kFrameHeaderBytes),
                          ns_digest, key, hmac_secret, block, accept_lossy);
}

namespace {

// Every field of a frame header against what the reader expects; the codec and whether it is
// keyed come back for the rest of the check.
absl::Status CheckHeader(absl::Span<const std::byte> header, size_t payload_size,
                         const std::array<uint8_t, 16>& ns_digest, const BlockKey& key,
                         std::string_view hmac_secret, size_t block_size, bool accept_lossy,
                         Codec* codec, bool* keyed_out) {
  if (header.size() != kFrameHeaderBytes) {
    return Corrupt(key, absl::StrCat("a header of ", header.size(), " bytes"));
  }
  const std::byte* h = header.data();
  if (LoadLe(h, 4) != kMagic) return Corrupt(key, "bad magic");
  if (LoadLe(h + 4, 2) != kFrameVersion) {
    return Corrupt(key, absl::StrCat("unsupported frame version ", LoadLe(h + 4, 2)));
  }
  *codec = static_cast<Codec>(h[6]);
  if (!accept_lossy && CodecIsLossy(*codec)) {
    return Corrupt(
        key, absl::StrCat("encoded with the lossy codec ", internal::ToAbsl(CodecName(*codec)),
                          ", which this reader did not opt into"));
  }
  if ((static_cast<uint8_t>(h[7]) & ~kFlagKeyed) != 0) {
    return Corrupt(key, absl::StrCat("unknown flags ", static_cast<int>(h[7])));
  }
  const bool keyed = (static_cast<uint8_t>(h[7]) & kFlagKeyed) != 0;
  *keyed_out = keyed;
  if (keyed != !hmac_secret.empty()) {
    return Corrupt(key, keyed ? "a keyed (HMAC) frame, and this reader has no secret"
                              : "an unkeyed frame, and this reader requires an HMAC");
  }
  if (std::memcmp(h + 8, ns_digest.data(), ns_digest.size()) != 0) {
    return Corrupt(key, "written under another namespace");
  }
  const std::array<uint8_t, 16> key_bytes = key.ToBytes();
  if (std::memcmp(h + 24, key_bytes.data(), key_bytes.size()) != 0) {
    return Corrupt(key, "holds another block key");
  }
  const uint64_t raw_bytes = LoadLe(h + 40, 8);
  const uint64_t payload_bytes = LoadLe(h + 48, 8);
  if (raw_bytes != block_size) {
    return Corrupt(key, absl::StrCat("a block of ", raw_bytes, " bytes, expected ", block_size));
  }
  if (payload_bytes != payload_size) {
    return Corrupt(
        key, absl::StrCat("payload of ", payload_size, " bytes, header says ", payload_bytes));
  }
  return absl::OkStatus();
}

// The payload, checked, into `block`: nothing to do for codec none received in place, a copy
// for codec none elsewhere, else a decode (from a copy if the payload sits in `block`).
absl::Status DecodeChecked(Codec codec, absl::Span<const std::byte> payload, const BlockKey& key,
                           absl::Span<std::byte> block) {
  const bool in_place = payload.data() == block.data();
  if (codec == Codec::kNone && payload.size() == block.size()) {
    if (!in_place && !payload.empty()) std::memcpy(block.data(), payload.data(), payload.size());
    return absl::OkStatus();
  }
  std::vector<std::byte> copy;
  if (in_place) copy.assign(payload.begin(), payload.end());
  if (absl::Status s =
          Decompress(codec, in_place ? absl::Span<const std::byte>(copy) : payload, block);
      !s.ok()) {
    return Corrupt(key, absl::StrCat("payload does not decode: ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeFrameParts(absl::Span<const std::byte> header,
                              absl::Span<const std::byte> payload,
                              const std::array<uint8_t, 16>& ns_digest, const BlockKey& key,
                              std::string_view hmac_secret, absl::Span<std::byte> block,
                              bool accept_lossy) {
  FrameVerifier verifier(ns_digest, key, hmac_secret, block, accept_lossy);
  KVTIER_RETURN_IF_ERROR(verifier.Header(header, payload.size()));
  // Codec none from another buffer: copy and check in one pass, a cache-sized piece at a time,
  // so the digest reads what was just written; the block then is the payload. A mismatch
  // leaves `block` written; callers ignore it on error, as the contract says.
  if (static_cast<Codec>(header[6]) == Codec::kNone && payload.size() == block.size() &&
      payload.data() != block.data()) {
    for (size_t at = 0; at < payload.size(); at += kCopyChunk) {
      const size_t n = std::min(kCopyChunk, payload.size() - at);
      std::memcpy(block.data() + at, payload.data() + at, n);
      verifier.Payload(block.subspan(at, n));
    }
    return verifier.Finish(block);
  }
  verifier.Payload(payload);
  return verifier.Finish(payload);
}

struct FrameVerifier::State {
  State(const std::array<uint8_t, 16>& n, const BlockKey& k, std::string_view secret,
        absl::Span<std::byte> b, bool lossy)
      : ns_digest(n), key(k), hmac_secret(secret), block(b), accept_lossy(lossy), digest(secret) {}
  std::array<uint8_t, 16> ns_digest;
  BlockKey key;
  std::string hmac_secret;
  absl::Span<std::byte> block;
  bool accept_lossy;
  FrameDigest digest;
  std::array<std::byte, kFrameHeaderBytes> header{};
  absl::Status header_status = absl::DataLossError("no frame header");
  Codec codec = Codec::kNone;
  bool keyed = false;
  size_t seen = 0;
};

FrameVerifier::FrameVerifier(const std::array<uint8_t, 16>& ns_digest, const BlockKey& key,
                             std::string_view hmac_secret, absl::Span<std::byte> block,
                             bool accept_lossy)
    : state_(std::make_unique<State>(ns_digest, key, hmac_secret, block, accept_lossy)) {}
FrameVerifier::~FrameVerifier() = default;

absl::Status FrameVerifier::Header(absl::Span<const std::byte> header, size_t payload_bytes) {
  State& s = *state_;
  s.header_status = CheckHeader(header, payload_bytes, s.ns_digest, s.key, s.hmac_secret,
                                s.block.size(), s.accept_lossy, &s.codec, &s.keyed);
  if (s.header_status.ok()) {
    std::memcpy(s.header.data(), header.data(), kFrameHeaderBytes);
    s.digest.Update(s.header.data(), kChecksumOffset);
  }
  return s.header_status;
}

void FrameVerifier::Payload(absl::Span<const std::byte> piece) {
  State& s = *state_;
  if (!s.header_status.ok()) return;
  s.digest.Update(piece.data(), piece.size());
  s.seen += piece.size();
}

absl::Status FrameVerifier::Finish(absl::Span<const std::byte> payload) {
  State& s = *state_;
  KVTIER_RETURN_IF_ERROR(s.header_status);
  if (s.seen != payload.size()) {
    return Corrupt(s.key, absl::StrCat("checked ", s.seen, " payload bytes of ", payload.size()));
  }
  std::array<std::byte, kChecksumBytes> want;
  KVTIER_RETURN_IF_ERROR(s.digest.Final(&want));
  if (CRYPTO_memcmp(s.header.data() + kChecksumOffset, want.data(), want.size()) != 0) {
    return Corrupt(s.key, s.keyed ? "HMAC mismatch" : "checksum mismatch");
  }
  return DecodeChecked(s.codec, payload, s.key, s.block);
}

}  // namespace kvtier
