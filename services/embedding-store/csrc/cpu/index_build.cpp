// A fresh hash index built in parallel: the store rebuilds its index when it grows and after
// shrink() compacts the rows (erasing is rebuilding).
#include <algorithm>

#include "checks.h"
#include "index_probe.h"
#include "ops.h"
#include "parallel.h"

namespace streamrec {

void check_build(int64_t capacity, int64_t n) {
  constexpr const char* kOp = "index_build";
  // more slots than keys: a probe always meets an empty slot, so the build loop ends
  STREAMREC_CHECK(capacity > 0 && (capacity & (capacity - 1)) == 0, kOp,
                  ": index capacity must be a power of two, got ", capacity);
  STREAMREC_CHECK(capacity > n, kOp, ": index capacity ", capacity, " too small for ", n,
                  " keys");
}

void index_build(Span<const int64_t> keys, Matrix<int64_t> slots) {
  const int64_t capacity = slots.rows;
  int64_t* s = slots.data;
  // before the first touch, so the fill below maps huge pages
  advise_huge(s, capacity * 2 * static_cast<int64_t>(sizeof(int64_t)));
  // in parallel, as a tensor fill is (the first touch maps the pages: most of the time)
  parallel_for(0, 2 * capacity, 32768, [&](int64_t b, int64_t e) {
    std::fill(s + b, s + e, kEmptyRow);
  });
  // Keys are distinct, so inserters never look at each other's keys: claiming an empty
  // slot's row with a compare-and-swap is enough to insert in parallel. A row other threads
  // may CAS is read with an atomic load (a plain read of it would be a data race).
  const int64_t* k = keys.data;
  const uint64_t mask = static_cast<uint64_t>(capacity - 1);
  parallel_for(0, keys.n, kIndexGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      uint64_t j = home(k[i], mask);
      for (;;) {
        int64_t* row = s + 2 * j + 1;
        int64_t empty = kEmptyRow;
        if (__atomic_load_n(row, __ATOMIC_RELAXED) == kEmptyRow &&
            __atomic_compare_exchange_n(row, &empty, i, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
          s[2 * j] = k[i];  // no thread reads keys during the build
          break;
        }
        j = (j + 1) & mask;
      }
    }
  });
}

}  // namespace streamrec
