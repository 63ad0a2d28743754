// The sampler's compiled operations (streamrec.sampler._C), as free functions over tensors.
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

#include <torch/extension.h>

#include <cstdint>
#include <optional>
#include <tuple>

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
//   slots:    (m, 4) int64 packed AliasSlot records
//   start:    (g,) int64 first slot of each group; count: (g,) int64 its number of slots
//   group:    (b,) int64 group of each positive, -1 to draw nothing
//   offsets:  (b + 1,) int64 output range of each positive (cumulative counts)
//   own_ids:  (b,) int64 dedup id each positive must not get, or None
//   banned:   (m,) bool slots no positive may get, or None (not both)
//   threads:  most threads to use; <= 0: torch's intra-op count, fewer when the load average
//             says cores are busy (OpenMP dynamic). The result does not depend on it.
//
// Returns (ids (offsets[b],) int64, left (b,) int64, rounds = most tries any slot used).
std::tuple<torch::Tensor, torch::Tensor, int64_t> sample_put_back(
    const torch::Tensor& slots, const torch::Tensor& start, const torch::Tensor& count,
    const torch::Tensor& group, const torch::Tensor& offsets,
    const std::optional<torch::Tensor>& own_ids, const std::optional<torch::Tensor>& banned,
    int64_t seed, int64_t max_rounds, int64_t missing_id, int64_t threads);

}  // namespace streamrec::sampler
