// Fused row creation of a pull or push that missed keys: insert into the index, initialise
// the rows, copy their weights out, in parallel over the misses only (insert_init, ops.h).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "checks.h"
#include "index_probe.h"
#include "ops.h"
#include "parallel.h"

namespace streamrec {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// a slot's row claimed by miss j (within one call: no slot keeps it)
inline int64_t claim(int64_t j) { return -3 - j; }

// One thread's scratch of insert_init, kept between calls (kept_scratch in ops.h).
struct InsertScratch {
  std::vector<int64_t> miss;      // the positions of the keys that missed
  std::vector<uint64_t> slot_of;  // the slot of each miss
  std::vector<uint8_t> won;       // whether miss j holds its slot's claim
};

}  // namespace

int64_t insert_init(const InsertInitArgs& a, const TableParams& p) {
  constexpr const char* kOp = "insert_init";
  const int64_t n = a.keys.n, dim = p.dim, width = p.width;
  const bool with_out = a.out != nullptr;
  int64_t* s = a.slots.data;
  const int64_t* k = a.keys.data;
  int64_t* r = a.rows;
  float* d = a.data.data;
  int64_t* rk = a.row_keys.data;
  float* o = a.out;
  const int64_t R = std::min(a.data.rows, a.row_keys.n);
  const int64_t start = a.start;
  const uint64_t mask = static_cast<uint64_t>(a.slots.rows - 1);
  const bool expand = expand_at_creation(p);
  InsertScratch& scratch = thread_scratch<InsertScratch>();  // kept_scratch (ops.h)
  auto& miss = scratch.miss;  // a reference: the parallel lambdas below reach this thread's
  miss.resize(n);
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {  // branch-free: most keys miss in a fresh table, or few
    miss[m] = i;
    m += r[i] < 0;
  }
  // Room for the rows created is checked before writing: every miss fits (an upper bound),
  // or else the distinct missing keys do (the caller grows a table by the distinct count).
  // Written as need <= R - start: start + need could overflow.
  STREAMREC_CHECK(start >= 0 && start <= R, kOp, ": start ", start, " outside the table's ", R,
                  " rows");
  int64_t need = m;
  if (m > R - start) {
    std::vector<int64_t> missing(m), inverse(m);
    for (int64_t j = 0; j < m; ++j) missing[j] = k[miss[j]];
    need = static_cast<int64_t>(unique({missing.data(), m}, inverse.data()).size());
  }
  STREAMREC_CHECK(need <= R - start, kOp, ": no room for ", need, " new rows at ", start,
                  " (rows ", R, ")");
  // Phase 1 claims an index slot per distinct missing key, in parallel: a compare-and-swap
  // takes an empty slot (through kBusyRow while its key is written) and marks it with a claim,
  // -3 - j for miss j; a later miss of the same key keeps the smallest j there, so the
  // winner of a slot is the key's first occurrence whatever the threads' timing. A miss
  // whose probe comes back to its first slot found the index full: the claims are undone
  // (the slots were empty) and the call raises, nothing else written. Phase 2 numbers the
  // winners in miss order (counts per chunk, then a prefix sum): row ids are deterministic,
  // first occurrence first, as a serial insert gives. Phase 3 writes each chunk's rows
  // (contiguous, sequential writes) and copies them out, phase 4 publishes the row ids in
  // the index (random writes, in a loop of their own so they do not hold up the row
  // writes), phase 5 gives the repeats of a new key its row and copies it out.
  const uint64_t cap = mask + 1;
  auto first_slot = [&](int64_t i) {
    const int64_t hint = -2 - r[i];
    return a.hinted && hint >= 0 && static_cast<uint64_t>(hint) < cap
               ? static_cast<uint64_t>(hint)
               : home(k[i], mask);
  };
  auto& slot_of = scratch.slot_of;
  auto& won = scratch.won;
  slot_of.resize(m);
  won.assign(m, 0);
  std::atomic<bool> full{false};
  std::atomic<int64_t> full_key{0};
  parallel_for(0, m, kIndexGrain, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      slot_of[j] = kNoSlot;
      if (full.load(std::memory_order_relaxed)) continue;  // the call raises: stop early
      if (j + 2 * kIndexAhead < e)
        __builtin_prefetch(s + 2 * first_slot(miss[j + 2 * kIndexAhead]), 1);
      const int64_t key = k[miss[j]];
      const uint64_t q0 = first_slot(miss[j]);
      uint64_t q = q0;
      do {
        int64_t* row = s + 2 * q + 1;
        int64_t v = __atomic_load_n(row, __ATOMIC_ACQUIRE);
        if (v == kEmptyRow && __atomic_compare_exchange_n(row, &v, kBusyRow, false, __ATOMIC_ACQUIRE,
                                                          __ATOMIC_ACQUIRE)) {
          s[2 * q] = key;
          won[j] = 1;  // before the claim is published: whoever replaces it clears this
          __atomic_store_n(row, claim(j), __ATOMIC_RELEASE);
          slot_of[j] = q;
          break;
        }
        while (v == kBusyRow) {  // another thread is writing this slot's key
          cpu_relax();
          v = __atomic_load_n(row, __ATOMIC_ACQUIRE);
        }
        if (s[2 * q] == key) {  // written before the claim this thread acquired
          // the key's slot: claimed by another miss of it (keep the first), or already a row
          // (won[j] is set before the claim is published and cleared only by the one miss
          // that replaces it, which saw it published: no two threads write one flag at once)
          while (v < kBusyRow && -3 - v > j) {
            const int64_t other = -3 - v;
            won[j] = 1;
            if (__atomic_compare_exchange_n(row, &v, claim(j), false, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
              won[other] = 0;
              break;
            }
            won[j] = 0;  // not published, so nobody else saw it
          }
          slot_of[j] = q;
          break;
        }
        q = (q + 1) & mask;
      } while (q != q0);
      if (slot_of[j] == kNoSlot) {
        full_key.store(key, std::memory_order_relaxed);
        full.store(true, std::memory_order_relaxed);
      }
    }
  });
  if (full.load()) {
    for (int64_t j = 0; j < m; ++j)
      if (won[j]) s[2 * slot_of[j] + 1] = kEmptyRow;
    index_full(kOp, cap, full_key.load());
  }
  const int64_t chunk =
      std::max<int64_t>(kIndexGrain, m / (8 * std::max(num_threads(), 1)));
  const int64_t chunks = (m + chunk - 1) / chunk;
  std::vector<int64_t> first_row(chunks + 1, 0);
  parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      int64_t wins = 0;
      for (int64_t j = c * chunk; j < std::min(m, (c + 1) * chunk); ++j) wins += won[j];
      first_row[c + 1] = wins;
    }
  });
  for (int64_t c = 0; c < chunks; ++c) first_row[c + 1] += first_row[c];
  parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    // a row is copied out kCopyLag rows after its initialisation: its scalar stores have
    // left the store buffer by then (a vector load right behind them waits for them), and
    // it is still in L1 (copying in a later pass reads it back from memory)
    constexpr int64_t kCopyLag = 4;
    int64_t lag[kCopyLag];
    for (int64_t c = cb; c < ce; ++c) {
      const int64_t first = start + first_row[c];
      int64_t row = first;
      const int64_t end = std::min(m, (c + 1) * chunk);
      for (int64_t j = c * chunk; j < end; ++j) {
        if (!won[j]) continue;
        const int64_t i = miss[j];
        rk[row] = k[i];
        init_row(d + row * width, k[i], p, expand);
        r[i] = row;
        if (with_out) {
          if (row - first >= kCopyLag) {
            const int64_t old = lag[row % kCopyLag];
            read_weights(o + old * dim, d + r[old] * width, p);
          }
          lag[row % kCopyLag] = i;
        }
        ++row;
      }
      if (with_out)
        for (int64_t q = std::max(first, row - kCopyLag); q < row; ++q) {
          const int64_t old = lag[q % kCopyLag];
          read_weights(o + old * dim, d + r[old] * width, p);
        }
    }
  });
  parallel_for(0, m, kIndexGrain, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      if (j + kIndexAhead < e) __builtin_prefetch(s + 2 * slot_of[j + kIndexAhead], 1);
      if (won[j]) s[2 * slot_of[j] + 1] = r[miss[j]];
    }
  });
  // a repeat takes its key's row: one created above, or one the index already held (a key
  // the caller's rows called absent), which must lie in data too
  std::atomic<int64_t> outside{m};
  parallel_for(0, m, kIndexGrain, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      if (won[j]) continue;
      const int64_t i = miss[j];
      r[i] = s[2 * slot_of[j] + 1];
      if (!row_in(r[i], R)) {
        atomic_min(outside, j);
        continue;
      }
      if (with_out) read_weights(o + i * dim, d + r[i] * width, p);
    }
  });
  const int64_t bad = outside.load();
  STREAMREC_CHECK(bad == m, kOp, ": the index maps key ", k[miss[bad]], " to row ",
                  r[miss[bad]], ", outside the table's ", R, " rows (an index of another table?)");
  return first_row[chunks];
}

}  // namespace streamrec
