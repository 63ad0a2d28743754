// Per-step buffers that keep their pages: a pull's rows, a push's summed gradients.
//
// A step allocates and frees the same few large buffers (25.6 MB each at 100k keys, dim 64).
// From the heap, a long-lived allocation between them (a cached route, a row tensor a caller
// keeps) fragments the free space, and a buffer then comes from fresh heap top: a page fault
// per 4 KiB, measured at 6,250 faults and ~4 ms per buffer on this project's 2-core VM. Here a
// large buffer is a mapping of its own that goes back to a small free list when its tensor
// dies, and the next request of a size it fits takes it, pages already mapped. bind_checks.cpp
// wraps a block as a tensor whose deleter gives it back.
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "errors.h"
#include "ops.h"

namespace streamrec {
namespace {

constexpr size_t kHuge = size_t{1} << 21;        // from 2 MiB: mappings in whole huge pages
constexpr size_t kPage = size_t{1} << 12;        // below: in whole 4 KiB pages
constexpr size_t kPooledFrom = size_t{1} << 18;  // smaller buffers come from the heap
constexpr size_t kKeepBytes = size_t{1} << 29;   // free mappings kept, at most (512 MiB)

using Block = StepBlock;

class BufferPool {
 public:
  // A mapping of at least `bytes`: the smallest free one that is not more than twice as
  // large (so a small request does not hold a large block), else a new one.
  Block take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if (it->bytes >= bytes && it->bytes <= 2 * bytes &&
            (best == free_.end() || it->bytes < best->bytes))
          best = it;
      if (best != free_.end()) {
        const Block b = *best;
        free_.erase(best);
        free_bytes_ -= b.bytes;
        return b;
      }
    }
    const size_t unit = bytes >= kHuge ? kHuge : kPage;
    const size_t size = (bytes + unit - 1) / unit * unit;
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    STREAMREC_CHECK(p != MAP_FAILED, "could not map a buffer of ", size, " bytes");
    // fewer faults on first touch, fewer TLB misses; optional
    if (unit == kHuge) madvise(p, size, MADV_HUGEPAGE);
    return {p, size};
  }

  // Back to the free list; beyond kKeepBytes of free mappings the largest go to the kernel.
  void give(Block b) {
    std::vector<Block> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(b);
      free_bytes_ += b.bytes;
      while (free_bytes_ > kKeepBytes) {
        auto largest = std::max_element(free_.begin(), free_.end(), [](const Block& x, const Block& y) {
          return x.bytes < y.bytes;
        });
        drop.push_back(*largest);
        free_bytes_ -= largest->bytes;
        free_.erase(largest);
      }
    }
    for (const Block& d : drop) munmap(d.ptr, d.bytes);
  }

 private:
  std::mutex mu_;
  std::vector<Block> free_;
  size_t free_bytes_ = 0;
};

BufferPool& pool() {
  static BufferPool* p = new BufferPool();  // never destroyed: tensors may outlive exit order
  return *p;
}

bool pooling_on() {
  static const bool on = [] {
    const char* v = std::getenv("STREAMREC_KEEP_FREED_MEMORY");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

}  // namespace

StepBlock step_block_take(size_t bytes) {
  if (bytes < kPooledFrom || !pooling_on()) return {nullptr, 0};
  return pool().take(bytes);
}

void step_block_give(StepBlock b) { pool().give(b); }

}  // namespace streamrec
