/* kvtier's C ABI: the KvCache serving loop (kvtier/kv_cache.h) for engines written in C, or
 * reached through a foreign-function interface (ctypes, cgo, Rust's bindgen). Every type here is
 * a C11 type: opaque handles, plain structs of fixed-width integers, and enums mirroring the C++
 * ones value for value. No C++ or abseil type crosses it, and no C++ exception escapes it (an
 * allocation failure is KVTIER_RESOURCE_EXHAUSTED, anything else unexpected KVTIER_INTERNAL).
 *
 * The serving loop, per request (each call is the C++ method of the same name):
 *   kvtier_namespace_create(geometry, identity)     once per model
 *   kvtier_tier_stack_build(ns, tiers)               once: the backends of HBM, DRAM, NVMe, remote
 *   kvtier_cache_create(ns, stack, options)          once; takes the stack
 *   kvtier_sequence_create(cache, id, options)       once per request
 *   kvtier_attach_prefix(cache, id, prompt)  -> attached_tokens
 *   kvtier_append(cache, id, prompt + attached, WAIT) slots for the tokens to prefill
 *   kvtier_ensure_resident(cache, id, 0, n) -> ticket; kvtier_ticket_block_table(ticket, slots)
 *   ... the kernel reads the slots, writes the new tokens' KV ...
 *   kvtier_report_written(cache, id, n, ready)      the new full blocks become shareable
 *   kvtier_release_ticket(cache, ticket); kvtier_ticket_destroy(ticket)
 *   kvtier_pause / kvtier_resume                     an agent waiting on a tool
 *   kvtier_pause_with_hints (preempted)              a scheduler swapping a request out
 *   kvtier_release_with_hints(cache, id, hints)      blocks stay cached for the next turn
 * And for a scheduler between steps: kvtier_check_room (does a request fit now?), the
 * ROOM_NEVER mode of kvtier_append / kvtier_fork / kvtier_truncate (answer at once, never block),
 * kvtier_truncate (rejected speculative tokens), kvtier_release_with_hints with `preempted` and
 * a sequence created with `readmission` (preemption), and kvtier_reset_prefix_cache.
 *
 * Errors. Every function returns a kvtier_status_code, the numbers of absl::StatusCode
 * (KVTIER_OK is 0), and the codes are those kv_cache.h documents for the C++ call: NOT_FOUND for
 * an unknown sequence, FAILED_PRECONDITION for a released one or a call in the wrong state,
 * OUT_OF_RANGE for a token range past the end, INVALID_ARGUMENT for malformed arguments,
 * ALREADY_EXISTS for a sequence id in use, RESOURCE_EXHAUSTED when HBM is full of locked and held
 * blocks. The C layer adds INVALID_ARGUMENT for a null handle, a null required pointer, a null
 * token array with a non-zero count and a caller buffer too small for the answer. On error
 * nothing changes and no out-parameter is written (except a buffer's required size, where said).
 * A function that can fail takes a last `kvtier_error* error`, which may be NULL: when it is not,
 * the call always writes it (code and message, even on success, when the message is empty). The
 * struct is the caller's, so there is no global or thread-local error state.
 *
 * Units are in the names: *_ns nanoseconds, *_bytes bytes, *_tokens tokens, *_blocks blocks.
 * Timeouts are relative to the call: a negative timeout_ns means none (wait for ever).
 *
 * Thread-safety: the cache functions are thread-safe, as KvCache's methods are. A namespace is
 * immutable and may be shared by threads. A ticket or completion handle may be used from several
 * threads at once, but its destroy must not race any other use of that same handle. Destroying a
 * cache must not race any call on it.
 *
 * Ownership: each *_create / *_build returns a handle the caller destroys with the matching
 * *_destroy (NULL is accepted and ignored), except a tier stack given to kvtier_cache_create,
 * which that call always takes. Strings and arrays passed in are only read during the call and
 * never kept. No pointer the library returns needs freeing, except the pool addresses of
 * kvtier_ticket_device_pool (valid while the cache lives) and kvtier_status_code_name's static
 * strings.
 *
 * ABI: structs are passed by pointer; fill an options struct with its *_init function first, then
 * set the fields you need, so that defaults come from the C++ library and stay in step with it. */
#ifndef KVTIER_C_KVTIER_H_
#define KVTIER_C_KVTIER_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any incompatible change of a struct or a function of this header. */
#define KVTIER_C_ABI_VERSION 4
/* KVTIER_C_ABI_VERSION of the library linked in (compare with the header's). Never fails. */
uint32_t kvtier_c_abi_version(void);

/* ---- Status and errors */

/* absl::StatusCode, number for number. */
typedef enum kvtier_status_code {
  KVTIER_OK = 0,
  KVTIER_CANCELLED = 1,
  KVTIER_UNKNOWN = 2,
  KVTIER_INVALID_ARGUMENT = 3,
  KVTIER_DEADLINE_EXCEEDED = 4,
  KVTIER_NOT_FOUND = 5,
  KVTIER_ALREADY_EXISTS = 6,
  KVTIER_PERMISSION_DENIED = 7,
  KVTIER_RESOURCE_EXHAUSTED = 8,
  KVTIER_FAILED_PRECONDITION = 9,
  KVTIER_ABORTED = 10,
  KVTIER_OUT_OF_RANGE = 11,
  KVTIER_UNIMPLEMENTED = 12,
  KVTIER_INTERNAL = 13,
  KVTIER_UNAVAILABLE = 14,
  KVTIER_DATA_LOSS = 15,
  KVTIER_UNAUTHENTICATED = 16
} kvtier_status_code;

/* Bytes of kvtier_error::message, NUL included. Longer messages are cut to fit. */
#define KVTIER_ERROR_MESSAGE_BYTES 512

/* The outcome of one call, owned by the caller (on its stack, typically). `message` is the C++
 * status message (e.g. "sequence 7 not found"), NUL-terminated, empty on success. */
typedef struct kvtier_error {
  kvtier_status_code code;
  char message[KVTIER_ERROR_MESSAGE_BYTES];
} kvtier_error;

/* Upper-case name of a code, e.g. "NOT_FOUND"; "UNKNOWN_CODE" outside the enum. The string is
 * static: never freed, valid for ever. */
const char* kvtier_status_code_name(kvtier_status_code code);

/* ---- Enums (the C++ enums' values) */

typedef enum kvtier_tier {
  KVTIER_TIER_HBM = 0,   /* GPU memory, or the host-emulated device tier */
  KVTIER_TIER_DRAM = 1,  /* host memory */
  KVTIER_TIER_NVME = 2,  /* local NVMe, O_DIRECT */
  KVTIER_TIER_REMOTE = 3 /* a store shared by a fleet */
} kvtier_tier;
#define KVTIER_NUM_TIERS 4

typedef enum kvtier_attention_kind {
  KVTIER_ATTENTION_MHA = 0, /* K and V per KV head: MHA, GQA, MQA */
  KVTIER_ATTENTION_MLA = 1  /* one latent (+ rope part) per token and layer */
} kvtier_attention_kind;

typedef enum kvtier_dtype {
  KVTIER_DTYPE_BF16 = 0,
  KVTIER_DTYPE_FP16 = 1,
  KVTIER_DTYPE_FP8_E4M3 = 2,
  KVTIER_DTYPE_FP8_E5M2 = 3
} kvtier_dtype;

