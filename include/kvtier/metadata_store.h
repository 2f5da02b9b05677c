// MetadataStore: a fleet-wide store that holds block keys and no bytes, shared by the metadata
// remote tiers (metadata_tier.h) of several caches, so that a metadata-only fleet (the replay's
// serving simulation, capacity planning) finds what another worker stored, as a fleet over one
// Redis or shared directory does through RemoteTier's discovery. It is to RemoteTier's store what
// MetadataTier is to a byte-holding tier: the same keys come and go, no KV is kept.
//
// Semantics, those of a RemoteTier store with write_if_absent and delete_freed (remote_tier.h):
// a write of a key the store already holds is skipped (content-addressed: it is that block); a
// worker that evicts a block it stored itself deletes it from the store, so a block another
// worker found by discovery may be gone when it is read (a miss for that reader, as with a real
// store). The store has no capacity of its own: each worker's remote tier bounds what it stores.
//
// Keys: block keys already chain the namespace digest (prefix_hasher.h), so caches of different
// models, adapters or tenants sharing one store never see each other's blocks.
//
// Cost: about 40 bytes of host memory a stored key (a hash-set entry).
// Thread-safety: every member is thread-safe (one lock). Ownership: shared (std::shared_ptr)
// among the tiers that use it and the caller; it lives while any of them holds it.
#ifndef KVTIER_METADATA_STORE_H_
#define KVTIER_METADATA_STORE_H_

#include <cstdint>
#include <memory>

#include "kvtier/block_key.h"

namespace kvtier {

// What a store has done since it was made, for reports and tests.
struct MetadataStoreStats {
  int64_t keys = 0;        // keys held now
  int64_t stored = 0;      // Store calls that added a key
  int64_t skipped = 0;     // Store calls for a key already held (another writer's block)
  int64_t erased = 0;      // Erase calls that removed a key
  int64_t probes = 0;      // Contains calls
  int64_t probe_hits = 0;  // of which found the key
};

class MetadataStore {
 public:
  MetadataStore();
  ~MetadataStore();
  MetadataStore(const MetadataStore&) = delete;
  MetadataStore& operator=(const MetadataStore&) = delete;

  // Adds `key`. Returns true if it was not held (this caller stored it), false if it was.
  bool Store(const BlockKey& key);
  // Whether `key` is held. Counted in probes / probe_hits.
  bool Contains(const BlockKey& key) const;
  // Removes `key`. Returns true if it was held.
  bool Erase(const BlockKey& key);
  MetadataStoreStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier

#endif  // KVTIER_METADATA_STORE_H_
