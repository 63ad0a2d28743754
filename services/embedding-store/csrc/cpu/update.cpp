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

constexpr int64_t kAhead = 16;  // prefetch distance, in rows

// Which of one thread's positions may share their row with another: two bits (seen, seen
// twice) per slot of a hash of the row, in one word, 32 slots per position expected, so
// that the bits stay in the core's L2 cache (a mark per table row would cost a cache miss
// per position). A slot two rows share flags both, and they are then grouped exactly
// (RepeatGroups): a row alone in its group sums one gradient, which gives it back exactly.
struct RepeatFilter {
  std::vector<uint64_t> words;
  uint64_t mask = 0;

  void reset(int64_t positions) {
    uint64_t slots = 2048;
    while (slots < 32 * static_cast<uint64_t>(positions)) slots <<= 1;
    if (words.size() < slots / 32) words.resize(slots / 32);
    std::fill(words.begin(), words.begin() + slots / 32, 0);
    mask = slots - 1;
  }
  uint64_t slot(int64_t row) const {
    return (static_cast<uint64_t>(row) * 0xBF58476D1CE4E5B9ULL >> 20) & mask;
  }
  void add(int64_t row) {  // branch-free: a repeat is rare and unpredictable
    const uint64_t h = slot(row), shift = 2 * (h & 31);
    uint64_t& w = words[h >> 5];
    w |= (((w >> shift) & 1) << (shift + 1)) | (uint64_t{1} << shift);
  }
  bool maybe_repeated(int64_t row) const {
    const uint64_t h = slot(row);
    return (words[h >> 5] >> (2 * (h & 31) + 1)) & 1;
  }
};

// The groups of the flagged positions' rows, numbered in order of first occurrence: an
// open-addressing map row -> group that doubles when half full, so that it stays the size
// of the repeats, not of the batch.
struct RepeatGroups {
  struct Slot {
    int64_t row;    // -1: empty
    int64_t group;
  };
  std::vector<Slot> slots;
  int64_t count = 0;

  void reset(int64_t expected) {
    size_t cap = 64;
    while (cap < 2 * static_cast<size_t>(expected)) cap <<= 1;
    slots.assign(cap, Slot{-1, 0});
    count = 0;
  }
  // The group of `row`, and whether it was created by this call.
  std::pair<int64_t, bool> find_or_add(int64_t row) {
    if (2 * (count + 1) > static_cast<int64_t>(slots.size())) grow();
    uint64_t j = home(row, slots.size());
    while (slots[j].row != -1) {
      if (slots[j].row == row) return {slots[j].group, false};
      j = (j + 1) & (slots.size() - 1);
    }
    slots[j] = Slot{row, count};
    return {count++, true};
  }

 private:
  static uint64_t home(int64_t row, size_t cap) {
    return (static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ULL >> 17) & (cap - 1);
  }
  void grow() {
    std::vector<Slot> old(2 * slots.size(), Slot{-1, 0});
    old.swap(slots);
    for (const Slot& s : old) {
      if (s.row == -1) continue;
      uint64_t j = home(s.row, slots.size());
      while (slots[j].row != -1) j = (j + 1) & (slots.size() - 1);
      slots[j] = s;
    }
  }
};

// One thread's scratch of an update, kept between calls.
struct UpdateScratch {
  std::vector<int64_t> pos, step_row, step_src;
  std::vector<double> sums;
  std::vector<std::pair<int64_t, int64_t>> flagged;  // (position, group)
  std::vector<float> sums_f;
  RepeatFilter filter;
  RepeatGroups groups;
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
  const int64_t dim = p.dim;

