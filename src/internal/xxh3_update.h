// XXH3 streaming update with the widest vector unit the CPU has. kvtier compiles xxHash
// header-only for the baseline x86-64 target (SSE2); frames of megabytes are hashed on every
// remote read and write, where AVX2 is about 2.7x faster (148 vs 54 us per 2 MiB here). XXH3's
// result does not depend on the vector unit, so states may be updated by either.
#ifndef KVTIER_INTERNAL_XXH3_UPDATE_H_
#define KVTIER_INTERNAL_XXH3_UPDATE_H_

#include <cstddef>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvtier::internal {

// True when this build has the AVX2 variant and the CPU runs it.
bool Xxh3Avx2Usable();
// XXH3_128bits_update, on AVX2 when `avx2` (from Xxh3Avx2Usable).
void Xxh3_128Update(XXH3_state_t* state, const void* data, size_t n, bool avx2);

}  // namespace kvtier::internal

#endif  // KVTIER_INTERNAL_XXH3_UPDATE_H_
