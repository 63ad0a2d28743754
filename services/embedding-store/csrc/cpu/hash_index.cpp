// Open-addressing hash index over int64 keys (linear probing, power-of-two capacity).
//
// The index is one (capacity, 2) int64 tensor of [key, row] slots, so that a probe touches
// one cache line; row == -1 marks an empty slot. Lookups prefetch the slot of a key a few
// iterations ahead, which hides most of the memory latency of a large table.
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "ops.h"

namespace streamrec {
namespace {

constexpr int64_t kGrain = 4096;
constexpr int64_t kAhead = 8;  // prefetch distance, in keys

void check_index(const torch::Tensor& slots) {
  TORCH_CHECK(slots.dtype() == torch::kInt64 && slots.is_contiguous() && slots.dim() == 2 &&
                  slots.size(1) == 2, "index must be a contiguous (capacity, 2) int64 tensor");
  const int64_t cap = slots.size(0);
  TORCH_CHECK(cap > 0 && (cap & (cap - 1)) == 0, "index capacity must be a power of two, got ",
              cap);
}

void check_keys(const torch::Tensor& keys) {
  TORCH_CHECK(keys.dtype() == torch::kInt64 && keys.dim() == 1 && keys.is_contiguous(),
              "keys must be a contiguous (n,) int64 tensor");
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

inline uint64_t home(int64_t key, uint64_t mask) {
  return mix64(static_cast<uint64_t>(key)) & mask;
}

// Slot holding `key`, or the empty slot where it would go, probing from slot i (its home,
// or a slot an earlier probe of the same key reached). s: (cap, 2) [key, row].
inline uint64_t probe_from(const int64_t* s, uint64_t mask, int64_t key, uint64_t i) {
  while (s[2 * i + 1] != -1 && s[2 * i] != key) i = (i + 1) & mask;
  return i;
}

inline uint64_t probe(const int64_t* s, uint64_t mask, int64_t key) {
  return probe_from(s, mask, key, home(key, mask));
}

// Row of the slot a probe ended at: the row, or -2 - slot when the slot is empty.
inline int64_t row_or_slot(const int64_t* s, uint64_t j) {
  const int64_t row = s[2 * j + 1];
  return row == -1 ? -2 - static_cast<int64_t>(j) : row;
}

}  // namespace

namespace {

// Row per key and the number of absent keys; an absent key reads -1, or -2 - slot (the empty
// slot its probe reached) when `slot_hints`.
std::tuple<torch::Tensor, int64_t> lookup(const torch::Tensor& slots, const torch::Tensor& keys,
                                          bool slot_hints) {
  check_index(slots);
  check_keys(keys);
  const int64_t n = keys.numel();
  auto out = torch::empty({n}, keys.options());
  const int64_t* s = slots.data_ptr<int64_t>();
  const int64_t* k = keys.data_ptr<int64_t>();
  int64_t* o = out.data_ptr<int64_t>();
  const uint64_t mask = static_cast<uint64_t>(slots.size(0) - 1);
  std::atomic<int64_t> misses{0};
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    int64_t miss = 0;
    for (int64_t i = b; i < e; ++i) {
      if (i + kAhead < e) __builtin_prefetch(s + 2 * home(k[i + kAhead], mask));
      const uint64_t at = probe(s, mask, k[i]);
      o[i] = slot_hints ? row_or_slot(s, at) : s[2 * at + 1];
      miss += o[i] < 0;
    }
    misses += miss;
  });
  return {out, misses.load()};
}

}  // namespace

torch::Tensor find(const torch::Tensor& slots, const torch::Tensor& keys) {
  return std::get<0>(lookup(slots, keys, false));
}

std::tuple<torch::Tensor, int64_t> find_count(const torch::Tensor& slots,
                                              const torch::Tensor& keys) {
  return lookup(slots, keys, true);
}