typedef enum kvtier_hbm_layout {
  /* Per layer [num_blocks][kv_planes][tokens_per_block][num_kv_heads][head_dim]. */
  KVTIER_HBM_LAYER_FIRST = 0,
  /* [num_blocks][num_layers][kv_planes][tokens_per_block][num_kv_heads][head_dim]. */
  KVTIER_HBM_BLOCK_FIRST = 1,
  /* Per layer [kv_planes][num_blocks][tokens_per_block][num_kv_heads][head_dim]: K and V apart
   * (vLLM's FlashAttention kv_cache[layer]). */
  KVTIER_HBM_LAYER_KV_SPLIT = 2
} kvtier_hbm_layout;

typedef enum kvtier_tier_backend_kind {
  KVTIER_BACKEND_NATIVE = 0,  /* EmulatedHbm, DramTier, NvmeTier or RemoteTier */
  KVTIER_BACKEND_METADATA = 1 /* slots and counts only, no KV byte (capacity planning) */
} kvtier_tier_backend_kind;

typedef enum kvtier_hbm_backend {
  KVTIER_HBM_EMULATED = 0, /* host memory with CUDA's asynchrony (EmulatedHbm), any machine */
  KVTIER_HBM_CUDA = 1      /* a GPU's memory (CudaHbm) */
} kvtier_hbm_backend;

typedef enum kvtier_nvme_engine {
  KVTIER_NVME_AUTO = 0, /* io_uring, else a thread pool */
  KVTIER_NVME_IO_URING = 1,
  KVTIER_NVME_THREAD_POOL = 2
} kvtier_nvme_engine;

/* The remote tier's value codec (kvtier/codec.h). FP8_E4M3 is lossy and needs bf16 KV. */
typedef enum kvtier_codec {
  KVTIER_CODEC_NONE = 0,
  KVTIER_CODEC_LZ4 = 1,
  KVTIER_CODEC_ZSTD = 2,
  KVTIER_CODEC_SHUFFLE_LZ4 = 3,
  KVTIER_CODEC_SHUFFLE_ZSTD = 4,
  KVTIER_CODEC_FP8_E4M3 = 5
} kvtier_codec;

typedef enum kvtier_hash_algorithm {
  KVTIER_HASH_XXH3_128 = 0,
  KVTIER_HASH_SHA256 = 1
} kvtier_hash_algorithm;

typedef enum kvtier_write_policy {
  KVTIER_WRITE_BACK = 0,   /* copy down only on eviction or pause */
  KVTIER_WRITE_THROUGH = 1 /* copy each written block one tier down at once */
} kvtier_write_policy;

typedef enum kvtier_tier_inclusion {
  KVTIER_INCLUSIVE = 0, /* onboarding keeps the lower copy */
  KVTIER_EXCLUSIVE = 1  /* onboarding drops it; needs KVTIER_WRITE_BACK */
} kvtier_tier_inclusion;

typedef enum kvtier_stop_reason {
  KVTIER_STOP_UNKNOWN = 0,
  KVTIER_STOP_TOOL_USE = 1, /* the agent comes back when its tool returns (seconds) */
  KVTIER_STOP_END_TURN = 2, /* a human may come back after minutes, or never */
  KVTIER_STOP_LENGTH = 3    /* cut at the token limit */
} kvtier_stop_reason;

typedef enum kvtier_hint_result {
  KVTIER_HINT_ACCEPTED = 0,
  KVTIER_HINT_CLIPPED = 1, /* taken in part; reason says what was left out */
  KVTIER_HINT_REJECTED = 2 /* not taken; reason says why (the call still did its work) */
} kvtier_hint_result;

typedef enum kvtier_residency_mode {
  KVTIER_RESIDENCY_WAIT = 0,        /* onboard; block until resident or the timeout */
  KVTIER_RESIDENCY_BEST_EFFORT = 1, /* move nothing, wait for nothing: report what is resident */
  KVTIER_RESIDENCY_ASYNC = 2        /* onboard; return at once (wait on the ticket) */
} kvtier_residency_mode;

typedef enum kvtier_block_residency {
  KVTIER_BLOCK_RESIDENT = 0, /* in HBM, pinned by the ticket */
  /* being onboarded: ASYNC before the ticket completes, or a block of which some layer had
   * landed, or that a stream waited on, at the deadline (it lands later; read its slot only for
   * the layers ready) */
  KVTIER_BLOCK_PENDING = 1,
  KVTIER_BLOCK_NOT_RESIDENT = 2 /* could not be made resident: recompute it (slot -1) */
} kvtier_block_residency;

typedef enum kvtier_event_kind {
  KVTIER_EVENT_STORED = 0,  /* a readable copy of the key exists in the tier from now on */
  KVTIER_EVENT_REMOVED = 1, /* the copy of the key in the tier is gone */
  /* kvtier_reset_prefix_cache cleared the tier (key 0, 0): every droppable copy there is gone,
   * each with its REMOVED first; copies held then stay (vLLM's AllBlocksCleared). */
  KVTIER_EVENT_ALL_CLEARED = 2
} kvtier_event_kind;

/* How a call that needs free HBM slots (kvtier_append, kvtier_fork, kvtier_truncate) behaves
 * while HBM is short (RoomWait). */
typedef enum kvtier_room_wait {
  /* Evict, and block up to the cache's room_wait_ns for demotions to land. */
  KVTIER_ROOM_WAIT = 0,
  /* Never block: evict what frees a slot at once, start the demotions that free the rest, and
   * answer RESOURCE_EXHAUSTED (nothing of the sequence changed) while the slots are not free yet,
   * so a scheduler tries again at a later step. kvtier_check_room tells in advance. */
  KVTIER_ROOM_NEVER = 1
} kvtier_room_wait;

/* Lower-case tier name ("hbm", "dram", "nvme", "remote"; "unknown" outside the enum); static. */
const char* kvtier_tier_name(kvtier_tier tier);

/* ---- Geometry and namespace (kvtier/kv_geometry.h, kvtier/cache_namespace.h) */

/* The shape of the model's KV cache as this process stores it (one tensor-parallel rank's). */
typedef struct kvtier_geometry_options {
  kvtier_attention_kind attention; /* default MHA */
  int32_t num_layers;              /* layers whose cache grows with context, >= 1 */
  int32_t num_kv_heads;            /* MHA: >= 1; MLA: 0 */
  int32_t head_dim;                /* MHA: elements per head, >= 1; MLA: 0 */
  int32_t kv_lora_rank;            /* MLA: latent width, >= 1; MHA: 0 */
  int32_t qk_rope_head_dim;        /* MLA: rope width, >= 0; MHA: 0 */
  kvtier_dtype dtype;              /* default BF16 */
  int32_t tokens_per_block;        /* in [1, 65536]; default 16 */
} kvtier_geometry_options;

/* What else decides a block's KV bytes. Two processes with equal options compute equal keys. */
typedef struct kvtier_namespace_options {
  const char* model_id;            /* NUL-terminated, 1 to 1024 bytes, e.g. "meta-llama/..." */
  const char* weights_fingerprint; /* NUL-terminated, 1 to 1024 bytes: the exact weights */
  kvtier_hbm_layout hbm_layout;    /* default LAYER_FIRST; the tier stack's HBM uses it */
  int32_t tp_rank;                 /* in [0, tp_size); default 0 */
  int32_t tp_size;                 /* in [1, 65536]; default 1 */
  int32_t pp_rank;                 /* in [0, pp_size); default 0 */
  int32_t pp_size;                 /* in [1, 65536]; default 1 */
  int32_t first_layer;             /* model index of this rank's first layer; default 0 */
} kvtier_namespace_options;

/* What follows from a namespace's geometry and identity. */
typedef struct kvtier_namespace_info {
  int64_t bytes_per_block;           /* one whole block: all layers and planes */
  int64_t bytes_per_block_per_layer; /* one block of one layer */
  int64_t bytes_per_token;           /* one token, all layers */
  int32_t tokens_per_block;
  int32_t num_layers;
  int32_t kv_planes; /* 2 (K and V) for MHA, 1 for MLA */
  int32_t dtype_bytes;
  char digest_hex[33]; /* the 128-bit namespace digest, 32 lower-case hex digits and a NUL */
} kvtier_namespace_info;

