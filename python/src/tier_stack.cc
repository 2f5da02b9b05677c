// kvtier.TierStack: BuildTierStack (tier_stack.h) from keyword arguments. The emulated HBM takes
// the namespace's HBM layout, so the pool a kernel reads is laid out as the namespace says.
#include "kvtier/tier_stack.h"

#include <pybind11/stl.h>

#include <cstdint>

#include <string>
#include <vector>

#include "bindings.h"
#include "objects.h"

namespace kvtier::python {
namespace {

// The addresses of `tensors` (torch tensors: data_ptr(), checked to hold the bytes the layout
// needs; or plain int addresses, taken on trust), one per layer or one for block_first.
std::vector<void*> RegisteredTensors(const CacheNamespace& ns, int64_t hbm_blocks,
                                     const std::vector<py::object>& tensors, bool cuda) {
  std::vector<void*> out;
  if (tensors.empty()) return out;
  const KvGeometry& g = ns.geometry();
  const bool one = ns.options().hbm_layout == HbmLayout::kBlockFirst;
  const int64_t need = hbm_blocks * (one ? g.bytes_per_block() : g.bytes_per_block_per_layer());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const py::object& t = tensors[i];
    if (py::isinstance<py::int_>(t)) {
      out.push_back(reinterpret_cast<void*>(t.cast<uintptr_t>()));
      continue;
    }
    if (!py::hasattr(t, "data_ptr") || !py::hasattr(t, "numel") ||
        !py::hasattr(t, "element_size")) {
      throw StatusError(absl::InvalidArgumentError(
          "TierStack: hbm_tensors[" + std::to_string(i) + "] is neither a tensor nor an address"));
    }
    const int64_t bytes = t.attr("numel")().cast<int64_t>() * t.attr("element_size")().cast<int64_t>();
    if (bytes < need) {
      throw StatusError(absl::InvalidArgumentError(
          "TierStack: hbm_tensors[" + std::to_string(i) + "] holds " + std::to_string(bytes) +
          " bytes; the layout needs " + std::to_string(need)));
    }
    // The emulated HBM copies with memcpy, so its tensors must be in host memory; CudaHbm's on
    // the GPU. A tensor on the other side would be dereferenced on the wrong device.
    if (py::hasattr(t, "is_cuda") && t.attr("is_cuda").cast<bool>() != cuda) {
      throw StatusError(absl::InvalidArgumentError(
          "TierStack: hbm_tensors[" + std::to_string(i) + "] is " +
          (cuda ? "not a CUDA tensor; hbm_backend='cuda' needs GPU memory"
                : "a CUDA tensor; hbm_backend='emulated' needs host memory")));
    }
    if (py::hasattr(t, "is_contiguous") && !t.attr("is_contiguous")().cast<bool>()) {
      throw StatusError(absl::InvalidArgumentError(
          "TierStack: hbm_tensors[" + std::to_string(i) + "] is not contiguous"));
    }
    out.push_back(reinterpret_cast<void*>(t.attr("data_ptr")().cast<uintptr_t>()));
  }
  return out;
}

}  // namespace

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
                       std::string remote_key_prefix, const std::string& hbm_backend,
                       int cuda_device, const std::vector<py::object>& hbm_tensors) {
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
             PyTierStack stack{ns.geometry(), ns.options().hbm_layout, {}, false, {}};
             if (hbm_backend == "cuda") {
               o.hbm_backend = HbmBackend::kCuda;
             } else if (hbm_backend != "emulated") {
               throw StatusError(absl::InvalidArgumentError(
                   "TierStack: hbm_backend must be 'emulated' or 'cuda', got '" + hbm_backend +
                   "'"));
             }
             o.cuda_hbm.device = cuda_device;
             o.hbm.external_pool =
                 RegisteredTensors(ns, hbm_blocks, hbm_tensors, o.hbm_backend == HbmBackend::kCuda);
             o.cuda_hbm.external_pool = o.hbm.external_pool;
             {
               py::gil_scoped_release unlocked;
               stack.tiers = Unwrap(BuildTierStack(ns, o));
             }
             stack.keep_alive = hbm_tensors;
             return stack;
           }),
           py::arg("namespace"), py::kw_only(), py::arg("hbm_blocks"), py::arg("dram_blocks") = 0,
           py::arg("nvme_blocks") = 0, py::arg("remote_blocks") = 0, py::arg("nvme_path") = "",
           py::arg("remote_directory") = "", py::arg("remote_url") = "",
           py::arg("metadata_tiers") = std::vector<Tier>{},
           py::arg("check_available_memory") = true, py::arg("remote_key_prefix") = "kvtier:",
           py::arg("hbm_backend") = "emulated", py::arg("cuda_device") = 0,
           py::arg("hbm_tensors") = std::vector<py::object>{},
           "hbm_backend='cuda' puts a CudaHbm on device cuda_device (UnavailableError without a "
           "GPU, UnimplementedError in a build without CUDA). hbm_tensors registers the engine's "
           "own KV tensors (torch tensors, or int addresses) as the HBM pool, one per layer (one "
           "for block_first) in the namespace's layout, host memory for 'emulated' and device "
           "memory for 'cuda'; the cache keeps them alive.")
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
