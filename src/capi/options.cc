// The C ABI's options structs: their *_init functions (filled from the C++ defaults, so the two
// never drift apart) and their conversion into the C++ options, checking every enum value before
// it is cast.
#include <string>

#include "absl/strings/str_cat.h"
#include "capi/handles.h"
#include "kvtier/prefix_hasher.h"

namespace kvtier::capi {
namespace {

// kInvalidArgument "<field> = <value> is not one of 0..<max>" unless value is in [0, max].
absl::Status CheckEnum(const char* field, int value, int max) {
  if (value < 0 || value > max) {
    return absl::InvalidArgumentError(absl::StrCat(field, " = ", value, " is not one of 0..", max));
  }
  return absl::OkStatus();
}

std::string OrEmpty(const char* s) { return s == nullptr ? std::string() : std::string(s); }

}  // namespace

absl::StatusOr<KvGeometryOptions> ToGeometryOptions(const kvtier_geometry_options& o) {
  absl::Status s = CheckEnum("geometry attention", RawEnum(o.attention), KVTIER_ATTENTION_MLA);
  if (s.ok()) s = CheckEnum("geometry dtype", RawEnum(o.dtype), KVTIER_DTYPE_FP8_E5M2);
  if (!s.ok()) return s;
  KvGeometryOptions g;
  g.attention = static_cast<AttentionKind>(RawEnum(o.attention));
  g.num_layers = o.num_layers;
  g.num_kv_heads = o.num_kv_heads;
  g.head_dim = o.head_dim;
  g.kv_lora_rank = o.kv_lora_rank;
  g.qk_rope_head_dim = o.qk_rope_head_dim;
  g.dtype = static_cast<KvDtype>(RawEnum(o.dtype));
  g.tokens_per_block = o.tokens_per_block;
  return g;
}

absl::StatusOr<CacheNamespaceOptions> ToNamespaceOptions(const kvtier_namespace_options& o) {
  if (absl::Status s =
          CheckEnum("namespace hbm_layout", RawEnum(o.hbm_layout), KVTIER_HBM_LAYER_KV_SPLIT);
      !s.ok()) {
    return s;
  }
  CacheNamespaceOptions n;
  n.model_id = OrEmpty(o.model_id);
  n.weights_fingerprint = OrEmpty(o.weights_fingerprint);
  n.hbm_layout = static_cast<HbmLayout>(RawEnum(o.hbm_layout));
  n.tp_rank = o.tp_rank;
  n.tp_size = o.tp_size;
  n.pp_rank = o.pp_rank;
  n.pp_size = o.pp_size;
  n.first_layer = o.first_layer;
  return n;
}

absl::StatusOr<TierStackOptions> ToTierStackOptions(const CacheNamespace& ns,
                                                    const kvtier_tier_stack_options& o) {
  TierStackOptions t;
  // Fields of an absent or metadata tier are not looked at (the header's promise): not even
  // range-checked. `present` is read after the loop below has checked the kinds.
  auto present = [&](kvtier_tier tier) {
    return o.tiers[tier].capacity_blocks != 0 &&
           RawEnum(o.tiers[tier].kind) == RawEnum(KVTIER_BACKEND_NATIVE);
  };
  for (int i = 0; i < kNumTiers; ++i) {
    t.tiers[i].capacity_blocks = o.tiers[i].capacity_blocks;
    if (o.tiers[i].capacity_blocks == 0) continue;
    if (absl::Status s = CheckEnum(
            absl::StrCat("tier stack ", std::string(TierName(static_cast<Tier>(i))), " kind")
                .c_str(),
            RawEnum(o.tiers[i].kind), KVTIER_BACKEND_METADATA);
        !s.ok()) {
      return s;
    }
    t.tiers[i].kind = static_cast<TierBackendKind>(RawEnum(o.tiers[i].kind));
  }
  absl::Status s = absl::OkStatus();
  if (present(KVTIER_TIER_NVME)) {
    s = CheckEnum("tier stack nvme_engine", RawEnum(o.nvme_engine), KVTIER_NVME_THREAD_POOL);
  }
  if (s.ok() && present(KVTIER_TIER_REMOTE)) {
    s = CheckEnum("tier stack remote_codec", RawEnum(o.remote_codec), KVTIER_CODEC_FP8_E4M3);
  }
  if (s.ok() && present(KVTIER_TIER_HBM)) {
    s = CheckEnum("tier stack hbm_backend", RawEnum(o.hbm_backend), KVTIER_HBM_CUDA);
  }
  if (!s.ok()) return s;
  if (present(KVTIER_TIER_HBM)) {
    if (o.hbm_num_tensors > 0 && o.hbm_tensors == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tier stack: hbm_num_tensors is ", o.hbm_num_tensors, " but hbm_tensors is NULL"));
    }
    // At most one a layer, checked before the array is read (the builder checks the exact count).
    if (o.hbm_num_tensors > static_cast<size_t>(ns.geometry().num_layers())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tier stack: hbm_num_tensors is ", o.hbm_num_tensors, ", more than the ",
                       ns.geometry().num_layers(), " layers of the namespace's geometry"));
    }
    t.hbm_backend = static_cast<HbmBackend>(RawEnum(o.hbm_backend));
    for (size_t i = 0; i < o.hbm_num_tensors; ++i) {
      t.hbm.external_pool.push_back(o.hbm_tensors[i]);
    }
  }
  t.cuda_hbm.device = o.cuda_device;
  t.cuda_hbm.external_pool = t.hbm.external_pool;
  // The emulated HBM keeps the layout the namespace (and so every block key) names.
  t.hbm.layout = ns.options().hbm_layout;
  t.hbm.check_available_memory = o.hbm_check_available_memory;
  t.dram.try_huge_pages = o.dram_try_huge_pages;
  t.dram.pin_for_cuda = o.dram_pin_for_cuda;
  t.dram.check_available_memory = o.dram_check_available_memory;
  t.dram.prefault = o.dram_prefault;
  if (present(KVTIER_TIER_NVME)) t.nvme.path = OrEmpty(o.nvme_path);
  t.nvme.queue_depth = o.nvme_queue_depth;
  if (present(KVTIER_TIER_NVME)) t.nvme.engine = static_cast<NvmeEngine>(RawEnum(o.nvme_engine));
  t.nvme.thread_pool_threads = o.nvme_thread_pool_threads;
  // The strings of an absent tier are not read either: a caller may leave them dangling.
  if (present(KVTIER_TIER_REMOTE)) {
    t.remote_directory = OrEmpty(o.remote_directory);
    t.remote_url = OrEmpty(o.remote_url);
    // NULL and "" are unset (the header's rule for this struct's strings): the default prefix.
    if (o.remote_key_prefix != nullptr && o.remote_key_prefix[0] != '\0') {
      t.remote.key_prefix = o.remote_key_prefix;
    }
    t.remote.codec = static_cast<Codec>(RawEnum(o.remote_codec));
    t.remote.hmac_secret = OrEmpty(o.remote_hmac_secret);
  }
  t.remote.breaker_failures = o.remote_breaker_failures;
  t.remote.delete_freed = o.remote_delete_freed;
  t.remote.write_if_absent = o.remote_write_if_absent;
  return t;
}