typedef struct kvtier_namespace kvtier_namespace;

/* Fill with the C++ defaults (every count 0: the caller sets num_layers, heads, head_dim). */
void kvtier_geometry_options_init(kvtier_geometry_options* options);
void kvtier_namespace_options_init(kvtier_namespace_options* options);

/* Validates both and creates the namespace into *out. Errors: INVALID_ARGUMENT naming the first
 * bad field (KvGeometry::Create's and CacheNamespace::Create's checks: a count out of range, a
 * field of the other attention kind set, an empty or too long model id or fingerprint, a rank
 * outside its size), or for a null pointer. */
kvtier_status_code kvtier_namespace_create(const kvtier_geometry_options* geometry,
                                           const kvtier_namespace_options* options,
                                           kvtier_namespace** out, kvtier_error* error);
/* Frees the handle. Caches and stacks created from it keep their own copy: it may go first. */
void kvtier_namespace_destroy(kvtier_namespace* ns);
/* Errors: INVALID_ARGUMENT for a null pointer. */
kvtier_status_code kvtier_namespace_get_info(const kvtier_namespace* ns, kvtier_namespace_info* out,
                                             kvtier_error* error);

/* ---- Tier stack (kvtier/tier_stack.h) */

typedef struct kvtier_tier_spec {
  int64_t capacity_blocks;       /* 0: the tier is absent; else >= 1 */
  kvtier_tier_backend_kind kind; /* default NATIVE */
} kvtier_tier_spec;

/* The tiers of a cache. HBM here is the host-emulated device tier (EmulatedHbm), a GPU's
 * (CudaHbm, hbm_backend CUDA), both in the namespace's hbm_layout, or a metadata tier. Strings
 * are NUL-terminated; NULL and "" mean unset. Fields of an absent or metadata tier are not
 * looked at. */
typedef struct kvtier_tier_stack_options {
  kvtier_tier_spec tiers[KVTIER_NUM_TIERS]; /* index kvtier_tier; all absent by default */
  /* Emulated HBM: refuse a pool larger than the memory available (MemAvailable and the room
   * under the process's cgroup memory limits). Default true. */
  bool hbm_check_available_memory;
  /* Native HBM's device: EMULATED (default) or CUDA on device cuda_device (default 0): without
   * a GPU UNAVAILABLE, in a build without CUDA UNIMPLEMENTED. */
  kvtier_hbm_backend hbm_backend;
  int32_t cuda_device;
  /* The engine's own KV tensors as the HBM pool instead of kvtier allocating one: host memory
   * for EMULATED, device memory for CUDA; one pointer per layer (the layer's tensor in the
   * namespace's layout: LAYER_FIRST [num_blocks][kv_planes][B][H][D], LAYER_KV_SPLIT
   * [kv_planes][num_blocks][B][H][D]) or one for BLOCK_FIRST; hbm_num_tensors of them (0 with
   * NULL: none). The caller keeps them alive until the cache is destroyed. */
  void* const* hbm_tensors;
  size_t hbm_num_tensors;
  /* DRAM (DramTierOptions): defaults true, true, true, true. */
  bool dram_try_huge_pages;
  bool dram_pin_for_cuda;
  bool dram_check_available_memory;
  bool dram_prefault;
  /* NVMe (NvmeTierOptions): a file (created, preallocated; an existing one is reopened and its
   * valid blocks recovered) or a block device. Required for a native NVMe tier. */
  const char* nvme_path;
  int32_t nvme_queue_depth; /* in [1, 4096]; default 16 */
  kvtier_nvme_engine nvme_engine;
  int32_t nvme_thread_pool_threads; /* default 4 */
  /* Remote: exactly one store, a directory (created if missing) or a URL
   * ("redis://[[user]:password@]host:port[/db]" or "redis-cluster://host:port[,host:port...]",
   * connected lazily). */
  const char* remote_directory;
  const char* remote_url;
  const char* remote_key_prefix;   /* NULL or "": "kvtier:" */
  kvtier_codec remote_codec;       /* default NONE */
  const char* remote_hmac_secret;  /* NULL or "": no MAC, frames carry XXH3-128 */
  int32_t remote_breaker_failures; /* failures that open the circuit breaker; default 5 */
  bool remote_delete_freed;        /* default true */
  bool remote_write_if_absent;     /* default true */
} kvtier_tier_stack_options;

/* Built tier backends waiting for a cache. */
typedef struct kvtier_tier_stack kvtier_tier_stack;

void kvtier_tier_stack_options_init(kvtier_tier_stack_options* options);

/* Builds every present tier for `ns` into *out (BuildTierStack). Errors: INVALID_ARGUMENT for a
 * negative capacity, an unknown kind or enum value, a native remote tier with no store or two,
 * a null pointer; otherwise the first failing backend's error, unchanged (INVALID_ARGUMENT for a
 * native NVMe tier without a path or a bad Redis URL, RESOURCE_EXHAUSTED for a pool over
 * the memory available (MemAvailable, cgroup limits) or a file that cannot be preallocated,
 * UNAVAILABLE for a file without O_DIRECT). Nothing is left built on error. */
kvtier_status_code kvtier_tier_stack_build(const kvtier_namespace* ns,
                                           const kvtier_tier_stack_options* options,
                                           kvtier_tier_stack** out, kvtier_error* error);
/* Frees a stack no cache took (its backends are destroyed). */
void kvtier_tier_stack_destroy(kvtier_tier_stack* stack);

/* ---- Cache (kvtier/kv_cache.h) */

/* KvCacheOptions less the tiers (a kvtier_tier_stack), the clock (absl::Now) and the policies'
 * own tuning (their defaults). */
typedef struct kvtier_cache_options {
  /* "lru" (NULL means it), "cost_aware", "reuse_index" or "learned"; one instance per tier. */
  const char* eviction_policy;
  kvtier_hash_algorithm hash;       /* default XXH3_128 */
  kvtier_write_policy write_policy; /* default WRITE_BACK */
  kvtier_tier_inclusion inclusion;  /* default INCLUSIVE */
  /* Uses a block needs before a tier stores it, >= 1; the HBM entry must be 1. Default 1s. */
  int32_t admit_after_uses[KVTIER_NUM_TIERS];
  bool demote_on_evict;            /* evicted blocks go one tier down; default true */
  bool measure_bandwidth;          /* links take the measured bandwidth; default true */
  double prefill_flops_per_second; /* for a model the cost model knows; default 4e14 */
  /* Restore cost per tier before a measurement (index kvtier_tier; HBM ignored): a latency per
   * restore and a bandwidth, > 0. Defaults: PCIe Gen5 DRAM, one Gen4 NVMe drive, 100 Gb/s. */
  int64_t link_latency_ns[KVTIER_NUM_TIERS];
  double link_bytes_per_second[KVTIER_NUM_TIERS];
  int64_t event_buffer;   /* events kept for kvtier_poll_events, >= 1; default 65536 */
  int64_t room_wait_ns;   /* how long append and onboarding wait for demotions; default 10 s */
  int32_t bounce_buffers; /* staging buffers of one block each, >= 1; default 4 */
  int32_t remote_probe_window_blocks; /* remote discovery, in [0, 4096]; 0 off; default 32 */
  int64_t remote_probe_timeout_ns;    /* > 0; default 20 ms */
  /* This worker's name in the fleet ("host3:gpu1"), copied into every event's worker_id;
   * NUL-terminated, at most 256 bytes, copied by kvtier_cache_create. NULL (the default): none. */
  const char* worker_id;
  /* Demote a victim only if it is worth restoring later (KvCacheOptions::demote_by_value);
   * default true. */
  bool demote_by_value;
} kvtier_cache_options;

