# kvtier's layers, bottom up (DESIGN section 3, STYLE rule 13): the one table that both the
# library targets (src/CMakeLists.txt, one static library kvtier_<layer> per src/<layer>/) and
# the include check (cmake/KvtierLayerCheck.cmake: ctest kvtier_layer_check, and a build step
# before the first layer compiles) read. A layer's sources live in src/<layer>/; its public
# headers are listed below. Changing what a layer may use is a change to this file.

set(KVTIER_LAYERS internal core platform tiers transfer remote cuda stack policy cache capi)

# Direct dependencies. kvtier_<layer> links exactly these (PUBLIC), and the layer's files may
# include headers of these layers and of theirs in turn, nothing else: the check follows the
# link graph, so an include it accepts is one the link line satisfies. Each names only layers
# listed before it in KVTIER_LAYERS.
#   internal  mutex, host regions, SHA-256, XXH3, stream workers, a hash map whose elements stay put: helpers with no kvtier types.
#   core      geometry, namespaces, block keys, hashing, allocator, index, completion.
#   platform  the CUDA runtime for host code below the CUDA tier: the device probe and self-test
#             (kvtier/cuda_device.h) and host-memory registration (platform/cuda_host.h), so the
#             DRAM tier pins its pool without calling up into src/cuda/.
#   tiers     TierBackend and the host backends (emulated HBM, DRAM, NVMe, metadata).
#   transfer  TransferEngine: moves blocks between any backends through TierBackend.
#   remote    RemoteTier, transports, value frames, codecs: a TierBackend over a store.
#   cuda      CudaHbm, the device tier: a TierBackend, so it sits on tiers beside transfer and
#             remote. Neither of those may see it (they work through TierBackend), nor it them.
#   stack     the tier stack builder (BuildTierStack): the backends of tiers, cuda and remote
#             (and a remote tier's store from a directory or a Redis URL) from one options struct,
#             for servers, the bindings, the replay, tests, the fuzzer, benchmarks and examples;
#             nothing below it sees it.
#   policy    eviction ranking (lru, cost_aware), eviction candidacy (the leaf-first rule and a
#             candidate's traits) and the restore-versus-recompute cost model; it owns no blocks.
#   cache     the KvCache facade: asks the policy, moves blocks with the transfer engine, and
#             holds its backends as TierBackends (the caller builds them, by hand or with stack;
#             the two are siblings, neither includes the other).
#   capi      the C ABI (kvtier/c/kvtier.h): opaque handles over the cache and the tier stack
#             builder, statuses as codes with messages; the only layer C programs call.
set(KVTIER_LAYER_internal_DEPS)
set(KVTIER_LAYER_core_DEPS internal)
set(KVTIER_LAYER_platform_DEPS internal)
set(KVTIER_LAYER_tiers_DEPS core platform)
set(KVTIER_LAYER_transfer_DEPS tiers)
set(KVTIER_LAYER_remote_DEPS tiers)
set(KVTIER_LAYER_cuda_DEPS tiers)
set(KVTIER_LAYER_stack_DEPS remote cuda)
set(KVTIER_LAYER_policy_DEPS core)
set(KVTIER_LAYER_cache_DEPS transfer policy)
set(KVTIER_LAYER_capi_DEPS cache stack)

# Public headers (include/kvtier/) by the layer that implements them; a header-only one belongs
# to the lowest layer that uses it. Every public header is listed exactly once, by its path
# under include/kvtier/ (the C ABI's is c/kvtier.h).
set(KVTIER_LAYER_internal_HEADERS)
set(KVTIER_LAYER_core_HEADERS
  block_allocator.h block_index.h block_key.h cache_namespace.h completion.h device_fence.h
  device_block_table.h hbm_layout.h ids.h kv_address.h kv_geometry.h prefix_hasher.h)
set(KVTIER_LAYER_platform_HEADERS cuda_device.h)
set(KVTIER_LAYER_tiers_HEADERS
  dram_tier.h emulated_hbm.h in_memory_slot_tier.h metadata_store.h metadata_tier.h nvme_tier.h
  tier_backend.h)
set(KVTIER_LAYER_transfer_HEADERS transfer_engine.h)
set(KVTIER_LAYER_remote_HEADERS
  codec.h directory_transport.h in_process_transport.h redis_transport.h remote_tier.h
  transport.h value_frame.h)
set(KVTIER_LAYER_cuda_HEADERS cuda_hbm.h)
set(KVTIER_LAYER_stack_HEADERS tier_stack.h)
set(KVTIER_LAYER_policy_HEADERS cost_model.h eviction_candidacy.h eviction_policy.h
  reuse_life_table.h session_hints.h)
set(KVTIER_LAYER_cache_HEADERS kv_cache.h kv_cache_stats.h)
set(KVTIER_LAYER_capi_HEADERS c/kvtier.h)

# abseil is in the public headers, so every layer links it PUBLIC (the header check too).
set(KVTIER_ABSL_PUBLIC absl::status absl::statusor absl::span absl::flat_hash_map absl::strings
    absl::time absl::core_headers)

# kvtier_layer_closure(<layer> <out_var>): the layers <layer> may use, all the way down (without
# itself), bottom up.
function(kvtier_layer_closure layer out_var)
  set(seen)
  set(todo ${KVTIER_LAYER_${layer}_DEPS})
  while(todo)
    list(POP_FRONT todo dep)
    if(NOT dep IN_LIST seen)
      list(APPEND seen ${dep})
      list(APPEND todo ${KVTIER_LAYER_${dep}_DEPS})
    endif()
  endwhile()
  set(result)
  foreach(candidate IN LISTS KVTIER_LAYERS)
    if(candidate IN_LIST seen)
      list(APPEND result ${candidate})
    endif()
  endforeach()
  set(${out_var} ${result} PARENT_SCOPE)
endfunction()

# kvtier_layer_tops(<out_var>): the layers no other layer depends on, top first; linking these
# brings every layer.
function(kvtier_layer_tops out_var)
  set(used)
  foreach(layer IN LISTS KVTIER_LAYERS)
    list(APPEND used ${KVTIER_LAYER_${layer}_DEPS})
  endforeach()
  set(result)
  foreach(layer IN LISTS KVTIER_LAYERS)
    if(NOT layer IN_LIST used)
      list(PREPEND result ${layer})
    endif()
  endforeach()
  set(${out_var} ${result} PARENT_SCOPE)
endfunction()

# kvtier_layer_table_errors(<out_var>): what is inconsistent in the table itself (a dependency
# on a later or unknown layer, a header in two layers), as a list of messages.
function(kvtier_layer_table_errors out_var)
  set(errors)
  set(before)
  set(headers)
  foreach(layer IN LISTS KVTIER_LAYERS)
    foreach(dep IN LISTS KVTIER_LAYER_${layer}_DEPS)
      if(NOT dep IN_LIST before)
        list(APPEND errors "layer '${layer}' depends on '${dep}', which is not a layer listed before it in KVTIER_LAYERS")
      endif()
    endforeach()
    foreach(header IN LISTS KVTIER_LAYER_${layer}_HEADERS)
      if(header IN_LIST headers)
        list(APPEND errors "kvtier/${header} is listed in more than one layer")
      endif()
      list(APPEND headers ${header})
    endforeach()
    list(APPEND before ${layer})
  endforeach()
  set(${out_var} ${errors} PARENT_SCOPE)
endfunction()