absl::StatusOr<KvCacheOptions> ToCacheOptions(const kvtier_cache_options& o) {
  absl::Status s = CheckEnum("cache hash", RawEnum(o.hash), KVTIER_HASH_SHA256);
  if (s.ok()) s = CheckEnum("cache write_policy", RawEnum(o.write_policy), KVTIER_WRITE_THROUGH);
  if (s.ok()) s = CheckEnum("cache inclusion", RawEnum(o.inclusion), KVTIER_EXCLUSIVE);
  if (!s.ok()) return s;
  KvCacheOptions c;
  if (o.eviction_policy != nullptr) c.eviction_policy = o.eviction_policy;
  c.hash = static_cast<HashAlgorithm>(RawEnum(o.hash));
  c.write_policy = static_cast<WritePolicy>(RawEnum(o.write_policy));
  c.inclusion = static_cast<TierInclusion>(RawEnum(o.inclusion));
  for (int i = 0; i < kNumTiers; ++i) {
    c.admit_after_uses[i] = o.admit_after_uses[i];
    c.links[i] = TierLinkCost{absl::Nanoseconds(o.link_latency_ns[i]), o.link_bytes_per_second[i]};
  }
  c.demote_on_evict = o.demote_on_evict;
  c.demote_by_value = o.demote_by_value;
  c.measure_bandwidth = o.measure_bandwidth;
  c.prefill_flops_per_second = o.prefill_flops_per_second;
  c.event_buffer = o.event_buffer;
  c.room_wait = absl::Nanoseconds(o.room_wait_ns);
  c.bounce_buffers = o.bounce_buffers;
  c.remote_probe_window_blocks = o.remote_probe_window_blocks;
  c.remote_probe_timeout = absl::Nanoseconds(o.remote_probe_timeout_ns);
  if (o.worker_id != nullptr) c.worker_id = o.worker_id;
  return c;
}