typedef struct kvtier_cache kvtier_cache;

void kvtier_cache_options_init(kvtier_cache_options* options);

/* Creates a cache over `tiers` (which must hold an HBM tier) into *out. The cache copies `ns`.
 * `tiers` is always taken, on success and on error: do not use or destroy it afterwards.
 * `options` may be NULL (the defaults). Errors: INVALID_ARGUMENT for a null ns or tiers, a
 * missing HBM tier, an unknown eviction policy and the other option checks of KvCache::Create;
 * RESOURCE_EXHAUSTED if the staging buffers cannot be allocated. */
kvtier_status_code kvtier_cache_create(const kvtier_namespace* ns, kvtier_tier_stack* tiers,
                                       const kvtier_cache_options* options, kvtier_cache** out,
                                       kvtier_error* error);
/* Waits for every transfer in flight, then frees the cache and its tiers. Tickets and completions
 * still held stay valid handles (their accessors answer; a ticket's pool addresses do not) and
 * are destroyed by the caller as usual. */
void kvtier_cache_destroy(kvtier_cache* cache);

/* ---- Sequences */

/* One multimodal item whose placeholder tokens are [start_token, start_token + num_tokens). */
typedef struct kvtier_multimodal_item {
  int64_t start_token;   /* >= 0, absolute in the sequence */
  int64_t num_tokens;    /* >= 1 */
  const uint8_t* digest; /* the item's content digest */
  size_t digest_bytes;   /* 1 to 64 bytes (PrefixHasher::kMaxDigestBytes) */
} kvtier_multimodal_item;

/* A sequence's identity extras (blocks computed under other extras never match) and retention.
 * Also the `identity` of lookup, prefetch, retain and invalidate (retention ignored there).
 * Arrays and strings are read during the call only. */
typedef struct kvtier_sequence_options {
  const char* adapter_id;           /* LoRA adapter, NUL-terminated; NULL: none */
  uint64_t adapter_load_generation; /* compared exactly */
  const uint8_t* tenant_salt;       /* NULL: none; else tenant_salt_bytes bytes (0 is a salt) */
  size_t tenant_salt_bytes;
  const kvtier_multimodal_item* multimodal; /* sorted by start, not overlapping */
  size_t num_multimodal;
  double retention_priority; /* >= 0: how much more valuable the released blocks count */
  int64_t retention_ns;      /* >= 0: for how long after the release */
  uint64_t session;          /* the agent session (conversation); 0: none */
  /* false: prefix caching is off for this sequence (vLLM's per-request caching off): its blocks
   * are never indexed, so nothing is shared with other requests and they are freed when it lets
   * them go; kvtier_attach_prefix attaches nothing to it; kvtier_pause fails on it
   * (FAILED_PRECONDITION). Default true. */
  bool enable_caching;
  /* true: this request re-admits one the scheduler preempted (kvtier_release_hints.preempted):
   * what kvtier_attach_prefix attaches is its own KV coming back, counted in
   * kvtier_cache_stats.readmitted_blocks, not as tier hits. Default false. Neither field is
   * looked at in the `identity` of a prefix call (lookup, prefetch, retain, invalidate). */
  bool readmission;
} kvtier_sequence_options;

/* Fills with the C++ defaults: no extras, no retention, no session, enable_caching true,
 * readmission false. */
void kvtier_sequence_options_init(kvtier_sequence_options* options);

/* A new, empty sequence `id` (any value but UINT64_MAX). `options` may be NULL. Errors:
 * INVALID_ARGUMENT for id UINT64_MAX, bad extras or a negative retention; ALREADY_EXISTS if
 * `id` is live. */
kvtier_status_code kvtier_sequence_create(kvtier_cache* cache, uint64_t id,
                                          const kvtier_sequence_options* options,
                                          kvtier_error* error);

typedef struct kvtier_attach_result {
  int64_t matched_tokens;  /* longest cached prefix of the prompt, whole blocks */
  int64_t attached_tokens; /* tokens now in the sequence: prefill starts here */
  /* Attached blocks by the tier they were in (index kvtier_tier); those below HBM are onboarded
   * by kvtier_ensure_resident or kvtier_resume. */
  int64_t attached_blocks_by_tier[KVTIER_NUM_TIERS];
  /* The cost model's plan: restore blocks [0, restore_blocks), recompute the rest. */
  int64_t restore_blocks;
  int64_t recompute_from_token;
  int64_t cached_but_recomputed_blocks;
  int64_t restore_time_ns;
  int64_t recompute_time_ns;
} kvtier_attach_result;

/* Attaches the longest cached prefix of prompt[0, num_tokens) worth restoring to the empty
 * sequence `id` (the prompt's last token is always left to compute). May block up to the remote
 * probe timeout. Errors: NOT_FOUND for an unknown sequence; FAILED_PRECONDITION if released or
 * not empty; INVALID_ARGUMENT for an empty prompt or extras that do not fit it. */
kvtier_status_code kvtier_attach_prefix(kvtier_cache* cache, uint64_t id, const int32_t* prompt,
                                        size_t num_tokens, kvtier_attach_result* out,
                                        kvtier_error* error);

typedef struct kvtier_append_result {
  int64_t first_sealed_block; /* logical index of the first block that became full */
  int64_t num_sealed_blocks;  /* blocks that became full (keyed; shareable once written) */
  int64_t num_new_slots;      /* HBM slots allocated */
} kvtier_append_result;

/* Appends tokens[0, num_tokens), all or nothing. With KVTIER_ROOM_WAIT it may block up to
 * room_wait_ns while demotions free HBM; with KVTIER_ROOM_NEVER it never blocks. `wait` is a
 * parameter of the call (not a second function, not a cache option) because the C++ method takes
 * it per call and a scheduler chooses it per call: one C function per C++ method, and every
 * caller says at the call whether it may block. `out` may be NULL. Errors: NOT_FOUND /
 * FAILED_PRECONDITION for an unknown / released sequence; INVALID_ARGUMENT for no tokens or a
 * `wait` outside the enum; RESOURCE_EXHAUSTED if HBM has no room (at once with ROOM_NEVER, while
 * the slots are not free yet; the sequence is unchanged). */
kvtier_status_code kvtier_append(kvtier_cache* cache, uint64_t id, const int32_t* tokens,
                                 size_t num_tokens, kvtier_room_wait wait,
                                 kvtier_append_result* out, kvtier_error* error);

/* A one-shot outcome shared by its handles (kvtier/completion.h). */
typedef struct kvtier_completion kvtier_completion;

/* The KV of tokens [0, num_tokens) is in HBM once `ready` fires OK (NULL: it is already). Full
 * blocks in the range then become matchable by other requests. `ready` is only read: the caller
 * keeps its handle. Errors: NOT_FOUND / FAILED_PRECONDITION as above; OUT_OF_RANGE if num_tokens
 * is past the sequence's end; INVALID_ARGUMENT if below what was reported before. */
kvtier_status_code kvtier_report_written(kvtier_cache* cache, uint64_t id, int64_t num_tokens,
                                         const kvtier_completion* ready, kvtier_error* error);

/* What kvtier_fork or kvtier_truncate asks the caller to copy when the fork point or the cut is
 * inside a full block. */