std::tuple<torch::Tensor, torch::Tensor, int64_t> find_gather(const torch::Tensor& slots,
                                                              const torch::Tensor& keys,
                                                              const torch::Tensor& data,
                                                              const TableParams& p,
                                                              bool zero_misses) {
  check_index(slots);
  check_keys(keys);
  TORCH_CHECK(data.dtype() == torch::kFloat32 && data.is_contiguous() && data.dim() == 2 &&
                  data.size(1) == p.width, "data must be contiguous (R, width) float32");
  const int64_t n = keys.numel(), dim = p.dim, width = p.width;
  auto rows = torch::empty({n}, keys.options());
  auto out = step_buffer({n, dim}, data.options());
  const int64_t* s = slots.data_ptr<int64_t>();
  const int64_t* k = keys.data_ptr<int64_t>();
  const float* d = data.data_ptr<float>();
  int64_t* r = rows.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  const uint64_t mask = static_cast<uint64_t>(slots.size(0) - 1);
  std::atomic<int64_t> misses{0};
  // Stage 1 prefetches the slot of key i + 2 * kAhead; stage 2 finds key i + kAhead (its
  // slot is in cache by then) and prefetches its row; key i then costs no memory wait.
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    int64_t miss = 0;
    for (int64_t i = b; i < std::min(b + kAhead, e); ++i)
      r[i] = row_or_slot(s, probe(s, mask, k[i]));
    for (int64_t i = b; i < e; ++i) {
      if (i + 2 * kAhead < e) __builtin_prefetch(s + 2 * home(k[i + 2 * kAhead], mask));
      if (i + kAhead < e) {
        const int64_t ra = row_or_slot(s, probe(s, mask, k[i + kAhead]));
        r[i + kAhead] = ra;
        if (ra >= 0) prefetch_lines(d + ra * width + kEmbedW, 4 * dim);
      }
      const int64_t ri = r[i];
      if (ri < 0) {
        if (zero_misses) std::memset(o + i * dim, 0, sizeof(float) * dim);
        ++miss;
      } else {
        std::memcpy(o + i * dim, d + ri * width + kEmbedW, sizeof(float) * dim);
      }
    }
    misses += miss;
  });
  return {out, rows, misses.load()};
}

std::tuple<torch::Tensor, torch::Tensor> find_or_insert(torch::Tensor slots,
                                                        const torch::Tensor& keys,
                                                        int64_t next_row) {
  auto rows = find(slots, keys);
  const int64_t n = keys.numel();
  int64_t* r = rows.data_ptr<int64_t>();
  // Inserting is serial (misses are a small share once a table is warm); finding is not.
  int64_t* s = slots.data_ptr<int64_t>();
  const int64_t* k = keys.data_ptr<int64_t>();
  const uint64_t mask = static_cast<uint64_t>(slots.size(0) - 1);
  std::vector<int64_t> fresh;
  for (int64_t i = 0; i < n; ++i) {
    if (r[i] != -1) continue;
    const uint64_t j = probe(s, mask, k[i]);
    if (s[2 * j + 1] == -1) {
      s[2 * j] = k[i];
      s[2 * j + 1] = next_row + static_cast<int64_t>(fresh.size());
      fresh.push_back(k[i]);
    }
    r[i] = s[2 * j + 1];
  }
  auto new_keys = torch::empty({static_cast<int64_t>(fresh.size())}, keys.options());
  if (!fresh.empty())
    std::memcpy(new_keys.data_ptr<int64_t>(), fresh.data(), fresh.size() * sizeof(int64_t));
  return {rows, new_keys};
}

