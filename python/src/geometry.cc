// The enums of the public API, KvGeometry (kv_geometry.h), CacheNamespace (cache_namespace.h)
// and the identity extras of a sequence (prefix_hasher.h). Constructors validate as the C++
// factories do and raise kvtier.InvalidArgumentError naming the bad field.
#include <pybind11/stl.h>

#include <string>

#include "bindings.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/hbm_layout.h"
#include "kvtier/ids.h"
#include "kvtier/kv_cache.h"
#include "kvtier/kv_cache_stats.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/prefix_hasher.h"
#include "kvtier/session_hints.h"
#include "kvtier/tier_stack.h"

namespace kvtier::python {
namespace {

// A dtype given as KvDtype or as its name ("bf16", "fp16", "fp8_e4m3", "fp8_e5m2", ...).
KvDtype DtypeFrom(const py::object& dtype) {
  if (py::isinstance<py::str>(dtype)) {
    const std::string name = dtype.cast<std::string>();
    return Unwrap(ParseKvDtype(name));
  }
  return dtype.cast<KvDtype>();
}

}  // namespace

void BindGeometry(py::module_& m) {
  py::enum_<Tier>(m, "Tier", "A level of the memory hierarchy (ids.h).")
      .value("HBM", Tier::kHbm)
      .value("DRAM", Tier::kDram)
      .value("NVME", Tier::kNvme)
      .value("REMOTE", Tier::kRemote);
  m.attr("NUM_TIERS") = kNumTiers;
  m.def(
      "tier_name", [](Tier t) { return std::string(TierName(t)); }, py::arg("tier"));

  py::enum_<KvDtype>(m, "KvDtype", "Element type of the stored KV (kv_geometry.h).")
      .value("BF16", KvDtype::kBf16)
      .value("FP16", KvDtype::kFp16)
      .value("FP8_E4M3", KvDtype::kFp8E4m3)
      .value("FP8_E5M2", KvDtype::kFp8E5m2);
  py::enum_<AttentionKind>(m, "AttentionKind")
      .value("MHA", AttentionKind::kMha)
      .value("MLA", AttentionKind::kMla);
  py::enum_<HbmLayout>(m, "HbmLayout", "How the HBM pool arranges blocks (hbm_layout.h).")
      .value("LAYER_FIRST", HbmLayout::kLayerFirst)
      .value("BLOCK_FIRST", HbmLayout::kBlockFirst)
      .value("LAYER_KV_SPLIT", HbmLayout::kLayerKvSplit);
  py::enum_<HashAlgorithm>(m, "HashAlgorithm")
      .value("XXH3_128", HashAlgorithm::kXxh3_128)
      .value("SHA256", HashAlgorithm::kSha256);
  py::enum_<StopReason>(m, "StopReason", "How a request's generation ended (session_hints.h).")
      .value("UNKNOWN", StopReason::kUnknown)
      .value("TOOL_USE", StopReason::kToolUse)
      .value("END_TURN", StopReason::kEndTurn)
      .value("LENGTH", StopReason::kLength);
  py::enum_<WritePolicy>(m, "WritePolicy")
      .value("WRITE_BACK", WritePolicy::kWriteBack)
      .value("WRITE_THROUGH", WritePolicy::kWriteThrough);
  py::enum_<TierInclusion>(m, "TierInclusion")
      .value("INCLUSIVE", TierInclusion::kInclusive)
      .value("EXCLUSIVE", TierInclusion::kExclusive);
  py::enum_<ResidencyMode>(m, "ResidencyMode")
      .value("WAIT", ResidencyMode::kWait)
      .value("BEST_EFFORT", ResidencyMode::kBestEffort)
      .value("ASYNC", ResidencyMode::kAsync);
  py::enum_<BlockResidency>(m, "BlockResidency")
      .value("RESIDENT", BlockResidency::kResident)
      .value("PENDING", BlockResidency::kPending)
      .value("NOT_RESIDENT", BlockResidency::kNotResident);
  py::enum_<HintOutcome::Result>(m, "HintResult")
      .value("ACCEPTED", HintOutcome::Result::kAccepted)
      .value("CLIPPED", HintOutcome::Result::kClipped)
      .value("REJECTED", HintOutcome::Result::kRejected);
  py::enum_<CacheEventKind>(m, "CacheEventKind")
      .value("STORED", CacheEventKind::kStored)
      .value("REMOVED", CacheEventKind::kRemoved)
      .value("ALL_CLEARED", CacheEventKind::kAllCleared);
  py::enum_<RoomWait>(m, "RoomWait",
                      "How append, fork and truncate behave while HBM is short (kv_cache.h).")
      .value("WAIT", RoomWait::kWait)
      .value("NEVER", RoomWait::kNever);
  py::enum_<TierBackendKind>(m, "TierBackendKind")
      .value("NATIVE", TierBackendKind::kNative)
      .value("METADATA", TierBackendKind::kMetadata);

  m.def(
      "dtype_bytes", [](const py::object& dtype) { return KvDtypeBytes(DtypeFrom(dtype)); },
      py::arg("dtype"), "Bytes per element of a KV dtype (2 for bf16/fp16, 1 for fp8).");

  py::class_<KvGeometry>(m, "KvGeometry",
                         "The shape of one model's KV cache (kv_geometry.h). Immutable.")
      .def(py::init([](int num_layers, int num_kv_heads, int head_dim, const py::object& dtype,
                       int tokens_per_block, AttentionKind attention, int kv_lora_rank,
                       int qk_rope_head_dim) {
             KvGeometryOptions o;
             o.attention = attention;
             o.num_layers = num_layers;
             o.num_kv_heads = num_kv_heads;
             o.head_dim = head_dim;
             o.kv_lora_rank = kv_lora_rank;
             o.qk_rope_head_dim = qk_rope_head_dim;
             o.dtype = DtypeFrom(dtype);
             o.tokens_per_block = tokens_per_block;
             return Unwrap(KvGeometry::Create(o));
           }),
           py::kw_only(), py::arg("num_layers"), py::arg("num_kv_heads") = 0,
           py::arg("head_dim") = 0, py::arg("dtype") = KvDtype::kBf16,
           py::arg("tokens_per_block") = 16, py::arg("attention") = AttentionKind::kMha,
           py::arg("kv_lora_rank") = 0, py::arg("qk_rope_head_dim") = 0)
      .def_property_readonly("attention", &KvGeometry::attention)
      .def_property_readonly("num_layers", &KvGeometry::num_layers)
      .def_property_readonly("num_kv_heads", &KvGeometry::num_kv_heads)
      .def_property_readonly("head_dim", &KvGeometry::head_dim)
      .def_property_readonly("kv_lora_rank", &KvGeometry::kv_lora_rank)
      .def_property_readonly("qk_rope_head_dim", &KvGeometry::qk_rope_head_dim)
      .def_property_readonly("dtype", &KvGeometry::dtype)
      .def_property_readonly(
          "dtype_name", [](const KvGeometry& g) { return std::string(KvDtypeName(g.dtype())); })
      .def_property_readonly("tokens_per_block", &KvGeometry::tokens_per_block)
      .def_property_readonly("kv_planes", &KvGeometry::kv_planes)
      .def_property_readonly("bytes_per_token_per_layer", &KvGeometry::bytes_per_token_per_layer)
      .def_property_readonly("bytes_per_token", &KvGeometry::bytes_per_token)
      .def_property_readonly("bytes_per_block_per_layer", &KvGeometry::bytes_per_block_per_layer)
      .def_property_readonly("bytes_per_block", &KvGeometry::bytes_per_block)
      .def("blocks_for_tokens", &KvGeometry::BlocksForTokens, py::arg("num_tokens"))
      .def(
          "sharded_for_tensor_parallel",
          [](const KvGeometry& g, int tp_size) {
            return Unwrap(g.ShardedForTensorParallel(tp_size));
          },
          py::arg("tp_size"))
      .def("__eq__", [](const KvGeometry& a, const KvGeometry& b) { return a == b; })
      .def("__repr__", [](const KvGeometry& g) { return "KvGeometry(" + g.ToString() + ")"; });

  py::class_<CacheNamespace>(
      m, "CacheNamespace",
      "Everything besides tokens that decides a block's KV bytes, and its digest "
      "(cache_namespace.h). Immutable.")
      .def(py::init([](const KvGeometry& geometry, std::string model_id,
                       std::string weights_fingerprint, HbmLayout hbm_layout, int tp_rank,
                       int tp_size, int pp_rank, int pp_size, int first_layer) {
             CacheNamespaceOptions o;
             o.model_id = std::move(model_id);
             o.weights_fingerprint = std::move(weights_fingerprint);
             o.hbm_layout = hbm_layout;
             o.tp_rank = tp_rank;
             o.tp_size = tp_size;
             o.pp_rank = pp_rank;
             o.pp_size = pp_size;
             o.first_layer = first_layer;
             return Unwrap(CacheNamespace::Create(geometry, o));
           }),
           py::arg("geometry"), py::kw_only(), py::arg("model_id"), py::arg("weights_fingerprint"),
           py::arg("hbm_layout") = HbmLayout::kLayerFirst, py::arg("tp_rank") = 0,
           py::arg("tp_size") = 1, py::arg("pp_rank") = 0, py::arg("pp_size") = 1,
           py::arg("first_layer") = 0)
      .def_property_readonly("geometry", &CacheNamespace::geometry)
      .def_property_readonly("model_id",
                             [](const CacheNamespace& n) { return n.options().model_id; })
      .def_property_readonly(
          "weights_fingerprint",
          [](const CacheNamespace& n) { return n.options().weights_fingerprint; })
      .def_property_readonly("hbm_layout",
                             [](const CacheNamespace& n) { return n.options().hbm_layout; })
      .def_property_readonly("tp_rank", [](const CacheNamespace& n) { return n.options().tp_rank; })
      .def_property_readonly("tp_size", [](const CacheNamespace& n) { return n.options().tp_size; })
      .def_property_readonly("pp_rank", [](const CacheNamespace& n) { return n.options().pp_rank; })
      .def_property_readonly("pp_size", [](const CacheNamespace& n) { return n.options().pp_size; })
      .def_property_readonly("first_layer",
                             [](const CacheNamespace& n) { return n.options().first_layer; })
      .def_property_readonly("digest",
                             [](const CacheNamespace& n) {
                               const auto& d = n.digest();
                               return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
                             })
      .def_property_readonly("digest_hex", &CacheNamespace::DigestHex)
      .def("__repr__", [](const CacheNamespace& n) {
        return "CacheNamespace(" + n.options().model_id + ", " + n.DigestHex() + ")";
      });

  py::class_<AdapterIdentity>(m, "AdapterIdentity",
                              "A LoRA adapter and its load generation (prefix_hasher.h).")
      .def(py::init([](std::string id, uint64_t load_generation) {
             return AdapterIdentity{std::move(id), load_generation};
           }),
           py::arg("id"), py::arg("load_generation") = 0)
      .def_readwrite("id", &AdapterIdentity::id)
      .def_readwrite("load_generation", &AdapterIdentity::load_generation);
  py::class_<MultimodalItem>(m, "MultimodalItem",
                             "A multimodal item's placeholder tokens and content digest.")
      .def(py::init([](int64_t start_token, int64_t num_tokens, py::bytes digest) {
             return MultimodalItem{start_token, num_tokens, std::string(digest)};
           }),
           py::arg("start_token"), py::arg("num_tokens"), py::arg("digest"))
      .def_readwrite("start_token", &MultimodalItem::start_token)
      .def_readwrite("num_tokens", &MultimodalItem::num_tokens)
      .def_property_readonly("digest", [](const MultimodalItem& i) { return py::bytes(i.digest); });
}

}  // namespace kvtier::python
