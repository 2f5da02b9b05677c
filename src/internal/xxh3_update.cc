// XXH3 streaming update (xxh3_update.h), with the AVX2 path chosen at run time.
#include "internal/xxh3_update.h"

namespace kvtier::internal {

#if defined(KVTIER_HAVE_XXH3_AVX2)
void Xxh3_128UpdateAvx2(XXH3_state_t* state, const void* data, size_t n);  // xxh3_avx2.cc

bool Xxh3Avx2Usable() { return __builtin_cpu_supports("avx2"); }
#else
bool Xxh3Avx2Usable() { return false; }
#endif

void Xxh3_128Update(XXH3_state_t* state, const void* data, size_t n, bool avx2) {
#if defined(KVTIER_HAVE_XXH3_AVX2)
  if (avx2) {
    Xxh3_128UpdateAvx2(state, data, n);
    return;
  }
#else
  (void)avx2;
#endif
  XXH3_128bits_update(state, data, n);
}

}  // namespace kvtier::internal