absl::StatusOr<SequenceOptions> ToSequenceOptions(const kvtier_sequence_options* o) {
  SequenceOptions s;
  if (o == nullptr) return s;
  if (o->adapter_id != nullptr) {
    s.adapter = AdapterIdentity{o->adapter_id, o->adapter_load_generation};
  }
  // Lengths are checked before the bytes are copied: a length past the caller's buffer would
  // read beyond it (PrefixHasher checks the same bounds, but only once the copy is made).
  if (o->tenant_salt_bytes > PrefixHasher::kMaxExtraBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence options: tenant_salt_bytes ", o->tenant_salt_bytes,
                     " is over PrefixHasher::kMaxExtraBytes (", PrefixHasher::kMaxExtraBytes, ")"));
  }
  if (o->tenant_salt != nullptr) {
    s.tenant_salt =
        std::string(reinterpret_cast<const char*>(o->tenant_salt), o->tenant_salt_bytes);
  } else if (o->tenant_salt_bytes > 0) {
    return absl::InvalidArgumentError("sequence options: tenant_salt is null with bytes > 0");
  }
  if (o->multimodal == nullptr && o->num_multimodal > 0) {
    return absl::InvalidArgumentError("sequence options: multimodal is null with items > 0");
  }
  for (size_t i = 0; i < o->num_multimodal; ++i) {
    const kvtier_multimodal_item& item = o->multimodal[i];
    if (item.digest == nullptr && item.digest_bytes > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence options: multimodal item ", i, " digest is null"));
    }
    if (item.digest_bytes > PrefixHasher::kMaxDigestBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence options: multimodal item ", i, " digest_bytes ", item.digest_bytes,
          " is over PrefixHasher::kMaxDigestBytes (", PrefixHasher::kMaxDigestBytes, ")"));
    }
    s.multimodal.push_back(
        MultimodalItem{item.start_token, item.num_tokens,
                       std::string(reinterpret_cast<const char*>(item.digest), item.digest_bytes)});
  }
  s.retention_priority = o->retention_priority;
  s.retention = absl::Nanoseconds(o->retention_ns);
  s.session = o->session;
  s.enable_caching = o->enable_caching;
  s.readmission = o->readmission;
  return s;
}

}  // namespace kvtier::capi

using namespace kvtier;  // NOLINT: the C entry points below spell every kvtier type

