// Weighted negative draws with replacement from flat alias tables, conflicts redrawn
// (see ops.h). The hot loop per try: one counter-based random number, one 32-byte record,
// one compare (or one mask byte), no unpredictable branch.
#include <omp.h>

#include <algorithm>
#include <string>

#include "ops.h"

namespace streamrec::sampler {
namespace {

// Draws whose first tries are computed (and their records prefetched) before any is read.
constexpr int64_t kBlock = 32;

// Draws per parallel task at least: below this a thread costs more than it saves.
constexpr int64_t kGrainDraws = 32768;

// What a draw must not be.
enum class Avoid { kNothing, kOwnId, kBanned };

struct Params {
  const AliasSlot* table;
  const int64_t* start;
  const int64_t* count;
  const int64_t* group;
  const int64_t* offsets;
  const int64_t* own_ids;  // nullptr unless Avoid::kOwnId
  const bool* banned;      // nullptr unless Avoid::kBanned
  uint64_t seed;
  int64_t max_rounds;
  int64_t missing_id;
  int64_t* ids;
  int64_t* left;
};

// Positives [lo, hi): fills their output ranges and left counts; returns the most tries used.
// Everything the loop reads is copied to locals first (so stores to `ids` cannot force
// reloads) and the slot-or-alias choice is made with masks: it is a coin flip, so a branch
// on it would be mispredicted about half the time (measured: 2x slower).
template <Avoid kAvoid>
int64_t draw_range(const Params& p, int64_t lo, int64_t hi) {
  const AliasSlot* __restrict table = p.table;
  const int64_t* __restrict offsets = p.offsets;
  const int64_t* __restrict group = p.group;
  const bool* __restrict banned = p.banned;
  int64_t* __restrict ids = p.ids;
  const uint64_t seed = p.seed;
  const uint64_t rounds = static_cast<uint64_t>(p.max_rounds);
  uint64_t most = 0;
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t first = offsets[i];
    const int64_t n = offsets[i + 1] - first;
    if (n == 0) continue;
    int64_t* __restrict out = ids + first;
    int64_t filled = 0;
    const int64_t g = group[i];
    if (g >= 0) {
      const int64_t gstart = p.start[g];
      const AliasSlot* __restrict base = table + gstart;
      const uint64_t cnt = static_cast<uint64_t>(p.count[g]);
      const int64_t own = kAvoid == Avoid::kOwnId ? p.own_ids[i] : 0;
      // Try t (0-based) of output slot first + k uses counter (first + k) * rounds + t + 1.
      // High word of r * cnt: a uniform slot of the group; low word: the uniform fraction
      // that keeps the slot or takes its alias (the same split as alias.py's draw).
      // The fraction is kept as its top 53 bits, compared with the slot's integer threshold.
      auto slot_and_frac = [&](uint64_t counter, int64_t& s, int64_t& frac) {
        const uint64_t r = mix64(seed + counter * kGolden);
        const unsigned __int128 x = static_cast<unsigned __int128>(r) * cnt;
        s = static_cast<int64_t>(x >> 64);
        frac = static_cast<int64_t>(static_cast<uint64_t>(x) >> 11);
      };
      int64_t block_slot[kBlock];
      int64_t block_frac[kBlock];
      for (int64_t k0 = 0; k0 < n; k0 += kBlock) {
        const int64_t kn = std::min(kBlock, n - k0);
        // First tries of the whole block, records prefetched: their misses overlap.
        for (int64_t j = 0; j < kn; ++j) {
          slot_and_frac(static_cast<uint64_t>(first + k0 + j) * rounds + 1, block_slot[j],
                        block_frac[j]);
          __builtin_prefetch(base + block_slot[j]);
        }
        for (int64_t j = 0; j < kn; ++j) {
          int64_t s = block_slot[j];
          int64_t frac = block_frac[j];
          uint64_t t = 0;
          while (true) {
            const AliasSlot& a = base[s];
            const int64_t keep = -static_cast<int64_t>(frac < a.keep_below);  // ones: keep s
            const int64_t id = (a.id & keep) | (a.alias_id & ~keep);
            bool bad = false;
            if constexpr (kAvoid == Avoid::kOwnId) {
              bad = id == own;  // dedup ids are unique: same id, same item
            } else if constexpr (kAvoid == Avoid::kBanned) {
              bad = banned[((gstart + s) & keep) | (a.alias & ~keep)];
            }
            if (!bad) {
              out[filled++] = id;
              break;
            }
            if (++t == rounds) break;
            slot_and_frac(static_cast<uint64_t>(first + k0 + j) * rounds + t + 1, s, frac);
          }
          most = std::max(most, t < rounds ? t + 1 : rounds);
        }
      }
    }
    for (int64_t j = filled; j < n; ++j) out[j] = p.missing_id;
    p.left[i] = n - filled;
  }
  return static_cast<int64_t>(most);
}

}  // namespace

