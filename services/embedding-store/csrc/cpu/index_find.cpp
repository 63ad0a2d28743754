// Lookups in the hash index: find, find_count, and find_gather (find fused with the copy of
// each key's weights). Lookups prefetch the slot of a key a few iterations ahead, which hides
// most of the memory latency of a large table. They only read the index.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "checks.h"
#include "index_probe.h"
#include "ops.h"
#include "parallel.h"

namespace streamrec {
namespace {

// Row per key into o and the number of absent keys; an absent key reads -1, or -2 - slot (the
// empty slot its probe reached) with kSlotHints.
template <bool kSlotHints>
int64_t lookup(Matrix<const int64_t> slots, Span<const int64_t> keys, int64_t* o) {
  const int64_t n = keys.n;
  const int64_t* s = slots.data;
  const int64_t* k = keys.data;
  const uint64_t mask = static_cast<uint64_t>(slots.rows - 1);
  std::atomic<int64_t> misses{0};
  parallel_for(0, n, kIndexGrain, [&](int64_t b, int64_t e) {
    int64_t miss = 0;
    for (int64_t i = b; i < e; ++i) {
      if (i + kIndexAhead < e) prefetch_probe(s, mask, k[i + kIndexAhead]);
      o[i] = lookup_row<kSlotHints>(s, mask, k[i]);
      miss += o[i] < 0;
    }
    misses += miss;
  });
  return misses.load();
}

}  // namespace

int64_t find(Matrix<const int64_t> slots, Span<const int64_t> keys, int64_t* rows) {
  return lookup<false>(slots, keys, rows);
}

int64_t find_count(Matrix<const int64_t> slots, Span<const int64_t> keys, int64_t* rows) {
  return lookup<true>(slots, keys, rows);
}

int64_t find_gather(Matrix<const int64_t> slots, Span<const int64_t> keys,
                    Matrix<const float> data, const TableParams& p, bool zero_misses,
                    int64_t* rows, float* out) {
  constexpr const char* kOp = "find_gather";
  const int64_t n = keys.n, dim = p.dim, width = p.width, R = data.rows;
  const int64_t* s = slots.data;
  const int64_t* k = keys.data;
  const float* d = data.data;
  int64_t* r = rows;
  float* o = out;
  const uint64_t mask = static_cast<uint64_t>(slots.rows - 1);
  std::atomic<int64_t> misses{0};
  std::atomic<int64_t> outside{n};  // first position whose row lies outside data
  // Stage 1 prefetches the slot of key i + 2 * kAhead; stage 2 finds key i + kAhead (its
  // slot is in cache by then) and prefetches its row; key i then costs no memory wait. A
  // task starts the pipeline with the slots of its first 2 * kAhead keys in flight together,
  // then the rows of its first kAhead, not one miss after another (a trainer's call per
  // table is a few thousand keys over the threads: each task's start is a share of it).
  parallel_for(0, n, kIndexGrain, [&](int64_t b, int64_t e) {
    int64_t miss = 0, bad = n;
    for (int64_t i = b; i < std::min(b + 2 * kIndexAhead, e); ++i)
      prefetch_probe(s, mask, k[i]);
    for (int64_t i = b; i < std::min(b + kIndexAhead, e); ++i) {
      r[i] = lookup_row<true>(s, mask, k[i]);
      if (row_in(r[i], R)) prefetch_lines(d + r[i] * width + kEmbedW, 4 * dim);
    }
    for (int64_t i = b; i < e; ++i) {
      if (i + 2 * kIndexAhead < e) prefetch_probe(s, mask, k[i + 2 * kIndexAhead]);
      if (i + kIndexAhead < e) {
        const int64_t ra = lookup_row<true>(s, mask, k[i + kIndexAhead]);
        r[i + kIndexAhead] = ra;
        if (row_in(ra, R)) prefetch_lines(d + ra * width + kEmbedW, 4 * dim);
      }
      const int64_t ri = r[i];
      if (row_in(ri, R)) {
        read_weights(o + i * dim, d + ri * width, p);
      } else {
        if (ri >= 0) bad = std::min(bad, i);
        if (zero_misses || ri >= 0) std::memset(o + i * dim, 0, sizeof(float) * dim);
        miss += ri < 0;
      }
    }
    misses += miss;
    if (bad < n) atomic_min(outside, bad);
  });
  const int64_t at = outside.load();
  STREAMREC_CHECK(at == n, kOp, ": the index maps key ", k[at], " to row ", r[at],
                  ", outside the table's ", R, " rows (an index of another table?)");
  return misses.load();
}

}  // namespace streamrec