  // Parallel updates of one row would race, so each thread owns the rows that hash to it
  // (no atomics, no shared cache lines between threads on hot rows). In three passes over
  // its positions:
  //  1. it lists them, and its RepeatFilter flags those whose row may occur twice;
  //  2. it lists its steps in index order: a position not flagged steps its row with its
  //     own gradient; flagged ones are grouped by row and their gradients, shows and clicks
  //     summed in index order (deterministic), the group stepping once, at its first
  //     position;
  //  3. it runs the steps, each row's lines prefetched ahead, repeated rows in the same
  //     stream as the others (no pass of their own over the table).
  // The filter (a cache-sized bit array) settles nearly every position; the exact map it
  // replaced counted every position and stepped repeated rows in a pass of their own (106k
  // ids over 1M rows, 2 threads, medians of interleaved runs: 1.6 against 2.1 ms).
  const int64_t threads = n < 1024 ? 1 : std::max<int64_t>(num_threads(), 1);
  const uint64_t parts = static_cast<uint64_t>(threads);
  auto owner = [&](int64_t row) {  // Lemire's multiply-shift range reduction of a row hash
    const uint64_t h = (static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ULL) >> 32;
    return static_cast<int64_t>((h * parts) >> 32);
  };
  std::atomic<int64_t> expanded{0};
  parallel_for(0, threads, 1, [&](int64_t tb, int64_t te) {
    UpdateScratch& scratch = thread_scratch<UpdateScratch>();  // kept_scratch (ops.h)
    auto& pos = scratch.pos;
    auto& step_row = scratch.step_row;
    auto& step_src = scratch.step_src;
    auto& sums = scratch.sums;
    auto& flagged = scratch.flagged;
    auto& sums_f = scratch.sums_f;
    auto& filter = scratch.filter;
    auto& groups = scratch.groups;
    const int64_t stride = dim + 2;  // a group's sums: dim gradients, show, click
    for (int64_t t = tb; t < te; ++t) {
      // 1. branch-free: a row's owner is a coin flip per position, a branch on it
      // mispredicts half the time
      pos.resize(n);
      int64_t m = 0;
      for (int64_t i = 0; i < n; ++i) {
        pos[m] = i;
        m += (r[i] >= 0) & (owner(r[i]) == t);  // every row < R: checked above
      }
      filter.reset(m);
      for (int64_t j = 0; j < m; ++j) filter.add(r[pos[j]]);
      // 2. src >= 0: the step's gradient is position src's; src < 0: group -(src + 1)'s
      // sums. A flagged position's group is noted here and its gradient read in the pass
      // after, with prefetch (the flagged positions lie apart in the batch).
      step_row.resize(m);
      step_src.resize(m);
      flagged.clear();
      groups.reset(m / 8);
      int64_t steps = 0;
      for (int64_t j = 0; j < m; ++j) {
        const int64_t i = pos[j], row = r[i];
        step_row[steps] = row;
        step_src[steps] = i;
        if (filter.maybe_repeated(row)) {
          const auto [q, created] = groups.find_or_add(row);
          flagged.push_back({i, q});
          if (!created) continue;  // a later position of its group: no step of its own
          step_src[steps] = -(q + 1);
        }
        ++steps;
      }
      // each group's sums in index order, in double (a hot row repeats thousands of times in
      // a batch), from its first gradient, not from 0.0 (0.0 + -0.0 is +0.0)
      const int64_t f = static_cast<int64_t>(flagged.size());
      sums.resize(static_cast<size_t>(groups.count * stride));
      int64_t started = 0;
      for (int64_t c = 0; c < f; ++c) {
        if (c + kAhead < f) {
          const int64_t ia = flagged[c + kAhead].first;
          prefetch_lines(g + ia * dim, 4 * dim);
          __builtin_prefetch(sh + ia, 0, 2);
          __builtin_prefetch(cl + ia, 0, 2);
        }
        const auto [i, q] = flagged[c];
        const float* gi = g + i * dim;
        double* s = sums.data() + q * stride;
        if (q == started) {  // groups are numbered in order of first occurrence
          ++started;
          for (int64_t c2 = 0; c2 < dim; ++c2) s[c2] = gi[c2];
          s[dim] = sh[i];
          s[dim + 1] = cl[i];
        } else {
          for (int64_t c2 = 0; c2 < dim; ++c2) s[c2] += gi[c2];
          s[dim] += sh[i];
          s[dim + 1] += cl[i];
        }
      }
      sums_f.assign(sums.begin(), sums.end());
      // 3. the sources chosen as pointers, then read
      int64_t ex = 0;
      for (int64_t u = 0; u < steps; ++u) {
        if (u + kAhead < steps) prefetch_lines(d + step_row[u + kAhead] * p.width, 4 * p.width, true);
        const int64_t row = step_row[u], src = step_src[u];
        const bool own = src >= 0;
        const float* grad = own ? g + src * dim : sums_f.data() + (-src - 1) * stride;
        const float* show = own ? sh + src : grad + dim;
        const float* click = own ? cl + src : grad + dim + 1;
        ex += update_row(d + row * p.width, k + row, grad, *show, *click, p, CpuPairs{});
      }
      expanded += ex;
    }
  });
  return expanded.load();
}

}  // namespace streamrec
