// Probing of the hash index, shared by the index ops (index_*.cpp, unique.cpp); internal.
//
// The index is one (capacity, 2) int64 matrix of [key, row] slots, so that a probe touches
// one cache line; row == -1 marks an empty slot (its key is never read). A key's probe starts
// at its home slot, mix64(key) & (capacity - 1), and walks forward to the key's slot or the
// first empty slot. A probe that comes back to where it started has seen every slot hold
// another key: the index is full, and the probe says so (kNoSlot, or -1 from lookup_row)
// instead of looping. The wrap test costs one compare per step past the home slot.
#pragma once

#include <cstdint>

#include "errors.h"
#include "table_params.h"

namespace streamrec {

constexpr uint64_t kNoSlot = ~uint64_t{0};  // a probe's answer on a full index
constexpr int64_t kIndexGrain = 1024;      // keys per parallel task
constexpr int64_t kIndexAhead = 12;        // prefetch distance, in keys

// Prefetches the cache line of key's home slot and the line after it (4 slots a line): a probe
// runs past its home line for about 1 key in 10 at the index's load, and that miss would
// otherwise come unannounced (106k lookups over 2M slots: 0.66 against 0.82 ms).
inline void prefetch_probe(const int64_t* s, uint64_t mask, int64_t key) {
  const uint64_t h = home(key, mask);
  __builtin_prefetch(s + 2 * h);
  __builtin_prefetch(s + 2 * (((h | 3) + 1) & mask));
}

// Raises the error of a key that finds neither its slot nor an empty one.
[[noreturn]] inline void index_full(const char* op, uint64_t capacity, int64_t key) {
  fail(op, ": the hash index is full (capacity ", capacity, " slots, none empty) and has no slot",
       " for key ", key, "; rebuild it larger (index_build) before inserting");
}

// Slot holding `key`, or the empty slot where it would go, probing from slot i (its home, or
// a slot an earlier probe of the same key reached); kNoSlot when every slot holds another key.
// s: (capacity, 2) [key, row]; mask: capacity - 1.
inline uint64_t probe_from(const int64_t* s, uint64_t mask, int64_t key, uint64_t i) {
  const uint64_t first = i;
  int64_t row;
  while ((row = s[2 * i + 1]) != kEmptyRow && !holds(row, s[2 * i], key)) {
    i = (i + 1) & mask;
    if (i == first) return kNoSlot;
  }
  return i;
}

inline uint64_t probe(const int64_t* s, uint64_t mask, int64_t key) {
  return probe_from(s, mask, key, home(key, mask));
}

// A lookup's answer for `key` in one probe: its row (>= 0) if present; if absent, -1, or with
// kSlotHints -2 - s, s the empty slot the probe ended at (a hint for insert_init); -1 on a
// full index (no hint: insert_init then probes from home). Reads each slot's row once.
template <bool kSlotHints>
inline int64_t lookup_row(const int64_t* s, uint64_t mask, int64_t key) {
  uint64_t i = home(key, mask);
  const uint64_t first = i;
  int64_t row;
  // the loop, then a select: measured as fast as the unbounded probe (early returns inside
  // the loop cost 4% on absent keys)
  while ((row = s[2 * i + 1]) != kEmptyRow && !holds(row, s[2 * i], key)) {
    i = (i + 1) & mask;
    if (i == first) return -1;
  }
  return row == kEmptyRow && kSlotHints ? -2 - static_cast<int64_t>(i) : row;
}

}  // namespace streamrec
