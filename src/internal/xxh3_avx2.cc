// Compiled with -mavx2 (x86-64 only): xxHash's AVX2 code path, called only after a CPU check.
#define XXH_VECTOR XXH_AVX2
#include "internal/xxh3_update.h"

namespace kvtier::internal {

void Xxh3_128UpdateAvx2(XXH3_state_t* state, const void* data, size_t n) {
  XXH3_128bits_update(state, data, n);
}

}  // namespace kvtier::internal
