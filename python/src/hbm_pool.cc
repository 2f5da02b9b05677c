// kvtier.HbmPool: the emulated HBM pool as writable memory Python can view without a copy: the
// buffer protocol (one flat run of bytes, memoryview / torch.frombuffer), and numpy views with
// the pool's shape (torch.from_numpy). Every view keeps the pool object, and through it the
// cache that owns the memory, alive.
//
// Shapes (elements; P = kv_planes (2: K then V; 1 for MLA), B = tokens_per_block, H = KV heads,
// D = head_dim; for MLA H = 1 and D = kv_lora_rank + qk_rope_head_dim):
//   array():  layer_first    [num_layers][num_blocks][P][B][H][D]
//             block_first    [num_blocks][num_layers][P][B][H][D]
//             layer_kv_split [num_layers][P][num_blocks][B][H][D] (vLLM FlashAttention)
//   layer(l): [num_blocks][P][B][H][D] in every layout (strided for block_first and
//             layer_kv_split)
//   k(l), v(l): layer(l)[:, 0] and layer(l)[:, 1]: [num_blocks][B][H][D]
// Element type: float16 for fp16; uint16 holding the bits for bf16 (numpy has no bfloat16:
// torch.from_numpy(a).view(torch.bfloat16)); uint8 for the fp8 formats.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bindings.h"
#include "kvtier/device_block_table.h"
#include "objects.h"

namespace kvtier::python {
namespace {

py::dtype ElementDtype(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFp16:
      return py::dtype("e");
    case KvDtype::kBf16:
      return py::dtype("H");
    case KvDtype::kFp8E4m3:
    case KvDtype::kFp8E5m2:
      return py::dtype("B");
  }
  throw StatusError(absl::InternalError("HbmPool: unknown KV dtype"));
}

// Heads and elements per head of one token of one plane.
int64_t Heads(const KvGeometry& g) {
  return g.attention() == AttentionKind::kMla ? 1 : g.num_kv_heads();
}
int64_t HeadDim(const KvGeometry& g) {
  return g.attention() == AttentionKind::kMla ? g.kv_lora_rank() + g.qk_rope_head_dim()
                                              : g.head_dim();
}

std::byte* Base(const PyHbmPool& p) { return static_cast<std::byte*>(p.view.k_base[0]); }

// The views that dereference the pool on the CPU need host memory (the emulated HBM).
const PyHbmPool& HostPool(const PyHbmPool& p) {
  if (!p.view.host_accessible) {
    throw StatusError(absl::FailedPreconditionError(
        "HbmPool: the pool is CUDA memory; use cuda_array_interface() or tensor()"));
  }
  return p;
}

// numpy's typestr of an element (the __cuda_array_interface__ field).
std::string TypeStr(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFp16:
      return "<f2";
    case KvDtype::kBf16:
      return "<i2";  // bf16 bits, as torch views them (no uint16 there)
    case KvDtype::kFp8E4m3:
    case KvDtype::kFp8E5m2:
      return "|u1";
  }
  return "|u1";
}
int64_t TotalBytes(const PyHbmPool& p) { return p.num_blocks * p.geometry.bytes_per_block(); }

// Whether the pool is one region of TotalBytes from Base, its layers where its layout puts
// them. Not so for an engine's per-layer tensors (TierStack hbm_tensors, one per layer): each
// layer is its own allocation, so only the per-layer views may touch them.
bool OneRegion(const PyHbmPool& p) {
  if (p.layout == HbmLayout::kBlockFirst) return true;  // one pointer, registered or not
  const int64_t layer_bytes = p.num_blocks * p.geometry.bytes_per_block_per_layer();
  for (int l = 0; l < p.geometry.num_layers(); ++l) {
    if (static_cast<const std::byte*>(p.view.k_base[static_cast<size_t>(l)]) - Base(p) !=
        l * layer_bytes) {
      return false;
    }
  }
  return true;
}
const PyHbmPool& WholePool(const PyHbmPool& p) {
  if (!OneRegion(p)) {
    throw StatusError(absl::FailedPreconditionError(
        "HbmPool: the pool is one tensor per layer (hbm_tensors); use layer(l), k(l), v(l)"));
  }
  return p;
}