int64_t draw_total(const DrawArgs& a) {
  // The inputs come from the Python caller, not from the wire, but a bad index here would
  // read out of bounds, so each is checked once (O(b), before the parallel part).
  const auto at = [](int64_t v) { return std::to_string(v); };
  const int64_t* offsets = a.offsets;
  if (offsets[0] != 0) throw OpError("offsets[0] must be 0, got " + at(offsets[0]));
  for (int64_t i = 0; i < a.b; ++i) {
    if (offsets[i + 1] < offsets[i])
      throw OpError("offsets must not decrease; offsets[" + at(i + 1) + "] = " +
                    at(offsets[i + 1]) + " < offsets[" + at(i) + "] = " + at(offsets[i]));
    const int64_t gi = a.group[i];
    if (gi < 0 || offsets[i + 1] == offsets[i]) continue;
    if (gi >= a.g)
      throw OpError("group[" + at(i) + "] = " + at(gi) + " but there are " + at(a.g) + " groups");
    // A checked add: start + count of a corrupt group may wrap past INT64_MAX and compare
    // as in range.
    int64_t end = 0;
    const bool wraps = __builtin_add_overflow(a.start[gi], a.count[gi], &end);
    if (wraps || a.count[gi] < 1 || a.start[gi] < 0 || end > a.m)
      throw OpError("group " + at(gi) + " spans slots [" + at(a.start[gi]) + ", " +
                    at(a.start[gi]) + " + " + at(a.count[gi]) + ") outside the table's " +
                    at(a.m));
  }
  // offsets[0] == 0 and never decreasing: every range and the total fit int64 (counts whose
  // int64 sum wrapped show up above as a decrease).
  const int64_t total = offsets[a.b];
  int64_t last_chunk_end = 0;
  if (__builtin_add_overflow(total, kGrainDraws, &last_chunk_end))
    throw OpError("offsets[b] = " + at(total) + " is too large");
  return total;
}

int64_t sample_put_back(const DrawArgs& a, int64_t* ids, int64_t* left) {
  Params p{};
  p.table = a.slots;
  p.start = a.start;
  p.count = a.count;
  p.group = a.group;
  p.offsets = a.offsets;
  p.own_ids = a.own_ids;
  p.banned = a.banned;
  p.seed = static_cast<uint64_t>(a.seed);
  p.max_rounds = a.max_rounds;
  p.missing_id = a.missing_id;
  p.ids = ids;
  p.left = left;
  const int64_t b = a.b, total = a.offsets[b], threads = a.threads;

  // Chunks of about kGrainDraws draws, not of positives, so a few large counts do not idle
  // the other threads: chunk c takes the positives whose first output slot lies in
  // [c * kGrainDraws, (c + 1) * kGrainDraws). Random numbers depend on (seed, output slot,
  // try) only, so neither the split nor the thread count changes the result.
  //
  // Threads (threads <= 0): at most the intra-op count, with OpenMP's dynamic adjustment
  // on (restored after), which gives up threads the machine's load average says are busy.
  // On a shared node a team member that is not scheduled holds up the join for a whole time
  // slice: measured on 2 busy cores, the median call took 5x longer with 2 threads than 1.
  const int64_t chunks = (total + kGrainDraws - 1) / kGrainDraws;
  const int64_t wanted = threads > 0 ? threads : a.default_threads;
  const int team = static_cast<int>(std::max<int64_t>(1, std::min(wanted, chunks)));
  int64_t rounds = 0;
  const int was_dynamic = omp_get_dynamic();
  omp_set_dynamic(threads <= 0);
#pragma omp parallel for schedule(dynamic, 1) num_threads(team) reduction(max : rounds)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t* off_end = p.offsets + b;
    const int64_t i_lo = std::lower_bound(p.offsets, off_end, c * kGrainDraws) - p.offsets;
    const int64_t i_hi = std::lower_bound(p.offsets, off_end, (c + 1) * kGrainDraws) - p.offsets;
    const int64_t most = p.banned    ? draw_range<Avoid::kBanned>(p, i_lo, i_hi)
                         : p.own_ids ? draw_range<Avoid::kOwnId>(p, i_lo, i_hi)
                                     : draw_range<Avoid::kNothing>(p, i_lo, i_hi);
    rounds = std::max(rounds, most);
  }
  omp_set_dynamic(was_dynamic);
  return rounds;
}

}  // namespace streamrec::sampler
