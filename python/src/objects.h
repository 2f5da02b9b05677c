// The Python-side objects that own C++ state, shared by the binders: a built tier stack waiting
// for its cache, a cache, its HBM pool view and a residency ticket. Each holds the KvCache by
// shared_ptr where it needs it alive: the HBM pool's memory belongs to the cache's HBM tier, so a
// pool (and every numpy array or torch tensor viewing it, through the array's base object) keeps
// the cache alive; so does a ticket, whose release needs the cache.
#ifndef KVTIER_PYTHON_SRC_OBJECTS_H_
#define KVTIER_PYTHON_SRC_OBJECTS_H_

#include <memory>
#include <optional>
#include <string>

#include "kvtier/cache_namespace.h"
#include "kvtier/device_block_table.h"
#include "kvtier/hbm_layout.h"
#include "kvtier/kv_cache.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/tier_stack.h"

namespace kvtier::python {

// kvtier.TierStack: BuildTierStack's backends until KvCache.create takes them (consumed after).
struct PyTierStack {
  KvGeometry geometry;
  HbmLayout hbm_layout = HbmLayout::kLayerFirst;
  TierBackends tiers;
  bool consumed = false;
  // The engine's tensors registered as the HBM pool (hbm_tensors): kept alive by the cache made
  // over this stack.
  std::vector<py::object> keep_alive;
};

// The HBM pool of a cache (the emulated HBM in host memory, or CUDA memory: view.host_accessible
// tells): its base, its shape, and the cache that owns the memory.
struct PyHbmPool {
  std::shared_ptr<KvCache> cache;
  KvGeometry geometry;
  HbmLayout layout = HbmLayout::kLayerFirst;
  int64_t num_blocks = 0;
  DevicePoolView view;
};

// kvtier.KvCache.
struct PyKvCache {
  std::shared_ptr<KvCache> cache;
  // Set when the HBM tier reported a device pool with addresses at creation.
  std::optional<PyHbmPool> pool;
};

// kvtier.ResidencyTicket: the ticket, and the cache that releases it.
// A CacheEvent with its own copies of the strings, which in a CacheEvent are views into the
// cache (valid while it lives): a Python event may outlive its cache.
struct PyCacheEvent {
  CacheEvent event;
  std::string adapter_id;
  std::string worker_id;
};

struct PyTicket {
  ResidencyTicket ticket;
  std::shared_ptr<KvCache> cache;
  bool released = false;
};

}  // namespace kvtier::python

#endif  // KVTIER_PYTHON_SRC_OBJECTS_H_