// Shape and byte strides of layer(l)'s view.
void LayerShape(const PyHbmPool& p, std::vector<py::ssize_t>& shape,
                std::vector<py::ssize_t>& strides) {
  const KvGeometry& g = p.geometry;
  const int64_t e = KvDtypeBytes(g.dtype());
  shape = {p.num_blocks, g.kv_planes(), g.tokens_per_block(), Heads(g), HeadDim(g)};
  // From K to V of one slot: inside the block, or a whole K plane further (kv-split).
  const int64_t plane_stride =
      p.view.v_base.empty()
          ? g.bytes_per_block_per_layer()
          : static_cast<const std::byte*>(p.view.v_base[0]) -
                static_cast<const std::byte*>(p.view.k_base[0]);
  strides = {p.view.block_stride_bytes, plane_stride, p.view.token_stride_bytes, HeadDim(g) * e,
             e};
}

int CheckLayer(const PyHbmPool& p, int layer) {
  if (layer < 0 || layer >= p.geometry.num_layers()) {
    throw StatusError(absl::OutOfRangeError("HbmPool: layer " + std::to_string(layer) +
                                            " outside [0, " +
                                            std::to_string(p.geometry.num_layers()) + ")"));
  }
  return layer;
}

py::array LayerView(const py::object& self, int layer) {
  const auto& p = HostPool(self.cast<const PyHbmPool&>());
  std::vector<py::ssize_t> shape;
  std::vector<py::ssize_t> strides;
  LayerShape(p, shape, strides);
  return py::array(ElementDtype(p.geometry.dtype()), shape, strides,
                   p.view.k_base[static_cast<size_t>(CheckLayer(p, layer))], self);
}

py::array PlaneView(const py::object& self, int layer, int plane) {
  const auto& p = HostPool(self.cast<const PyHbmPool&>());
  if (plane >= p.geometry.kv_planes()) {
    throw StatusError(absl::FailedPreconditionError("HbmPool: MLA stores no separate V plane"));
  }
  std::vector<py::ssize_t> shape;
  std::vector<py::ssize_t> strides;
  LayerShape(p, shape, strides);
  const std::byte* base = KvAddress(p.view, 0, CheckLayer(p, layer), static_cast<KvPlane>(plane));
  return py::array(ElementDtype(p.geometry.dtype()),
                   std::vector<py::ssize_t>{shape[0], shape[2], shape[3], shape[4]},
                   std::vector<py::ssize_t>{strides[0], strides[2], strides[3], strides[4]}, base,
                   self);
}

}  // namespace

