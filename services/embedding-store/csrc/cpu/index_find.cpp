// Lookups in the hash index: find, find_count, and find_gather (find fused with the copy of
// each key's weights). Lookups prefetch the slot of a key a few iterations ahead, which hides
// most of the memory latency of a large table. They only read the index.
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "checks.h"
#include "index_probe.h"
#include "ops.h"

namespace streamrec {
namespace {

// Row per key and the number of absent keys; an absent key reads -1, or -2 - slot (the empty
// slot its probe reached) with kSlotHints. keys: (n,) int64 -> (n,) int64.
template <bool kSlotHints>
std::tuple<torch::Tensor, int64_t> lookup(const torch::Tensor& slots,
                                          const torch::Tensor& keys_in, const char* op) {
  check_index(slots, op);
  const torch::Tensor keys = input_ids(keys_in, op, "keys");
  const int64_t n = keys.numel();
  auto out = torch::empty({n}, keys.options());
  const int64_t* s = slots.data_ptr<int64_t>();
  const int64_t* k = keys.data_ptr<int64_t>();
  int64_t* o = out.data_ptr<int64_t>();
  const uint64_t mask = static_cast<uint64_t>(slots.size(0) - 1);
  std::atomic<int64_t> misses{0};
  at::parallel_for(0, n, kIndexGrain, [&](int64_t b, int64_t e) {
    int64_t miss = 0;
    for (int64_t i = b; i < e; ++i) {
      if (i + kIndexAhead < e) __builtin_prefetch(s + 2 * home(k[i + kIndexAhead], mask));
      o[i] = lookup_row<kSlotHints>(s, mask, k[i]);
      miss += o[i] < 0;
    }
    misses += miss;
  });
  return {out, misses.load()};
}

}  // namespace

torch::Tensor find(const torch::Tensor& slots, const torch::Tensor& keys) {
  return std::get<0>(lookup<false>(slots, keys, "find"));
}

std::tuple<torch::Tensor, int64_t> find_count(const torch::Tensor& slots,
                                              const torch::Tensor& keys) {
  return lookup<true>(slots, keys, "find_count");
}

std::tuple<torch::Tensor, torch::Tensor, int64_t> find_gather(const torch::Tensor& slots,
                                                              const torch::Tensor& keys_in,
                                                              const torch::Tensor& data,
                                                              const TableParams& p,
                                                              bool zero_misses) {
  constexpr const char* kOp = "find_gather";
  check_index(slots, kOp);
  const torch::Tensor keys = input_ids(keys_in, kOp, "keys");
  check_data(data, p, kOp);
  const int64_t n = keys.numel(), dim = p.dim, width = p.width, R = data.size(0);
  auto rows = torch::empty({n}, keys.options());
  auto out = step_buffer({n, dim}, data.options());
  const int64_t* s = slots.data_ptr<int64_t>();
  const int64_t* k = keys.data_ptr<int64_t>();
  const float* d = data.data_ptr<float>();
  int64_t* r = rows.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  const uint64_t mask = static_cast<uint64_t>(slots.size(0) - 1);
  std::atomic<int64_t> misses{0};
  std::atomic<int64_t> outside{n};  // first position whose row lies outside data
  // Stage 1 prefetches the slot of key i + 2 * kAhead; stage 2 finds key i + kAhead (its
  // slot is in cache by then) and prefetches its row; key i then costs no memory wait.
  at::parallel_for(0, n, kIndexGrain, [&](int64_t b, int64_t e) {
    int64_t miss = 0, bad = n;
    for (int64_t i = b; i < std::min(b + kIndexAhead, e); ++i)
      r[i] = lookup_row<true>(s, mask, k[i]);
    for (int64_t i = b; i < e; ++i) {
      if (i + 2 * kIndexAhead < e) __builtin_prefetch(s + 2 * home(k[i + 2 * kIndexAhead], mask));
      if (i + kIndexAhead < e) {
        const int64_t ra = lookup_row<true>(s, mask, k[i + kIndexAhead]);
        r[i + kIndexAhead] = ra;
        if (row_in(ra, R)) prefetch_lines(d + ra * width + kEmbedW, 4 * dim);
      }
      const int64_t ri = r[i];
      if (row_in(ri, R)) {
        std::memcpy(o + i * dim, d + ri * width + kEmbedW, sizeof(float) * dim);
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
  TORCH_CHECK(at == n, kOp, ": the index maps key ", k[at], " to row ", r[at],
              ", outside the table's ", R, " rows (an index of another table?)");
  return {out, rows, misses.load()};
}

}  // namespace streamrec