extern "C" {

void kvtier_geometry_options_init(kvtier_geometry_options* options) {
  if (options == nullptr) return;
  const KvGeometryOptions d{};
  options->attention = static_cast<kvtier_attention_kind>(d.attention);
  options->num_layers = d.num_layers;
  options->num_kv_heads = d.num_kv_heads;
  options->head_dim = d.head_dim;
  options->kv_lora_rank = d.kv_lora_rank;
  options->qk_rope_head_dim = d.qk_rope_head_dim;
  options->dtype = static_cast<kvtier_dtype>(d.dtype);
  options->tokens_per_block = d.tokens_per_block;
}

void kvtier_namespace_options_init(kvtier_namespace_options* options) {
  if (options == nullptr) return;
  const CacheNamespaceOptions d{};
  options->model_id = nullptr;
  options->weights_fingerprint = nullptr;
  options->hbm_layout = static_cast<kvtier_hbm_layout>(d.hbm_layout);
  options->tp_rank = d.tp_rank;
  options->tp_size = d.tp_size;
  options->pp_rank = d.pp_rank;
  options->pp_size = d.pp_size;
  options->first_layer = d.first_layer;
}

void kvtier_tier_stack_options_init(kvtier_tier_stack_options* options) {
  if (options == nullptr) return;
  const TierStackOptions d{};
  for (int i = 0; i < kNumTiers; ++i) {
    options->tiers[i].capacity_blocks = d.tiers[i].capacity_blocks;
    options->tiers[i].kind = static_cast<kvtier_tier_backend_kind>(d.tiers[i].kind);
  }
  options->hbm_check_available_memory = d.hbm.check_available_memory;
  options->hbm_backend = static_cast<kvtier_hbm_backend>(d.hbm_backend);
  options->cuda_device = d.cuda_hbm.device;
  options->hbm_tensors = nullptr;
  options->hbm_num_tensors = 0;
  options->dram_try_huge_pages = d.dram.try_huge_pages;
  options->dram_pin_for_cuda = d.dram.pin_for_cuda;
  options->dram_check_available_memory = d.dram.check_available_memory;
  options->dram_prefault = d.dram.prefault;
  options->nvme_path = nullptr;
  options->nvme_queue_depth = d.nvme.queue_depth;
  options->nvme_engine = static_cast<kvtier_nvme_engine>(d.nvme.engine);
  options->nvme_thread_pool_threads = d.nvme.thread_pool_threads;
  options->remote_directory = nullptr;
  options->remote_url = nullptr;
  options->remote_key_prefix = nullptr;
  options->remote_codec = static_cast<kvtier_codec>(d.remote.codec);
  options->remote_hmac_secret = nullptr;
  options->remote_breaker_failures = d.remote.breaker_failures;
  options->remote_delete_freed = d.remote.delete_freed;
  options->remote_write_if_absent = d.remote.write_if_absent;
}

void kvtier_cache_options_init(kvtier_cache_options* options) {
  if (options == nullptr) return;
  const KvCacheOptions d{};
  options->eviction_policy = nullptr;
  options->hash = static_cast<kvtier_hash_algorithm>(d.hash);
  options->write_policy = static_cast<kvtier_write_policy>(d.write_policy);
  options->inclusion = static_cast<kvtier_tier_inclusion>(d.inclusion);
  for (int i = 0; i < kNumTiers; ++i) {
    options->admit_after_uses[i] = d.admit_after_uses[i];
    options->link_latency_ns[i] = absl::ToInt64Nanoseconds(d.links[i].latency);
    options->link_bytes_per_second[i] = d.links[i].bytes_per_second;
  }
  options->demote_on_evict = d.demote_on_evict;
  options->demote_by_value = d.demote_by_value;
  options->measure_bandwidth = d.measure_bandwidth;
  options->prefill_flops_per_second = d.prefill_flops_per_second;
  options->event_buffer = d.event_buffer;
  options->room_wait_ns = absl::ToInt64Nanoseconds(d.room_wait);
  options->bounce_buffers = d.bounce_buffers;
  options->remote_probe_window_blocks = d.remote_probe_window_blocks;
  options->remote_probe_timeout_ns = absl::ToInt64Nanoseconds(d.remote_probe_timeout);
  options->worker_id = nullptr;
}

void kvtier_sequence_options_init(kvtier_sequence_options* options) {
  if (options == nullptr) return;
  const SequenceOptions d{};
  options->adapter_id = nullptr;
  options->adapter_load_generation = 0;
  options->tenant_salt = nullptr;
  options->tenant_salt_bytes = 0;
  options->multimodal = nullptr;
  options->num_multimodal = 0;
  options->retention_priority = d.retention_priority;
  options->retention_ns = absl::ToInt64Nanoseconds(d.retention);
  options->session = d.session;
  options->enable_caching = d.enable_caching;
  options->readmission = d.readmission;
}

void kvtier_residency_options_init(kvtier_residency_options* options) {
  if (options == nullptr) return;
  options->mode = KVTIER_RESIDENCY_WAIT;
  options->timeout_ns = -1;
}

}  // extern "C"