typedef struct kvtier_block_copy {
  bool needed;        /* false: nothing to copy (the other fields are 0) */
  int32_t src_slot;   /* the parent's (truncate: the cut block's) HBM slot */
  int32_t dst_slot;   /* the child's (truncate: the sequence's new) private HBM slot */
  int32_t num_tokens; /* copy token positions [0, num_tokens) of every layer, before a kernel
                         reads dst; fork: before the parent is released or paused; truncate:
                         src stays the sequence's until its next append, report_written,
                         truncate or release */
} kvtier_block_copy;

/* A new sequence `child` with `parent`'s first num_tokens tokens and its options; full blocks
 * are shared. `wait` as kvtier_append's (the copy's slot). `copy` may be NULL only if the
 * caller knows num_tokens is a block multiple. Errors: NOT_FOUND / FAILED_PRECONDITION for the
 * parent; ALREADY_EXISTS for a live child; INVALID_ARGUMENT for child UINT64_MAX or a `wait`
 * outside the enum; OUT_OF_RANGE for num_tokens < 0 or past the parent's end;
 * FAILED_PRECONDITION if the block to copy is not in HBM; RESOURCE_EXHAUSTED if HBM has no slot
 * for the copy (at once with ROOM_NEVER). */
kvtier_status_code kvtier_fork(kvtier_cache* cache, uint64_t parent, uint64_t child,
                               int64_t num_tokens, kvtier_room_wait wait, kvtier_block_copy* copy,
                               kvtier_error* error);

/* Cuts sequence `id` back to its first num_tokens tokens (rejected speculative tokens, a pruned
 * beam). Blocks wholly past the cut are let go (cached ones stay cached for others, private ones
 * are freed); written tokens are clipped to the cut. A cut inside a full block gives the
 * sequence a fresh private HBM slot for its new partial last block and fills *copy (needed, with
 * num_tokens = num_tokens % tokens_per_block), which the caller performs before a kernel reads
 * dst_slot; a cut inside the partial last block or at a block boundary moves nothing (needed
 * false). `wait` as kvtier_append's (the copy's slot). `copy` may be NULL only if the caller
 * knows no copy can be needed. Errors: NOT_FOUND / FAILED_PRECONDITION for an unknown /
 * released sequence; OUT_OF_RANGE for num_tokens < 0 or past the sequence's end;
 * FAILED_PRECONDITION if the cut block is not in HBM (make it resident first);
 * INVALID_ARGUMENT for a `wait` outside the enum; RESOURCE_EXHAUSTED if HBM has no slot for the
 * copy (at once with ROOM_NEVER). */
kvtier_status_code kvtier_truncate(kvtier_cache* cache, uint64_t id, int64_t num_tokens,
                                   kvtier_room_wait wait, kvtier_block_copy* copy,
                                   kvtier_error* error);

/* Whether HBM has room for a request now (RoomCheck), read from counters without evicting,
 * moving or waiting. Counts are HBM slots (blocks). */
typedef struct kvtier_room_check {
  int64_t needed_slots; /* new slots the request takes beyond what its sequence holds */
  int64_t free_slots;   /* free now */
  /* Cached blocks nobody holds, less those a ticket locks or a transfer reads: eviction frees
   * them (dropped, or once their demotion lands). */
  int64_t evictable_slots;
  int64_t demotions_in_flight; /* leaving HBM: each frees its slot when it lands */
  bool fits_now;               /* needed <= free: a ROOM_NEVER append succeeds now */
  /* needed <= free + evictable + demotions in flight + slots only a running kernel's write
   * holds (freed when its kvtier_report_written completion fires) */
  bool fits_after_evictions;
  /* Slots neither eviction nor a running kernel's completion frees: what running sequences or
   * tickets must let go first (preempt). kvtier_append does not wait for kernels: until their
   * completions fire it may return RESOURCE_EXHAUSTED although fits_after_evictions is true. */
  int64_t missing_slots;
} kvtier_room_check;

/* Whether num_new_tokens more tokens of sequence `id` fit in HBM now, into *out. Never blocks on
 * transfers; takes the cache lock briefly. Errors: NOT_FOUND / FAILED_PRECONDITION for an
 * unknown / released sequence; INVALID_ARGUMENT for a negative count or a null out. */
kvtier_status_code kvtier_check_room(const kvtier_cache* cache, uint64_t id, int64_t num_new_tokens,
                                     kvtier_room_check* out, kvtier_error* error);
/* The same for a request not yet created that needs num_slots new blocks. Errors:
 * INVALID_ARGUMENT for a negative count or a null out. */
kvtier_status_code kvtier_check_room_for_slots(const kvtier_cache* cache, int64_t num_slots,
                                               kvtier_room_check* out, kvtier_error* error);

/* Releases the sequence: its written full blocks stay cached. Errors: NOT_FOUND for an unknown
 * id; FAILED_PRECONDITION for a second release. */
kvtier_status_code kvtier_release(kvtier_cache* cache, uint64_t id, kvtier_error* error);

/* What is known, at release, of the session's next request. */
typedef struct kvtier_release_hints {
  kvtier_stop_reason stop_reason;
  bool has_expected_idle;   /* false: expected_idle_ns is not looked at */
  int64_t expected_idle_ns; /* about how long until the next request, >= 0 */
  /* The scheduler preempted the request (it comes back as a sequence created with
   * `readmission`): counted in kvtier_cache_stats.preemptions, whatever the outcome. */
  bool preempted;
  /* The session sends no further request (a sub-agent's end_turn): its blocks go first
   * (ReleaseHints::last_turn in kvtier/kv_cache.h). */
  bool last_turn;
} kvtier_release_hints;

/* Bytes of kvtier_hint_outcome::reason, NUL included. */
#define KVTIER_HINT_REASON_BYTES 256

typedef struct kvtier_hint_outcome {
  kvtier_hint_result result;
  int64_t blocks;                        /* blocks the hint applies to */
  char reason[KVTIER_HINT_REASON_BYTES]; /* NUL-terminated; empty when accepted */
} kvtier_hint_outcome;

/* Release with hints; the release happens whatever the hints are. A hint the cache cannot use
 * (a sequence without a session, a negative idle, a stop_reason outside kvtier_stop_reason, which
 * is released as UNKNOWN) is answered REJECTED in `outcome` (may be NULL), not as an error, and
 * the other hints are taken where they apply; one taken in part (an idle estimate beside
 * last_turn, last_turn on a preempted request) CLIPPED. Errors: as kvtier_release, and
 * INVALID_ARGUMENT for a null hints. */
kvtier_status_code kvtier_release_with_hints(kvtier_cache* cache, uint64_t id,
                                             const kvtier_release_hints* hints,
                                             kvtier_hint_outcome* outcome, kvtier_error* error);

/* The sequence will be idle for about expected_idle_ns (a tool call): its written full blocks
 * get a copy one tier down and its HBM copies become droppable. Errors: as kvtier_release;
 * INVALID_ARGUMENT for a negative duration; FAILED_PRECONDITION if already paused. */
kvtier_status_code kvtier_pause(kvtier_cache* cache, uint64_t id, int64_t expected_idle_ns,
                                kvtier_error* error);
/* What is known when a sequence pauses (PauseHints in kvtier/kv_cache.h). */
typedef struct kvtier_pause_hints {
  bool has_expected_idle;   /* false: expected_idle_ns is not looked at */
  int64_t expected_idle_ns; /* about how long the sequence will be idle, >= 0 */
  /* The scheduler swapped the request out to make room (it resumes when there is room, not at
   * the session's next request): counted in kvtier_cache_stats.preemptions, whatever the
   * outcome; its kvtier_resume is a readmission, not the session's return. false: a tool wait. */
  bool preempted;
} kvtier_pause_hints;

