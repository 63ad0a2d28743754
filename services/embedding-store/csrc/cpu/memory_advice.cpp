// Memory advice for the table's large tensors: prefault (map ahead of row creation) and
// advise_huge (transparent huge pages for random probes).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "ops.h"

namespace streamrec {

bool prefault(const torch::Tensor& t, int64_t start, int64_t end) {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
  TORCH_CHECK(t.is_contiguous() && t.dim() >= 1, "prefault needs a contiguous tensor");
  start = std::max<int64_t>(start, 0);
  end = std::min<int64_t>(end, t.size(0));
  if (end <= start) return true;
  const int64_t row_bytes = t.numel() / std::max<int64_t>(t.size(0), 1) * t.element_size();
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data_ptr());
  // whole pages inside the range only, so no byte outside [start, end) is involved
  const uintptr_t lo = (base + start * row_bytes + page - 1) & ~(page - 1);
  const uintptr_t hi = (base + end * row_bytes) & ~(page - 1);
  if (hi <= lo) return true;
  return madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE) == 0;
}

bool advise_huge(const torch::Tensor& t) {
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  TORCH_CHECK(t.is_contiguous(), "advise_huge needs a contiguous tensor");
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t lo = (base + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t hi = (base + t.numel() * t.element_size()) & ~(kHuge - 1);
  if (hi <= lo) return false;
  return madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE) == 0;
}

}  // namespace streamrec