int64_t insert_init(torch::Tensor slots, torch::Tensor data, torch::Tensor row_keys,
                    const torch::Tensor& keys, torch::Tensor rows, torch::Tensor out,
                    int64_t start, const TableParams& p, bool hinted) {
  check_index(slots);
  check_keys(keys);
  check_keys(rows);
  check_keys(row_keys);
  TORCH_CHECK(data.dtype() == torch::kFloat32 && data.is_contiguous() && data.dim() == 2 &&
                  data.size(1) == p.width, "data must be contiguous (R, width) float32");
  const int64_t n = keys.numel(), dim = p.dim, width = p.width;
  TORCH_CHECK(rows.numel() == n, "rows and keys differ in length");
  const bool with_out = out.defined() && out.numel() > 0;
  if (with_out)
    TORCH_CHECK(out.dtype() == torch::kFloat32 && out.is_contiguous() && out.dim() == 2 &&
                    out.size(0) == n && out.size(1) == dim, "out must be (n, dim) float32");
  int64_t* s = slots.data_ptr<int64_t>();
  const int64_t* k = keys.data_ptr<int64_t>();
  int64_t* r = rows.data_ptr<int64_t>();
  float* d = data.data_ptr<float>();
  int64_t* rk = row_keys.data_ptr<int64_t>();
  float* o = with_out ? out.data_ptr<float>() : nullptr;
  const int64_t R = std::min(data.size(0), row_keys.numel());
  const uint64_t mask = static_cast<uint64_t>(slots.size(0) - 1);
  const bool expand = p.score(0.0, 0.0) >= p.embedx_threshold;
  thread_local std::vector<int64_t> miss_keep;  // kept between calls (kept_scratch, ops.h)
  auto& miss = miss_keep;  // a reference: the parallel lambdas below reach this thread's
  miss.resize(n);
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {  // branch-free: most keys miss in a fresh table, or few
    miss[m] = i;
    m += r[i] < 0;
  }
  // Room for the rows created is checked before writing: every miss fits (an upper bound),
  // or else the distinct missing keys do (the caller grows a table by the distinct count).
  int64_t need = m;
  if (start + m > R) {
    auto missing = torch::empty({m}, keys.options());
    int64_t* mk = missing.data_ptr<int64_t>();
    for (int64_t j = 0; j < m; ++j) mk[j] = k[miss[j]];
    need = std::get<0>(unique(missing)).numel();
  }
  TORCH_CHECK(start >= 0 && start + need <= R, "no room for ", need, " new rows at ", start,
              " (rows ", R, ")");
  // Phase 1 claims an index slot per distinct missing key, in parallel: a compare-and-swap
  // takes an empty slot (through kBusy while its key is written) and marks it with a claim,
  // -3 - j for miss j; a later miss of the same key keeps the smallest j there, so the
  // winner of a slot is the key's first occurrence whatever the threads' timing. Phase 2
  // numbers the winners in miss order (counts per chunk, then a prefix sum): row ids are
  // deterministic, first occurrence first, as a serial insert gives. Phase 3 writes each
  // chunk's rows (contiguous, sequential writes) and copies them out, phase 4 publishes the
  // row ids in the index (random writes, in a loop of their own so they do not hold up the
  // row writes), phase 5 gives the repeats of a new key its row and copies it out.
  const uint64_t cap = mask + 1;
  auto first_slot = [&](int64_t i) {
    const int64_t hint = -2 - r[i];
    return hinted && hint >= 0 && static_cast<uint64_t>(hint) < cap ? static_cast<uint64_t>(hint)
                                                                      : home(k[i], mask);
  };
  constexpr int64_t kBusy = -2;
  auto claim = [](int64_t j) { return -3 - j; };
  thread_local std::vector<uint64_t> slot_keep;  // the slot of each miss
  thread_local std::vector<uint8_t> won_keep;  // whether miss j holds its slot's claim
  auto& slot_of = slot_keep;
  auto& won = won_keep;
  slot_of.resize(m);
  won.assign(m, 0);
  at::parallel_for(0, m, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      if (j + 2 * kAhead < e) __builtin_prefetch(s + 2 * first_slot(miss[j + 2 * kAhead]), 1);
      const int64_t key = k[miss[j]];
      uint64_t q = first_slot(miss[j]);
      for (;; q = (q + 1) & mask) {
        int64_t* row = s + 2 * q + 1;
        int64_t v = __atomic_load_n(row, __ATOMIC_ACQUIRE);
        if (v == -1) {
          if (__atomic_compare_exchange_n(row, &v, kBusy, false, __ATOMIC_ACQUIRE,
                                          __ATOMIC_ACQUIRE)) {
            s[2 * q] = key;
            won[j] = 1;  // before the claim is published: whoever replaces it clears this
            __atomic_store_n(row, claim(j), __ATOMIC_RELEASE);
            break;
          }
        }
        while (v == kBusy) {  // another thread is writing this slot's key
          cpu_relax();
          v = __atomic_load_n(row, __ATOMIC_ACQUIRE);
        }
        if (s[2 * q] != key) continue;
        // the key's slot: claimed by another miss of it (keep the first), or already a row
        // (won[j] is set before the claim is published and cleared only by the one miss
        // that replaces it, which saw it published: no two threads write one flag at once)
        while (v < kBusy && -3 - v > j) {
          const int64_t other = -3 - v;
          won[j] = 1;
          if (__atomic_compare_exchange_n(row, &v, claim(j), false, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE)) {
            won[other] = 0;
            break;
          }
          won[j] = 0;  // not published, so nobody else saw it
        }
        break;
      }
      slot_of[j] = q;
    }
  });
  const int64_t chunk = std::max<int64_t>(kGrain, m / (8 * std::max(at::get_num_threads(), 1)));
  const int64_t chunks = (m + chunk - 1) / chunk;
  std::vector<int64_t> first_row(chunks + 1, 0);
  at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      int64_t wins = 0;
      for (int64_t j = c * chunk; j < std::min(m, (c + 1) * chunk); ++j) wins += won[j];
      first_row[c + 1] = wins;
    }
  });
  for (int64_t c = 0; c < chunks; ++c) first_row[c + 1] += first_row[c];
  at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
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
            std::memcpy(o + old * dim, d + r[old] * width + kEmbedW, sizeof(float) * dim);
          }
          lag[row % kCopyLag] = i;
        }
        ++row;
      }
      if (with_out)
        for (int64_t q = std::max(first, row - kCopyLag); q < row; ++q) {
          const int64_t old = lag[q % kCopyLag];
          std::memcpy(o + old * dim, d + r[old] * width + kEmbedW, sizeof(float) * dim);
        }
    }
  });
  at::parallel_for(0, m, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      if (j + kAhead < e) __builtin_prefetch(s + 2 * slot_of[j + kAhead], 1);
      if (won[j]) s[2 * slot_of[j] + 1] = r[miss[j]];
    }
  });
  at::parallel_for(0, m, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      if (won[j]) continue;
      const int64_t i = miss[j];
      r[i] = s[2 * slot_of[j] + 1];
      if (with_out) std::memcpy(o + i * dim, d + r[i] * width + kEmbedW, sizeof(float) * dim);
    }
  });
  return first_row[chunks];
}

