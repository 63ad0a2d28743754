// A hash dedup of keys, in order of first occurrence: the store's and the client's dedup of
// a request (cheaper than sorting). It probes a private table as the index ops do.
#include <vector>

#include "index_probe.h"
#include "ops.h"

namespace streamrec {
namespace {

// One thread's scratch of unique(), kept between calls (kept_scratch in ops.h): its table of
// [key, position] slots, and the distinct keys it returns.
struct UniqueScratch {
  std::vector<int64_t> slots, uniq;
};

}  // namespace

const std::vector<int64_t>& unique(Span<const int64_t> keys, int64_t* inv) {
  const int64_t n = keys.n;
  int64_t cap = 16;
  while (cap < 2 * n) cap <<= 1;  // at least n empty slots: a probe never meets a full table
  UniqueScratch& scratch = thread_scratch<UniqueScratch>();
  std::vector<int64_t>& s = scratch.slots;
  s.assign(2 * cap, kEmptyRow);
  const uint64_t mask = static_cast<uint64_t>(cap - 1);
  const int64_t* k = keys.data;
  std::vector<int64_t>& uniq = scratch.uniq;
  uniq.clear();
  uniq.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    if (i + kIndexAhead < n) __builtin_prefetch(s.data() + 2 * home(k[i + kIndexAhead], mask));
    const uint64_t j = probe(s.data(), mask, k[i]);
    if (s[2 * j + 1] == kEmptyRow) {
      s[2 * j] = k[i];
      s[2 * j + 1] = static_cast<int64_t>(uniq.size());
      uniq.push_back(k[i]);
    }
    inv[i] = s[2 * j + 1];
  }
  return uniq;
}

}  // namespace streamrec