/* kvtier_pause with hints; the pause happens whatever the hints are. A hint the cache cannot use
 * (a sequence without a session, a negative idle) is answered REJECTED in `outcome` (may be
 * NULL), not as an error. Errors: as kvtier_release; FAILED_PRECONDITION if already paused or
 * for a sequence with caching off; INVALID_ARGUMENT for a null hints. */
kvtier_status_code kvtier_pause_with_hints(kvtier_cache* cache, uint64_t id,
                                           const kvtier_pause_hints* hints,
                                           kvtier_hint_outcome* outcome, kvtier_error* error);
/* Ends a pause and starts onboarding the sequence's blocks. *onboarded (if not NULL) receives a
 * new completion handle, which the caller destroys, firing OK when they are resident or
 * UNAVAILABLE naming the first that is not. May block up to room_wait. Errors: as kvtier_release;
 * FAILED_PRECONDITION if not paused. */
kvtier_status_code kvtier_resume(kvtier_cache* cache, uint64_t id, kvtier_completion** onboarded,
                                 kvtier_error* error);

typedef struct kvtier_sequence_info {
  int64_t num_tokens;
  int64_t written_tokens; /* reported written, or attached */
  int64_t num_blocks;
  int64_t blocks_by_tier[KVTIER_NUM_TIERS]; /* where its references are */
  bool paused;
} kvtier_sequence_info;

/* Errors: NOT_FOUND / FAILED_PRECONDITION for an unknown / released sequence. */
kvtier_status_code kvtier_get_sequence(const kvtier_cache* cache, uint64_t id,
                                       kvtier_sequence_info* out, kvtier_error* error);

/* ---- Prefix hints and lookups (no sequence). `identity` may be NULL: no extras. */

/* Starts onboarding the cached prefix of tokens into HBM as droppable blocks; *blocks_started
 * (may be NULL) is how many (0 for an empty prompt). Errors: INVALID_ARGUMENT for bad extras. */
kvtier_status_code kvtier_prefetch(kvtier_cache* cache, const int32_t* tokens, size_t num_tokens,
                                   const kvtier_sequence_options* identity, int64_t* blocks_started,
                                   kvtier_error* error);
/* The cached leading blocks of tokens count `priority` more valuable for ttl_ns from now. A
 * priority < 0 or ttl_ns <= 0 is REJECTED in `outcome` (may be NULL). Errors: INVALID_ARGUMENT
 * for bad extras. */
kvtier_status_code kvtier_retain_prefix(kvtier_cache* cache, const int32_t* tokens,
                                        size_t num_tokens, double priority, int64_t ttl_ns,
                                        const kvtier_sequence_options* identity,
                                        kvtier_hint_outcome* outcome, kvtier_error* error);
/* Drops the blocks of tokens from block from_token / tokens_per_block on, from every tier, where
 * nobody holds them and no cached child outside them needs them (KvCache::InvalidatePrefix: a
 * child with a copy in any tier keeps its parent's last copy). from_token < 0 is REJECTED in
 * `outcome`. Errors: INVALID_ARGUMENT for bad extras. */
kvtier_status_code kvtier_invalidate_prefix(kvtier_cache* cache, const int32_t* tokens,
                                            size_t num_tokens, int64_t from_token,
                                            const kvtier_sequence_options* identity,
                                            kvtier_hint_outcome* outcome, kvtier_error* error);
/* The same two hints for a session (kvtier_sequence_options.session) instead of tokens: they act
 * on the blocks of the session's latest released or paused request, a release while a later
 * request of the session was live excepted (KvCache::RetainSession and InvalidateSession; the
 * cache remembers a bounded number of sessions). Session 0, a session
 * with no remembered request, and (retain) a priority < 0 or ttl_ns <= 0 are REJECTED in
 * `outcome` (may be NULL). Errors: INVALID_ARGUMENT for a NULL cache. */
kvtier_status_code kvtier_retain_session(kvtier_cache* cache, uint64_t session, double priority,
                                         int64_t ttl_ns, kvtier_hint_outcome* outcome,
                                         kvtier_error* error);
kvtier_status_code kvtier_invalidate_session(kvtier_cache* cache, uint64_t session,
                                             kvtier_hint_outcome* outcome, kvtier_error* error);

typedef struct kvtier_prefix_lookup {
  int64_t matched_tokens;                   /* longest cached prefix, whole blocks */
  int64_t blocks_by_tier[KVTIER_NUM_TIERS]; /* by the fastest tier with a ready copy */
  int64_t discovered_blocks;                /* of those, found by remote discovery */
} kvtier_prefix_lookup;

/* How much of tokens is cached, where; changes nothing but the probe counters. May block up to
 * the remote probe timeout. Errors: INVALID_ARGUMENT for bad extras. */
kvtier_status_code kvtier_lookup(const kvtier_cache* cache, const int32_t* tokens,
                                 size_t num_tokens, const kvtier_sequence_options* identity,
                                 kvtier_prefix_lookup* out, kvtier_error* error);

/* ---- Residency tickets: blocks pinned in HBM for a kernel */

typedef struct kvtier_ticket kvtier_ticket;

typedef struct kvtier_residency_options {
  kvtier_residency_mode mode; /* default WAIT */
  int64_t timeout_ns; /* deadline from now; negative: none (default). 0 is a deadline past */
} kvtier_residency_options;

void kvtier_residency_options_init(kvtier_residency_options* options);

/* Makes blocks [begin_token / B, ceil(end_token / B)) of the sequence resident in HBM and pins
 * them; *out receives a new ticket handle. Blocks not resident by the deadline are reported
 * NOT_RESIDENT with slot -1, never missing, except a block of which some layer has landed by then,
 * or that a stream waits on: it stays PENDING until it lands or fails, and on a
 * layer-wise HBM tier already has its slot, readable only for the layers ready
 * (kvtier_ticket_wait_layer; KvCache::EnsureResident in kvtier/kv_cache.h). WAIT blocks until
 * done or the deadline. `options` may be NULL (WAIT, no deadline). Errors: NOT_FOUND /
 * FAILED_PRECONDITION for the sequence; INVALID_ARGUMENT if begin_token > end_token or
 * begin_token < 0; OUT_OF_RANGE if end_token is past the sequence's tokens; DEADLINE_EXCEEDED if
 * the deadline has already passed. */
kvtier_status_code kvtier_ensure_resident(kvtier_cache* cache, uint64_t id, int64_t begin_token,
                                          int64_t end_token,
                                          const kvtier_residency_options* options,
                                          kvtier_ticket** out, kvtier_error* error);

typedef struct kvtier_ticket_info {
  uint64_t id;
  uint64_t sequence;
  int64_t begin_token;
  int64_t end_token;
  int32_t first_block; /* logical index of the table's first block in the sequence */
  int32_t num_blocks;  /* entries of the block table */
  int32_t tokens_per_block;
  int32_t tokens_in_last_block; /* the sequence's tokens in the range's last block, [0, B] */
  int64_t resident_tokens;      /* tokens of the range covered by its leading resident blocks */
} kvtier_ticket_info;

/* For ASYNC, the table and statuses are final only once the ticket has completed. Errors:
 * INVALID_ARGUMENT for a null pointer. */
kvtier_status_code kvtier_ticket_get_info(const kvtier_ticket* ticket, kvtier_ticket_info* out,
                                          kvtier_error* error);

/* The device block table (DeviceBlockTable), copied into caller arrays of `capacity` entries:
 * slots[i] is the HBM slot index of logical block first_block + i (-1: not resident; the kernel
 * must not read it; a PENDING block's slot holds only the layers ready), logical_blocks[i] (if not
 * NULL) that logical index. *num_blocks receives the table's size; with capacity 0 and both
 * arrays NULL the call only reports it. Errors:
 * INVALID_ARGUMENT for a null ticket or num_blocks, or a capacity below the table's size (then
 * *num_blocks is still written and the arrays are not). */
