// Memory advice for the table's large arrays: prefault (map ahead of row creation) and
// advise_huge (transparent huge pages for random probes).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "ops.h"

namespace streamrec {

bool prefault(void* base_ptr, int64_t rows, int64_t row_bytes, int64_t start, int64_t end) {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
  start = std::max<int64_t>(start, 0);
  end = std::min<int64_t>(end, rows);
  if (end <= start) return true;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t base = reinterpret_cast<uintptr_t>(base_ptr);
  // whole pages inside the range only, so no byte outside [start, end) is involved
  const uintptr_t lo = (base + start * row_bytes + page - 1) & ~(page - 1);
  const uintptr_t hi = (base + end * row_bytes) & ~(page - 1);
  if (hi <= lo) return true;
  return madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE) == 0;
}

bool advise_huge(void* base_ptr, int64_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  const uintptr_t base = reinterpret_cast<uintptr_t>(base_ptr);
  const uintptr_t lo = (base + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t hi = (base + bytes) & ~(kHuge - 1);
  if (hi <= lo) return false;
  return madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE) == 0;
}

}  // namespace streamrec
