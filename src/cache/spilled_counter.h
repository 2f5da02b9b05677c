// SpilledCounter: a count kept in a few bits of a block's entry while it is small, and in a
// wider field of the entry's side record (ColdFields) once it is not, so the common entry stays
// small (DESIGN: <= 64 bytes per cached block) and no count is ever clipped.
//
// The pair (narrow, wide) stands for one value: narrow < spill: the value is narrow and wide is
// 0; narrow == spill: the value is wide (>= spill). Step moves the value by +1 or -1 and keeps
// that form, so the caller stores narrow in its bit-field and wide in the side record (dropping
// the record's field once wide is 0 again).
#ifndef KVTIER_CACHE_SPILLED_COUNTER_H_
#define KVTIER_CACHE_SPILLED_COUNTER_H_

#include <cstdint>

namespace kvtier::internal {

struct SpilledCounter {
  uint32_t narrow = 0;
  uint32_t wide = 0;

  constexpr uint32_t value(uint32_t spill) const { return narrow != spill ? narrow : wide; }

  // The counter after adding `delta` (+1 or -1; the value must stay >= 0), for a narrow field
  // that holds values below `spill` (spill >= 1, the largest value the field can store).
  constexpr SpilledCounter Step(int delta, uint32_t spill) const {
    const uint32_t v = value(spill);
    const uint32_t next = delta > 0 ? v + 1 : v - 1;
    return next < spill ? SpilledCounter{next, 0} : SpilledCounter{spill, next};
  }
};

}  // namespace kvtier::internal

#endif  // KVTIER_CACHE_SPILLED_COUNTER_H_
