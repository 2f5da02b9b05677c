// kvtier.TierStack: BuildTierStack (tier_stack.h) from keyword arguments. The emulated HBM takes
// the namespace's HBM layout, so the pool a kernel reads is laid out as the namespace says.
#include "kvtier/tier_stack.h"

#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "objects.h"

namespace kvtier::python {

void BindTierStack(py::module_& m) {
  py::class_<PyTierStack>(
      m, "TierStack",
      "The tier backends BuildTierStack makes (tier_stack.h): an emulated HBM in host memory, "
      "DRAM, NVMe on a file, a remote store over a directory or a Redis URL. A tier with 0 "
      "blocks is absent. KvCache.create takes the backends; the stack is empty afterwards.")
      .def(py::init([](const CacheNamespace& ns, int64_t hbm_blocks, int64_t dram_blocks,
                       int64_t nvme_blocks, int64_t remote_blocks, std::string nvme_path,
                       std::string remote_directory, std::string remote_url,
                       const std::vector<Tier>& metadata_tiers, bool check_available_memory,
                       std::string remote_key_prefix) {
             TierStackOptions o;
             o.tiers[TierIndex(Tier::kHbm)].capacity_blocks = hbm_blocks;
             o.tiers[TierIndex(Tier::kDram)].capacity_blocks = dram_blocks;
             o.tiers[TierIndex(Tier::kNvme)].capacity_blocks = nvme_blocks;
             o.tiers[TierIndex(Tier::kRemote)].capacity_blocks = remote_blocks;
             for (Tier t : metadata_tiers) o.tiers[TierIndex(t)].kind = TierBackendKind::kMetadata;
             o.hbm.layout = ns.options().hbm_layout;
             o.hbm.check_available_memory = check_available_memory;
             o.dram.check_available_memory = check_available_memory;
             o.nvme.path = std::move(nvme_path);
             o.remote.key_prefix = std::move(remote_key_prefix);
             o.remote_directory = std::move(remote_directory);
             o.remote_url = std::move(remote_url);
             PyTierStack stack{ns.geometry(), ns.options().hbm_layout, {}, false};
             {
               py::gil_scoped_release unlocked;
               stack.tiers = Unwrap(BuildTierStack(ns, o));
             }
             return stack;
           }),
           py::arg("namespace"), py::kw_only(), py::arg("hbm_blocks"), py::arg("dram_blocks") = 0,
           py::arg("nvme_blocks") = 0, py::arg("remote_blocks") = 0, py::arg("nvme_path") = "",
           py::arg("remote_directory") = "", py::arg("remote_url") = "",
           py::arg("metadata_tiers") = std::vector<Tier>{},
           py::arg("check_available_memory") = true, py::arg("remote_key_prefix") = "kvtier:")
      .def_property_readonly("consumed", [](const PyTierStack& s) { return s.consumed; })
      .def(
          "capacity_blocks",
          [](const PyTierStack& s, Tier t) -> int64_t {
            const auto& b = s.tiers[static_cast<size_t>(TierIndex(t))];
            return b == nullptr ? 0 : b->info().capacity_blocks;
          },
          py::arg("tier"), "Slots of a tier (0 if absent or already taken by a cache).")
      .def(
          "backend_name",
          [](const PyTierStack& s, Tier t) -> std::string {
            const auto& b = s.tiers[static_cast<size_t>(TierIndex(t))];
            return b == nullptr ? "" : b->info().name;
          },
          py::arg("tier"), "The backend's name, e.g. 'emulated_hbm(layer_first)'; '' if absent.");
}

}  // namespace kvtier::python