void BindHbmPool(py::module_& m) {
  py::class_<PyHbmPool>(
      m, "HbmPool", py::buffer_protocol(),
      "The emulated HBM pool of a KvCache, writable without a copy. See "
      "array(), layer(l), k(l), v(l) for its shapes; the buffer protocol "
      "gives its bytes flat (memoryview(pool), torch.frombuffer(pool, ...)); for CUDA "
      "memory or per-layer hbm_tensors it is empty and read-only: use the "
      "per-layer views.")
      .def_buffer([](PyHbmPool& p) {
        // CUDA memory, or one tensor per layer (hbm_tensors): no flat host view of the pool
        // exists, so the buffer is empty and read-only (pybind11 2.10 cannot raise from here:
        // an exception would abort). Use layer(l), k(l), v(l) or cuda_array_interface().
        if (!p.view.host_accessible || !OneRegion(p)) {
          return py::buffer_info(Base(p), 1, py::format_descriptor<uint8_t>::format(), 1, {0}, {1},
                                 /*readonly=*/true);
        }
        return py::buffer_info(Base(p), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {TotalBytes(p)}, {1}, /*readonly=*/false);
      })
      .def_property_readonly("layout", [](const PyHbmPool& p) { return p.layout; })
      .def_property_readonly("host_accessible",
                             [](const PyHbmPool& p) { return p.view.host_accessible; })
      .def(
          "cuda_array_interface",
          [](const PyHbmPool& p, int layer, int plane) {
            // The same shapes as layer(l) (plane -1) and k(l) / v(l), as a
            // __cuda_array_interface__ (version 3) dict: torch.as_tensor takes an object
            // carrying it without a copy.
            if (plane < -1 || plane > 1) {
              throw StatusError(
                  absl::InvalidArgumentError("HbmPool: plane " + std::to_string(plane) +
                                             " is not -1 (the whole layer), 0 (K) or 1 (V)"));
            }
            if (plane >= p.geometry.kv_planes()) {
              throw StatusError(
                  absl::FailedPreconditionError("HbmPool: MLA stores no separate V plane"));
            }
            std::vector<py::ssize_t> shape;
            std::vector<py::ssize_t> strides;
            LayerShape(p, shape, strides);
            const std::byte* base =
                plane < 0 ? static_cast<const std::byte*>(
                                p.view.k_base[static_cast<size_t>(CheckLayer(p, layer))])
                          : KvAddress(p.view, 0, CheckLayer(p, layer), static_cast<KvPlane>(plane));
            if (plane >= 0) {
              shape = {shape[0], shape[2], shape[3], shape[4]};
              strides = {strides[0], strides[2], strides[3], strides[4]};
            }
            py::dict d;
            d["shape"] = py::tuple(py::cast(shape));
            d["strides"] = py::tuple(py::cast(strides));
            d["typestr"] = TypeStr(p.geometry.dtype());
            d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(base), false);
            d["version"] = 3;
            return d;
          },
          py::arg("layer"), py::arg("plane") = -1,
          "Layer l ([num_blocks][P][B][H][D], plane -1) or its K / V plane ([num_blocks][B][H][D]) "
          "as a __cuda_array_interface__ dict (byte strides; bf16 as int16 bits, typestr '<i2'). "
          "For a CUDA pool; on the emulated one the addresses are host memory. "
          "InvalidArgumentError for a plane other than -1, 0, 1; FailedPreconditionError for "
          "plane 1 of an MLA pool.")
      .def_property_readonly("geometry", [](const PyHbmPool& p) { return p.geometry; })
      .def_property_readonly("num_blocks", [](const PyHbmPool& p) { return p.num_blocks; })
      .def_property_readonly("nbytes", &TotalBytes)
      .def_property_readonly(
          "address", [](const PyHbmPool& p) { return reinterpret_cast<uintptr_t>(Base(p)); })
      .def_property_readonly("block_stride_bytes",
                             [](const PyHbmPool& p) { return p.view.block_stride_bytes; })
      .def_property_readonly("token_stride_bytes",
                             [](const PyHbmPool& p) { return p.view.token_stride_bytes; })
      .def_property_readonly("head_stride_bytes",
                             [](const PyHbmPool& p) { return p.view.head_stride_bytes; })
      .def_property_readonly("element_dtype",
                             [](const PyHbmPool& p) { return ElementDtype(p.geometry.dtype()); })
      .def(
          "layer_offset_bytes",
          [](const PyHbmPool& p, int layer) {
            return static_cast<const std::byte*>(
                       p.view.k_base[static_cast<size_t>(CheckLayer(WholePool(p), layer))]) -
                   Base(p);
          },
          py::arg("layer"), "Byte offset of layer's K plane of slot 0, token 0 in the pool.")
      .def(
          "array",
          [](const py::object& self) {
            const auto& p = WholePool(HostPool(self.cast<const PyHbmPool&>()));
            const KvGeometry& g = p.geometry;
            std::vector<py::ssize_t> shape = {g.kv_planes(), g.tokens_per_block(), Heads(g),
                                              HeadDim(g)};
            switch (p.layout) {
              case HbmLayout::kLayerFirst:
                shape.insert(shape.begin(), {g.num_layers(), p.num_blocks});
                break;
              case HbmLayout::kBlockFirst:
                shape.insert(shape.begin(), {p.num_blocks, g.num_layers()});
                break;
              case HbmLayout::kLayerKvSplit:
                shape.insert(shape.begin() + 1, p.num_blocks);  // [P][num_blocks][B][H][D]
                shape.insert(shape.begin(), g.num_layers());
                break;
            }
            return py::array(ElementDtype(g.dtype()), shape, {}, Base(p), self);
          },
          "The whole pool, C-contiguous: [num_layers][num_blocks][P][B][H][D] (layer_first), "
          "[num_blocks][num_layers][P][B][H][D] (block_first) or "
          "[num_layers][P][num_blocks][B][H][D] (layer_kv_split).")
      .def("layer", &LayerView, py::arg("layer"),
           "Layer l of every slot: [num_blocks][P][B][H][D] (P: K, V).")
      .def(
          "k", [](const py::object& self, int layer) { return PlaneView(self, layer, 0); },
          py::arg("layer"), "K (or the MLA latent) of layer l: [num_blocks][B][H][D].")
      .def(
          "v", [](const py::object& self, int layer) { return PlaneView(self, layer, 1); },
          py::arg("layer"), "V of layer l: [num_blocks][B][H][D] (MHA only).");
}

}  // namespace kvtier::python
