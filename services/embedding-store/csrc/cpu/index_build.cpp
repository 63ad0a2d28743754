// A fresh hash index built in parallel: the store rebuilds its index when it grows and after
// shrink() compacts the rows (erasing is rebuilding).
#include <ATen/Parallel.h>

#include "checks.h"
#include "index_probe.h"
#include "ops.h"

namespace streamrec {

torch::Tensor index_build(int64_t capacity, const torch::Tensor& keys_in) {
  constexpr const char* kOp = "index_build";
  const torch::Tensor keys = input_ids(keys_in, kOp, "keys");
  // more slots than keys: a probe always meets an empty slot, so the loop below ends
  TORCH_CHECK(capacity > 0 && (capacity & (capacity - 1)) == 0, kOp,
              ": index capacity must be a power of two, got ", capacity);
  TORCH_CHECK(capacity > keys.numel(), kOp, ": index capacity ", capacity, " too small for ",
              keys.numel(), " keys");
  auto slots = torch::empty({capacity, 2}, keys.options());
  advise_huge(slots);  // before the first touch, so the fill below maps huge pages
  slots.fill_(kEmptyRow);
  // Keys are distinct, so inserters never look at each other's keys: claiming an empty
  // slot's row with a compare-and-swap is enough to insert in parallel. A row other threads
  // may CAS is read with an atomic load (a plain read of it would be a data race).
  int64_t* s = slots.data_ptr<int64_t>();
  const int64_t* k = keys.data_ptr<int64_t>();
  const uint64_t mask = static_cast<uint64_t>(capacity - 1);
  at::parallel_for(0, keys.numel(), kIndexGrain, [&](int64_t b, int64_t e) {
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
  return slots;
}

}  // namespace streamrec