kvtier_status_code kvtier_ticket_block_table(const kvtier_ticket* ticket, int32_t* slots,
                                             int32_t* logical_blocks, size_t capacity,
                                             size_t* num_blocks, kvtier_error* error);
/* Each block's residency, as kvtier_ticket_block_table (same size rule). */
kvtier_status_code kvtier_ticket_block_status(const kvtier_ticket* ticket,
                                              kvtier_block_residency* status, size_t capacity,
                                              size_t* num_blocks, kvtier_error* error);
/* Why block `index` of the table is not resident: writes its cause into *cause (OK with an empty
 * message for a resident block; DEADLINE_EXCEEDED, DATA_LOSS, ... otherwise). The return value
 * is the call's own status. Errors: INVALID_ARGUMENT for a null pointer; OUT_OF_RANGE for an index
 * outside the table. */
kvtier_status_code kvtier_ticket_block_error(const kvtier_ticket* ticket, size_t index,
                                             kvtier_error* cause, kvtier_error* error);

/* The HBM pool's addresses (DevicePoolView; kvtier/device_block_table.h). Element (token t of
 * table entry i, KV head h, dimension d) of layer l is at
 *   k_base[l] + slots[i] * block_stride_bytes + t * token_stride_bytes
 *     + h * head_stride_bytes + d * dtype_bytes
 * and V the same from v_base[l] (MHA; for MLA v_base entries are NULL). */
typedef struct kvtier_device_pool {
  int32_t num_layers;
  bool host_accessible; /* true: the CPU may dereference the addresses (emulated HBM) */
  int64_t block_stride_bytes;
  int64_t token_stride_bytes;
  int64_t head_stride_bytes; /* 0 for MLA */
} kvtier_device_pool;

/* Fills *pool and, if not NULL, k_base and v_base (arrays of `layers_capacity` entries, one per
 * layer). The addresses belong to the HBM tier: valid while the cache lives; a slot's bytes are
 * this ticket's only while it is held (not released). Errors: INVALID_ARGUMENT for a null ticket
 * or pool, or a layers_capacity below num_layers with an array given (*pool is still written);
 * FAILED_PRECONDITION for a ticket whose HBM tier has no pool view (a metadata tier). */
kvtier_status_code kvtier_ticket_device_pool(const kvtier_ticket* ticket, kvtier_device_pool* pool,
                                             void** k_base, void** v_base, size_t layers_capacity,
                                             kvtier_error* error);

/* Waits up to timeout_ns (negative: for ever) for the ticket to complete. Returns its outcome:
 * OK when every block is resident, UNAVAILABLE naming the first that is not; or
 * DEADLINE_EXCEEDED if the timeout passed first (the onboarding goes on). A WAIT or BEST_EFFORT
 * ticket has completed on return from kvtier_ensure_resident, unless a WAIT's deadline passed
 * with some layer of a block landed or a stream waiting on it (that block is PENDING until it
 * lands or fails). */
kvtier_status_code kvtier_ticket_wait(const kvtier_ticket* ticket, int64_t timeout_ns,
                                      kvtier_error* error);
/* A new handle on the ticket's completion, which the caller destroys. */
kvtier_status_code kvtier_ticket_completion(const kvtier_ticket* ticket, kvtier_completion** out,
                                            kvtier_error* error);

/* Layer-wise readiness (ResidencyTicket::layer_ready in kvtier/kv_cache.h): layer `layer` of
 * every block of the range is in HBM, so the kernel of that layer may run while later layers are
 * still in transfer; once it has, the block table is final for that layer. *num_layers receives
 * the geometry's layer count. Errors: INVALID_ARGUMENT for a null pointer. */
kvtier_status_code kvtier_ticket_num_layers(const kvtier_ticket* ticket, int32_t* num_layers,
                                            kvtier_error* error);
/* Waits up to timeout_ns (negative: for ever) for layer `layer`. Returns OK when it is ready;
 * UNAVAILABLE naming the block when some block's layer cannot be; DEADLINE_EXCEEDED if the
 * timeout passed first; OUT_OF_RANGE for a layer outside [0, num_layers); INVALID_ARGUMENT for a
 * null ticket. */
kvtier_status_code kvtier_ticket_wait_layer(const kvtier_ticket* ticket, int32_t layer,
                                            int64_t timeout_ns, kvtier_error* error);
/* A new handle on layer `layer`'s completion, which the caller destroys (a layer outside the
 * geometry gives one that has fired OUT_OF_RANGE). Errors: INVALID_ARGUMENT for a null pointer. */
kvtier_status_code kvtier_ticket_layer_completion(const kvtier_ticket* ticket, int32_t layer,
                                                  kvtier_completion** out, kvtier_error* error);
/* Makes the CUDA stream `cuda_stream` (a cudaStream_t; NULL: the legacy default stream) wait on
 * the device for layer `layer` (-1: every layer) of every block, without the host waiting for
 * the copies (ResidencyTicket::EnqueueStreamWait): the host waits only, up to timeout_ns
 * (negative: for ever), for blocks whose copy is not yet queued on the GPU, or, on a tier
 * without CUDA (the emulated HBM), for the layer to land. Errors: INVALID_ARGUMENT for a null
 * ticket; OUT_OF_RANGE for a bad layer; UNAVAILABLE naming a block that cannot be made resident
 * (recompute it) or with the CUDA error text; DEADLINE_EXCEEDED. */
kvtier_status_code kvtier_ticket_stream_wait(const kvtier_ticket* ticket, void* cuda_stream,
                                             int32_t layer, int64_t timeout_ns,
                                             kvtier_error* error);

/* Unpins the ticket's blocks (the handle stays valid: its accessors still answer). Errors:
 * INVALID_ARGUMENT for a null pointer; NOT_FOUND for a ticket of another cache;
 * FAILED_PRECONDITION for a second release. */
kvtier_status_code kvtier_release_ticket(kvtier_cache* cache, const kvtier_ticket* ticket,
                                         kvtier_error* error);
/* Frees the handle, releasing the ticket first if it was not (RAII: a destroyed ticket never
 * pins HBM). May run after the cache is gone. */
void kvtier_ticket_destroy(kvtier_ticket* ticket);

/* ---- Completions */

/* A new pending completion (e.g. a kernel's, for kvtier_report_written), fired by the caller
 * with kvtier_completion_complete. Errors: INVALID_ARGUMENT for a null out. */
kvtier_status_code kvtier_completion_create(kvtier_completion** out, kvtier_error* error);
/* Fires it with `code` and `message` (may be NULL); *fired (may be NULL) is false if it had
 * already fired (the first outcome wins). Callbacks of the cache waiting on it (e.g. indexing the
 * reported blocks) run on this thread before the call returns. Errors: INVALID_ARGUMENT for a null
 * completion or a code outside the enum; FAILED_PRECONDITION for a completion the cache fires (a
 * ticket's, a layer's, a resume's, a CUDA event's): only one from kvtier_completion_create is the
 * caller's to fire. */
kvtier_status_code kvtier_completion_complete(const kvtier_completion* completion,
                                              kvtier_status_code code, const char* message,
                                              bool* fired, kvtier_error* error);
/* Whether it has fired (false for NULL). Never blocks. */
bool kvtier_completion_done(const kvtier_completion* completion);
/* Waits up to timeout_ns (negative: for ever); returns the outcome, or DEADLINE_EXCEEDED if the
 * timeout passed first (the operation goes on). INVALID_ARGUMENT for a null completion. */
kvtier_status_code kvtier_completion_wait(const kvtier_completion* completion, int64_t timeout_ns,
                                          kvtier_error* error);
