// The fused push (update): each thread owns a share of the rows and steps each of them once
// with its repeats summed (the step itself: ../shared/row_update.h).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "../shared/row_update.h"
#include "checks.h"
#include "ops.h"
#include "parallel.h"

namespace streamrec {
namespace {

constexpr int64_t kAhead = 16;  // prefetch distance, in positions

// The distinct rows of one thread's positions, counted: an open-addressing table of 1.5 slots
// per position, small enough to stay in the core's L2 cache (a per-row marks array as large
// as the table would cost a cache miss per position, twice).
struct RowCounts {
  struct Slot {
    int64_t row;    // -1: empty
    int32_t count;  // occurrences; then -(group + 1) once the row's repeats are grouped
    int32_t fill;   // next free place of the group in the grouped order
  };
  std::vector<Slot> slots;

  void reset(int64_t positions) { slots.assign(16 + positions + positions / 2, Slot{-1, 0, 0}); }
  // The home slot of `row` (not the owner's multiplier: its top bits are the same for every
  // row of one thread).
  uint64_t home(int64_t row) const {
    const uint64_t h = static_cast<uint64_t>(row) * 0xBF58476D1CE4E5B9ULL;
    return static_cast<uint64_t>((static_cast<unsigned __int128>(h) * slots.size()) >> 64);
  }
  void prefetch(int64_t row) const { __builtin_prefetch(slots.data() + home(row), 1); }
  // The slot of `row`, added with count 0 when absent.
  uint32_t add(int64_t row) {
    const uint64_t cap = slots.size();
    uint64_t j = home(row);
    while (slots[j].row != -1 && slots[j].row != row)
      if (++j == cap) j = 0;
    slots[j].row = row;
    return static_cast<uint32_t>(j);
  }
};

}  // namespace

int64_t update(const PushArgs& a, const TableParams& p) {
  const int64_t n = a.rows.n;
  const int64_t R = a.data.rows;
  check_rows_below(a.rows, R, "update");  // before any write; rows < 0 (absent) are skipped
  float* d = a.data.data;
  const int64_t* k = a.row_keys.data;
  const int64_t* r = a.rows.data;
  const float* g = a.grads;
  const float* sh = a.shows;
  const float* cl = a.clicks;

  // Parallel updates of one row would race, so each thread owns the rows that hash to it
  // (no atomics, no shared cache lines between threads on hot rows): it lists its positions,
  // counts its rows in a RowCounts, updates the rows seen once at once, and sums the
  // repeated rows' gradients in index order (deterministic) before updating them.
  const int64_t threads = n < 1024 ? 1 : std::max<int64_t>(num_threads(), 1);
  const uint64_t parts = static_cast<uint64_t>(threads);
  auto owner = [&](int64_t row) {  // Lemire's multiply-shift range reduction of a row hash
    const uint64_t h = (static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ULL) >> 32;
    return static_cast<int64_t>((h * parts) >> 32);
  };
  std::atomic<int64_t> expanded{0};
  parallel_for(0, threads, 1, [&](int64_t tb, int64_t te) {
    // kept between calls (kept_scratch in ops.h); references, as the loops below need them
    thread_local std::vector<int64_t> pos_keep, rep_keep, order_keep;
    thread_local std::vector<uint32_t> where_keep;
    thread_local RowCounts counts_keep;
    auto& pos = pos_keep;
    auto& rep = rep_keep;
    auto& order = order_keep;
    auto& where = where_keep;
    auto& counts = counts_keep;
    for (int64_t t = tb; t < te; ++t) {
      // branch-free: a row's owner is a coin flip per position, a branch on it mispredicts
      // half the time
      pos.resize(n);
      int64_t m = 0;
      for (int64_t i = 0; i < n; ++i) {
        pos[m] = i;
        m += (r[i] >= 0) & (owner(r[i]) == t);  // every row < R: checked above
      }
      counts.reset(m);
      where.resize(m);
      for (int64_t j = 0; j < m; ++j) {
        // the table outgrows L2 for large batches: its random accesses are prefetched too
        if (j + kAhead < m) counts.prefetch(r[pos[j + kAhead]]);
        const uint32_t at = counts.add(r[pos[j]]);
        ++counts.slots[at].count;
        where[j] = at;
      }
      int64_t ex = 0;
      rep.clear();  // indexes into pos of repeated rows, in index order
      for (int64_t j = 0; j < m; ++j) {
        if (j + kAhead < m) {
          prefetch_lines(d + r[pos[j + kAhead]] * p.width, 4 * p.width, true);
          __builtin_prefetch(counts.slots.data() + where[j + kAhead]);
        }
        const int64_t i = pos[j];
        if (counts.slots[where[j]].count == 1)
          ex += update_row(d + r[i] * p.width, k + r[i], g + i * p.dim, sh[i], cl[i], p, CpuPairs{});
        else
          rep.push_back(j);
      }
      // Repeated rows: numbered in order of first occurrence (count becomes -(group + 1)),
      // their positions laid out group by group (a counting sort), summed, updated once.
      std::vector<int64_t> group_slot, group_start{0};
      for (const int64_t j : rep) {
        auto& slot = counts.slots[where[j]];
        if (slot.count > 0) {
          group_slot.push_back(where[j]);
          slot.fill = static_cast<int32_t>(group_start.back());
          group_start.push_back(group_start.back() + slot.count);
          slot.count = -static_cast<int32_t>(group_slot.size());
        }
      }
      order.resize(rep.size());
      for (const int64_t j : rep) order[counts.slots[where[j]].fill++] = pos[j];
      // summed in double: a hot row repeats thousands of times in a batch
      std::vector<double> sum(static_cast<size_t>(p.dim));
      std::vector<float> sum_f(static_cast<size_t>(p.dim));
      for (size_t q = 0; q < group_slot.size(); ++q) {
        std::fill(sum.begin(), sum.end(), 0.0);
        double show = 0.0, click = 0.0;
        for (int64_t o = group_start[q]; o < group_start[q + 1]; ++o) {
          const int64_t i = order[o];
          for (int64_t c = 0; c < p.dim; ++c) sum[c] += g[i * p.dim + c];
          show += sh[i];
          click += cl[i];
        }
        std::copy(sum.begin(), sum.end(), sum_f.begin());
        const int64_t row = counts.slots[group_slot[q]].row;
        ex += update_row(d + row * p.width, k + row, sum_f.data(), static_cast<float>(show),
                         static_cast<float>(click), p, CpuPairs{});
      }
      expanded += ex;
    }
  });
  return expanded.load();
}

}  // namespace streamrec
