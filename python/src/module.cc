// The extension module kvtier._kvtier; python/kvtier/__init__.py re-exports it as `kvtier`.
#include "bindings.h"

PYBIND11_MODULE(_kvtier, m) {
  m.doc() = "kvtier: a tiered KV-cache block manager (the C++ API of include/kvtier/).";
  namespace kp = kvtier::python;
  kp::BindErrors(m);
  kp::BindGeometry(m);
  kp::BindTierStack(m);
  kp::BindResults(m);
  kp::BindCompletion(m);
  kp::BindHbmPool(m);
  kp::BindKvCache(m);
}
