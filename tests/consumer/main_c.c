/* A C11 program on the installed package: the C ABI's header is installed
 * (include/kvtier/c/kvtier.h) and kvtier::kvtier links its library. Builds a cache over an
 * emulated HBM tier and attaches a prompt written before. */
#include <stdio.h>

#include "kvtier/c/kvtier.h"

int main(void) {
  kvtier_error err;
  kvtier_geometry_options g;
  kvtier_geometry_options_init(&g);
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.head_dim = 8;
  g.tokens_per_block = 4;
  kvtier_namespace_options o;
  kvtier_namespace_options_init(&o);
  o.model_id = "consumer/c";
  o.weights_fingerprint = "w";
  kvtier_namespace* ns = NULL;
  if (kvtier_namespace_create(&g, &o, &ns, &err) != KVTIER_OK) return 1;
  kvtier_tier_stack_options s;
  kvtier_tier_stack_options_init(&s);
  s.tiers[KVTIER_TIER_HBM].capacity_blocks = 8;
  kvtier_tier_stack* stack = NULL;
  if (kvtier_tier_stack_build(ns, &s, &stack, &err) != KVTIER_OK) return 2;
  kvtier_cache* cache = NULL;
  if (kvtier_cache_create(ns, stack, NULL, &cache, &err) != KVTIER_OK) return 3;
  const int32_t prompt[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  if (kvtier_sequence_create(cache, 1, NULL, &err) != KVTIER_OK) return 4;
  if (kvtier_append(cache, 1, prompt, 8, KVTIER_ROOM_WAIT, NULL, &err) != KVTIER_OK) return 5;
  if (kvtier_report_written(cache, 1, 8, NULL, &err) != KVTIER_OK) return 6;
  if (kvtier_release(cache, 1, &err) != KVTIER_OK) return 7;
  kvtier_attach_result r;
  if (kvtier_sequence_create(cache, 2, NULL, &err) != KVTIER_OK) return 8;
  if (kvtier_attach_prefix(cache, 2, prompt, 9, &r, &err) != KVTIER_OK) return 9;
  if (r.attached_tokens != 8) return 10;
  if (kvtier_release(cache, 7, &err) != KVTIER_NOT_FOUND) return 11;
  printf("c consumer: %lld tokens attached; unknown sequence: %s (%s)\n",
         (long long)r.attached_tokens, kvtier_status_code_name(err.code), err.message);
  kvtier_cache_destroy(cache);
  kvtier_namespace_destroy(ns);
  return 0;
}