void insert_or_assign(torch::Tensor slots, const torch::Tensor& keys, const torch::Tensor& vals) {
  check_index(slots);
  check_keys(keys);
  check_keys(vals);
  TORCH_CHECK(keys.numel() == vals.numel(), "keys and vals differ in length");
  int64_t* s = slots.data_ptr<int64_t>();
  const int64_t* k = keys.data_ptr<int64_t>();
  const int64_t* v = vals.data_ptr<int64_t>();
  const uint64_t mask = static_cast<uint64_t>(slots.size(0) - 1);
  for (int64_t i = 0; i < keys.numel(); ++i) {
    const uint64_t j = probe(s, mask, k[i]);
    s[2 * j] = k[i];
    s[2 * j + 1] = v[i];
  }
}

std::tuple<torch::Tensor, torch::Tensor> unique(const torch::Tensor& keys) {
  check_keys(keys);
  const int64_t n = keys.numel();
  int64_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  thread_local std::vector<int64_t> s;  // kept between calls (kept_scratch in ops.h)
  s.assign(2 * cap, -1);
  const uint64_t mask = static_cast<uint64_t>(cap - 1);
  auto inverse = torch::empty({n}, keys.options());
  const int64_t* k = keys.data_ptr<int64_t>();
  int64_t* inv = inverse.data_ptr<int64_t>();
  thread_local std::vector<int64_t> uniq;
  uniq.clear();
  uniq.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) __builtin_prefetch(s.data() + 2 * home(k[i + kAhead], mask));
    const uint64_t j = probe(s.data(), mask, k[i]);
    if (s[2 * j + 1] == -1) {
      s[2 * j] = k[i];
      s[2 * j + 1] = static_cast<int64_t>(uniq.size());
      uniq.push_back(k[i]);
    }
    inv[i] = s[2 * j + 1];
  }
  auto out = torch::empty({static_cast<int64_t>(uniq.size())}, keys.options());
  if (!uniq.empty())
    std::memcpy(out.data_ptr<int64_t>(), uniq.data(), uniq.size() * sizeof(int64_t));
  return {out, inverse};
}

torch::Tensor index_build(int64_t capacity, const torch::Tensor& keys) {
  check_keys(keys);
  TORCH_CHECK(capacity > keys.numel(), "index capacity ", capacity, " too small for ",
              keys.numel(), " keys");
  auto slots = torch::empty({capacity, 2}, keys.options());
  check_index(slots);
  advise_huge(slots);  // before the first touch, so the fill below maps huge pages
  slots.fill_(-1);
  // Keys are distinct, so inserters never look at each other's keys: claiming an empty
  // slot's row with a compare-and-swap is enough to insert in parallel.
  int64_t* s = slots.data_ptr<int64_t>();
  const int64_t* k = keys.data_ptr<int64_t>();
  const uint64_t mask = static_cast<uint64_t>(capacity - 1);
  at::parallel_for(0, keys.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      uint64_t j = home(k[i], mask);
      for (;;) {
        int64_t empty = -1;
        if (s[2 * j + 1] == -1 &&
            __atomic_compare_exchange_n(s + 2 * j + 1, &empty, i, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
          s[2 * j] = k[i];
          break;
        }
        j = (j + 1) & mask;
      }
    }
  });
  return slots;
}

}  // namespace streamrec