/* Frees the handle; the operation and other handles are not affected. */
void kvtier_completion_destroy(kvtier_completion* completion);
/* A new completion that fires when the GPU reaches the CUDA event `cuda_event` (a cudaEvent_t the
 * caller recorded on its stream after the kernel that wrote the KV), as recorded now: the caller
 * may record or destroy its event again at once (KvCache::CompletionOfCudaEvent). For
 * kvtier_report_written without a host wait. Errors: INVALID_ARGUMENT for a null pointer or
 * event; UNIMPLEMENTED when the cache's HBM tier is not CUDA memory (the emulated HBM: use
 * kvtier_completion_create and fire it); UNAVAILABLE with the CUDA error text. */
kvtier_status_code kvtier_completion_from_cuda_event(kvtier_cache* cache, void* cuda_event,
                                                     kvtier_completion** out,
                                                     kvtier_error* error);

/* ---- Stats, events, invariants (kvtier/kv_cache_stats.h) */

typedef struct kvtier_tier_stats {
  bool present; /* the tier is configured; every other field is 0 if not */
  /* Gauges, blocks: free + locked + held + droppable + in_flight + quarantined == capacity. */
  int64_t capacity_blocks;
  int64_t free_blocks;
  int64_t locked_blocks;    /* HBM: pinned by a ticket, or a kernel's unindexed write */
  int64_t held_blocks;      /* referenced by a sequence (or a transfer reading it) */
  int64_t droppable_blocks; /* cached, referenced by nobody: evictable */
  int64_t in_flight_blocks; /* destinations of transfers still running */
  int64_t quarantined_blocks;
  /* Counters since creation. */
  int64_t hits;      /* attached blocks whose fastest ready copy was here */
  int64_t misses;    /* full blocks of attach queries matched neither here nor above */
  int64_t bytes_in;  /* bytes copied into this tier */
  int64_t bytes_out; /* bytes copied out of this tier */
  int64_t stored;    /* block copies that became readable here */
  int64_t evictions; /* copies dropped to make room */
  int64_t demotions; /* evictions that first copied the block one tier down */
  int64_t failed_loads;
  int64_t corrupt_reads;
  int64_t missing_reads;
  int64_t failed_stores;
  int64_t value_drops;            /* victims dropped rather than demoted: not worth restoring */
  int64_t policy_shadow_us;       /* "learned": microseconds in its shadow caches */
  int64_t policy_leader_changes;  /* "learned": switches of the candidate it follows */
  int64_t policy_shadow_accesses; /* "learned": prompt blocks its shadow caches simulated */
} kvtier_tier_stats;

typedef struct kvtier_cache_stats {
  kvtier_tier_stats tiers[KVTIER_NUM_TIERS]; /* index kvtier_tier */
  int64_t live_sequences;
  int64_t open_tickets;
  int64_t attach_queries;
  int64_t query_tokens;    /* prompt tokens of attach queries */
  int64_t matched_tokens;  /* of those, in the longest cached prefix */
  int64_t attached_tokens; /* of those, restored */
  int64_t cached_but_recomputed_blocks;
  int64_t indexed_blocks; /* blocks with a copy in some tier (gauge) */
  int64_t preemptions;    /* releases with kvtier_release_hints.preempted */
  int64_t readmitted_blocks; /* blocks attached by readmissions (not counted as hits) */
  /* Copies that arrived, blocks_moved[from][to]: onboards [t][HBM], demotions [t][t+k]. */
  int64_t blocks_moved[KVTIER_NUM_TIERS][KVTIER_NUM_TIERS];
  uint64_t last_event_sequence; /* 0 before the first event */
  /* Remote discovery. */
  int64_t remote_probes;
  int64_t remote_probe_failures;
  int64_t remote_keys_probed;
  int64_t remote_blocks_found;
  int64_t remote_blocks_indexed;
  int64_t remote_probe_latency_us_total;
  int64_t remote_probe_latency_us_max;
} kvtier_cache_stats;

/* A snapshot of the counters. Errors: INVALID_ARGUMENT for a null pointer. */
kvtier_status_code kvtier_cache_get_stats(const kvtier_cache* cache, kvtier_cache_stats* out,
                                          kvtier_error* error);
/* The stats in the Prometheus text format into buf (NUL-terminated). *needed_bytes (may be NULL)
 * receives the text's size plus its NUL. Errors: INVALID_ARGUMENT for a null cache, or a buffer
 * smaller than needed (nothing is written to it); buf NULL with capacity 0 asks the size. */
kvtier_status_code kvtier_cache_render_prometheus(const kvtier_cache* cache, char* buf,
                                                  size_t capacity, size_t* needed_bytes,
                                                  kvtier_error* error);

typedef struct kvtier_event {
  uint64_t sequence; /* 1 for the first event, +1 per event */
  kvtier_event_kind kind;
  kvtier_tier tier;
  uint64_t key_hi; /* the block key, big-endian bytes 0..7 */
  uint64_t key_lo; /* bytes 8..15 */
  /* The block's parent in the prefix chain (vLLM's parent_block_hash): parent_key_* is the
   * previous block's key when has_parent; false (key 0, 0) for a sequence's first block, for
   * ALL_CLEARED and for a block a warm restart found again (its parent is unknown). */
  bool has_parent;
  uint64_t parent_key_hi;
  uint64_t parent_key_lo;
  int32_t num_tokens; /* tokens in the block (tokens_per_block); 0 for ALL_CLEARED */
  /* The block's adapter id (AdapterIdentity id, vLLM's lora_name) and the cache's worker_id:
   * NUL-terminated, never NULL ("" for none), owned by the cache and valid until
   * kvtier_cache_destroy (copy them to keep an event longer); *_size excludes the NUL. */
  const char* adapter_id;
  size_t adapter_id_size;
  const char* worker_id;
  size_t worker_id_size;
} kvtier_event;

/* Up to `capacity` events with sequence > after_sequence, oldest first, into events;
 * *num_events receives how many. A first event above after_sequence + 1 means events were
 * dropped (the cache keeps event_buffer of them). Errors: INVALID_ARGUMENT for a null pointer
 * (events may be NULL only with capacity 0). */
kvtier_status_code kvtier_poll_events(const kvtier_cache* cache, uint64_t after_sequence,
                                      kvtier_event* events, size_t capacity, size_t* num_events,
                                      kvtier_error* error);

/* Drops every droppable cached copy of *tier, or of every tier (tier NULL): copies no sequence
 * holds, no ticket locks, no transfer reads and no demotion is taking away (vLLM's
 * reset_prefix_cache). Held and busy copies stay. A dropped remote copy is deleted from the store
 * too (other workers lose it). Emits a REMOVED event per copy, then one ALL_CLEARED per tier
 * cleared (every present tier, fastest first, for NULL). *dropped (may be NULL) receives how many
 * copies were dropped. Thread-safe; never waits for transfers. Errors: INVALID_ARGUMENT for a
 * tier outside the enum or one the cache does not have. */
kvtier_status_code kvtier_reset_prefix_cache(kvtier_cache* cache, const kvtier_tier* tier,
                                             int64_t* dropped, kvtier_error* error);

/* Blocks until no transfer the cache started is in flight, or timeout_ns passes
 * (DEADLINE_EXCEEDED). */
kvtier_status_code kvtier_wait_idle(const kvtier_cache* cache, int64_t timeout_ns,
                                    kvtier_error* error);
/* Checks every internal invariant; INTERNAL naming the first violation. O(blocks): for tests. */
kvtier_status_code kvtier_check_invariants(const kvtier_cache* cache, kvtier_error* error);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVTIER_C_KVTIER_H_ */
