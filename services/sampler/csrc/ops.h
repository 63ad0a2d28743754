// The sampler's compiled operations (streamrec.sampler._C): the core, over plain arrays.
//
// Alias tables are the flat ones of streamrec/sampler/alias.py, packed once per table load
// into one 32-byte record per slot (AliasSlot) so a draw reads a single cache line:
//
//     slot s:  ceil(prob[s] * 2**53) | alias[s] | id of s | id of alias[s]
//
// A draw keeps slot s when its 53-bit fraction f (an integer) has f < ceil(prob * 2**53),
// which is exactly alias.py's float test f * 2**-53 < prob, without a float conversion.
// Random numbers are counter-based (SplitMix64: mix64(seed + counter * golden)), the counter
// being (output slot, try): a result depends on the seed only, not on the thread count or
// on how the positives are split between threads.
#pragma once

#include <cstdint>
#include <stdexcept>

namespace streamrec::sampler {

// One alias slot, the layout of a row of the (m, 4) int64 `slots` tensor.
struct AliasSlot {
  int64_t keep_below;  // ceil(prob * 2**53): keep this slot's own item if fraction < it
  int64_t alias;       // slot that gives the item otherwise (same group)
  int64_t id;          // dedup id of this slot's own item
  int64_t alias_id;    // dedup id of the alias slot's item
};
static_assert(sizeof(AliasSlot) == 4 * sizeof(int64_t), "AliasSlot must be 4 int64 wide");

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

// SplitMix64 finalizer (the same as streamrec.keyhash.mix64).
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// What the kernel raises on a bad value (RuntimeError in Python, with this message).
struct OpError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --- sample_put_back.cpp ---
// Weighted draws with replacement for every positive, conflicts rejected and redrawn.
//
// Positive i draws offsets[i+1] - offsets[i] items from the alias table of group[i]; a draw
// whose id is own_ids[i] (avoid_conflict), or whose slot is marked in `banned`
// (avoid_conflict_with_all_dedup_tags), is drawn again, at most max_rounds tries per output
// slot. Accepted ids fill the front of the positive's range in `ids`; the slots whose tries
// ran out, and every slot of a positive with group[i] < 0, are left at the back of the range
// holding missing_id and counted in left[i] (the caller fills them exactly). Draws are
// i.i.d., so where the left slots sit carries no information.
//
// The binding file checks each array's dtype, length and contiguity, reads a misaligned one
// from an aligned copy, and refuses max_rounds < 1 and own_ids with banned; the values (the
// offsets, the groups' spans) are checked here, by draw_total.
struct DrawArgs {
  const AliasSlot* slots = nullptr;  // (m,) packed records
  int64_t m = 0;
  const int64_t* start = nullptr;  // (g,) first slot of each group
  const int64_t* count = nullptr;  // (g,) its number of slots
  int64_t g = 0;
  const int64_t* group = nullptr;    // (b,) group of each positive, -1 to draw nothing
  const int64_t* offsets = nullptr;  // (b + 1,) output range of each positive (cumulative)
  int64_t b = 0;
  const int64_t* own_ids = nullptr;  // (b,) dedup id each positive must not get, or nullptr
  const bool* banned = nullptr;      // (m,) slots no positive may get, or nullptr (not both)
  int64_t seed = 0;
  int64_t max_rounds = 1;  // >= 1
  int64_t missing_id = 0;
  // most threads to use; <= 0: default_threads (the intra-op count), fewer when the load
  // average says cores are busy (OpenMP dynamic). The result does not depend on it.
  int64_t threads = 0;
  int64_t default_threads = 1;
};

// Checks the offsets and every drawing positive's group (O(b), so that no draw reads out of
// bounds) and returns offsets[b], the length of `ids`. Raises OpError naming the value.
int64_t draw_total(const DrawArgs& a);

// The draws: ids (offsets[b],) and left (b,), zeroed by the caller, are written; returns
// rounds, the most tries any slot used. `a` passed draw_total.
int64_t sample_put_back(const DrawArgs& a, int64_t* ids, int64_t* left);

}  // namespace streamrec::sampler
