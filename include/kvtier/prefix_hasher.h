// PrefixHasher: computes the chained block keys of a token sequence (DESIGN section 4).
//
//   key(block i) = H(namespace digest, key(block i-1) or kRootBlockKey, extras(i), tokens(i))
//
// Extras are typed and length-prefixed (tag byte, u32 length, bytes), so no value of one field can
// ever encode another: an adapter named "S" never meets a tenant salt "S" (case ID-2), a reloaded
// adapter (new load generation) never meets its old KV (ID-1), and multimodal digests enter in
// full, never truncated (ID-3). Only full blocks get keys; trailing tokens that do not fill a block
// are ignored. The exact bytes hashed are documented in docs/formats.md ("Block key") and pinned
// by golden-vector tests: changing them needs a kKeySchemaVersion bump.
//
// H is XXH3-128 (xxHash, the default: fast, not collision-resistant against an adversary) or
// SHA-256 truncated to 128 bits (OpenSSL; for keys that cross trust boundaries, as vLLM's
// `sha256` prefix-caching hash does).
//
// Thread-safety: immutable after creation; every method is const and safe to call concurrently.
#ifndef KVTIER_PREFIX_HASHER_H_
#define KVTIER_PREFIX_HASHER_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtier/block_key.h"
#include "kvtier/cache_namespace.h"

namespace kvtier {

enum class HashAlgorithm : uint8_t {
  kXxh3_128 = 0,
  kSha256 = 1,
};

// "xxh3_128" or "sha256"; "unknown" otherwise.
std::string_view HashAlgorithmName(HashAlgorithm algorithm);

// A LoRA (or other) adapter applied to the request. The load generation must change whenever
// the adapter's weights change under the same id (reload, hot swap), so stale KV never hits.
struct AdapterIdentity {
  std::string id;                // non-empty, at most kMaxExtraBytes
  uint64_t load_generation = 0;  // chosen by the engine; any value, compared exactly
};

// One multimodal item (image, audio clip) whose placeholder tokens occupy the absolute token
// positions [start_token, start_token + num_tokens). Every block overlapping that range carries
// the item's full digest, so equal placeholder tokens with different content never share KV.
struct MultimodalItem {
  int64_t start_token = 0;  // >= 0
  int64_t num_tokens = 0;   // >= 1
  std::string digest;       // the item's content digest, 1 to kMaxDigestBytes raw bytes
};

// Everything besides the namespace and the tokens that changes a block's KV.
struct BlockExtras {
  std::optional<AdapterIdentity> adapter;
  std::optional<std::string> tenant_salt;  // at most kMaxExtraBytes; an empty salt is a salt
  std::vector<MultimodalItem> multimodal;  // sorted by start_token, not overlapping
};

class PrefixHasher {
 public:
  static constexpr size_t kMaxExtraBytes = 1024;
  static constexpr size_t kMaxDigestBytes = 64;
  // Token positions are below 2^48: far beyond any context, and block arithmetic cannot overflow.
  static constexpr int64_t kMaxPosition = int64_t{1} << 48;

  // Errors: kInvalidArgument for an unknown algorithm; kInternal if OpenSSL lacks SHA-256.
  static absl::StatusOr<PrefixHasher> Create(const CacheNamespace& ns,
                                             HashAlgorithm algorithm = HashAlgorithm::kXxh3_128);

  // Appends to `*keys` the key of every full block of `tokens` (floor(tokens.size() / B) keys,
  // B = tokens_per_block). tokens[0] is at absolute position `first_position`, a multiple of B;
  // `parent` is the key of the block before it: kRootBlockKey exactly when first_position == 0.
  // It is taken by value, so `keys->back()` may be passed while `*keys` grows.
  // This continues a chain without rehashing its start (e.g. while decode fills blocks).
  // Errors (nothing is appended on error): kInvalidArgument for a null `keys`, a negative or
  // unaligned first_position, first_position + tokens.size() > kMaxPosition, a parent
  // inconsistent with first_position, or invalid extras (an empty or over-long adapter id, an
  // over-long salt, an item with start < 0, num_tokens < 1, a digest of 0 or more than
  // kMaxDigestBytes bytes, items unsorted or overlapping); kInternal if SHA-256 fails inside
  // OpenSSL.
  absl::Status AppendBlockKeys(BlockKey parent, int64_t first_position,
                               absl::Span<const int32_t> tokens, const BlockExtras& extras,
                               std::vector<BlockKey>* keys) const;

  // The keys of every full block of a sequence that starts at position 0. Errors as above.
  absl::StatusOr<std::vector<BlockKey>> BlockKeys(absl::Span<const int32_t> tokens,
                                                  const BlockExtras& extras = {}) const;

  HashAlgorithm algorithm() const { return algorithm_; }
  int tokens_per_block() const { return tokens_per_block_; }
  const std::array<uint8_t, 16>& namespace_digest() const { return namespace_digest_; }

 private:
  PrefixHasher(const std::array<uint8_t, 16>& namespace_digest, int tokens_per_block,
               HashAlgorithm algorithm)
      : namespace_digest_(namespace_digest),
        tokens_per_block_(tokens_per_block),
        algorithm_(algorithm) {}

  std::array<uint8_t, 16> namespace_digest_;
  int tokens_per_block_;
  HashAlgorithm algorithm_;
};

}  // namespace kvtier

#endif  // KVTIER_PREFIX_HASHER_H_
