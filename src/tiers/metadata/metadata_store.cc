// MetadataStore (metadata_store.h): a lock and a hash set of block keys.
#include "kvtier/metadata_store.h"

#include "absl/container/flat_hash_set.h"
#include "internal/mutex.h"

namespace kvtier {

struct MetadataStore::Impl {
  mutable internal::Mutex mu;
  absl::flat_hash_set<BlockKey> keys ABSL_GUARDED_BY(mu);
  MetadataStoreStats counts ABSL_GUARDED_BY(mu);  // every field but `keys`
};

MetadataStore::MetadataStore() : impl_(std::make_unique<Impl>()) {}
MetadataStore::~MetadataStore() = default;

bool MetadataStore::Store(const BlockKey& key) {
  internal::MutexLock lock(&impl_->mu);
  const bool added = impl_->keys.insert(key).second;
  ++(added ? impl_->counts.stored : impl_->counts.skipped);
  return added;
}

bool MetadataStore::Contains(const BlockKey& key) const {
  internal::MutexLock lock(&impl_->mu);
  const bool found = impl_->keys.contains(key);
  ++impl_->counts.probes;
  if (found) ++impl_->counts.probe_hits;
  return found;
}

bool MetadataStore::Erase(const BlockKey& key) {
  internal::MutexLock lock(&impl_->mu);
  const bool erased = impl_->keys.erase(key) > 0;
  if (erased) ++impl_->counts.erased;
  return erased;
}

MetadataStoreStats MetadataStore::stats() const {
  internal::MutexLock lock(&impl_->mu);
  MetadataStoreStats s = impl_->counts;
  s.keys = static_cast<int64_t>(impl_->keys.size());
  return s;
}

}  // namespace kvtier
