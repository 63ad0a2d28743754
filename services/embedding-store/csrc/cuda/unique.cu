// The keys' dedup of every part of a block at once (csrc/cpu/unique.cpp's unique_groups on the
// device): each part's distinct keys in order of first occurrence, part after part, and each
// position's index among them, in six launches whatever the part count:
//
//   1. a scratch hash map of (part, key) -> first position, emptied;
//   2. every position claims its (part, key)'s slot (the index's claim protocol: a 64-bit
//      compare-and-swap on the slot's position word, then the key, then the position
//      published), or lowers the slot's position to its own (atomic min): the first
//      occurrence wins whatever the threads' order;
//   3. head[i]: the first position of i's (part, key); firsts[i] = head[i] == i;
//   4. ids: the exclusive sum of firsts (the distinct keys' numbers, in position order, so in
//      order of first occurrence within each part, part after part);
//   5. inverse[i] = ids[head[i]], distinct[ids[i]] = keys[i] at first occurrences;
//   6. counts per part from ids at its bounds, and the total.
//
// The result is a function of the keys alone (no atomic order shows through): the same bits
// as the CPU core's unique_groups, on the CPU build and on a GPU.
#include "common.cuh"

#if defined(__CUDACC__)
#include <cub/device/device_scan.cuh>
#else
#include <thrust/execution_policy.h>
#include <thrust/scan.h>
#endif

namespace streamrec_cuda {
namespace {

STREAMREC_HD inline Atomic<int64_t> word(int64_t* s, uint64_t i, int part) {
  return Atomic<int64_t>(s[2 * i + part]);
}

// A (part, key)'s home slot: the key's mix, moved by the part's, so that one key in many
// parts does not pile onto one probe run.
STREAMREC_HD inline uint64_t home_of(int64_t key, int64_t part, uint64_t mask) {
  return (mix64(static_cast<uint64_t>(key)) ^ mix64(static_cast<uint64_t>(part) + 1)) & mask;
}

struct Empty {
  int64_t* s;
  STREAMREC_HD void operator()(int64_t i) const {
    s[2 * i] = 0;
    s[2 * i + 1] = kEmptyRow;
  }
};

// The slot word of slot i once no claim is writing it (waits out kBusyRow).
STREAMREC_HD inline int64_t settled(int64_t* s, uint64_t i) {
  int64_t r = word(s, i, 1).load(cuda::memory_order_acquire);
  while (r == kBusyRow) r = word(s, i, 1).load(cuda::memory_order_acquire);
  return r;
}

// Whether slot word r (a position) and slot key hold (part, key): the key, and a position
// inside the part's range.
STREAMREC_HD inline bool holds_in(int64_t r, int64_t slot_key, int64_t key, int64_t begin,
                                  int64_t end) {
  return r >= begin && r < end && slot_key == key;
}

struct Claim {
  StreamrecBlock b;
  const int64_t* keys;
  int64_t* s;
  uint64_t mask;
  STREAMREC_HD void operator()(int64_t i) const {
    const int64_t key = keys[i], p = part_of(b, i);
    const int64_t begin = b.offsets[p], end = b.offsets[p + 1];
    uint64_t j = home_of(key, p, mask);
    for (uint64_t step = 0; step <= mask;) {
      const int64_t r = settled(s, j);
      if (r == kEmptyRow) {
        int64_t expect = kEmptyRow;
        if (word(s, j, 1).compare_exchange_strong(expect, kBusyRow,
                                                  cuda::memory_order_acquire)) {
          word(s, j, 0).store(key, cuda::memory_order_relaxed);
          word(s, j, 1).store(i, cuda::memory_order_release);
          return;
        }
        continue;  // lost the slot: look at what the winner wrote
      }
      if (holds_in(r, word(s, j, 0).load(cuda::memory_order_relaxed), key, begin, end)) {
        word(s, j, 1).fetch_min(i, cuda::memory_order_relaxed);
        return;
      }
      j = (j + 1) & mask;
      ++step;
    }
  }
};

// After every claim: each position's first occurrence, and whether it is one.
struct Heads {
  StreamrecBlock b;
  const int64_t* keys;
  const int64_t* s;
  uint64_t mask;
  int64_t* head;
  int64_t* firsts;
  STREAMREC_HD void operator()(int64_t i) const {
    const int64_t key = keys[i], p = part_of(b, i);
    const int64_t begin = b.offsets[p], end = b.offsets[p + 1];
    uint64_t j = home_of(key, p, mask);
    int64_t first = i;  // the claim put (part, key) in the map: the loop finds it
    for (uint64_t step = 0; step <= mask; ++step) {
      const int64_t r = s[2 * j + 1];
      if (holds_in(r, s[2 * j], key, begin, end)) {
        first = r;
        break;
      }
      j = (j + 1) & mask;
    }
    head[i] = first;
    firsts[i] = first == i;
  }
};

struct Spread {
  const int64_t* keys;
  const int64_t* head;
  const int64_t* ids;
  int64_t* distinct;
  int64_t* inverse;
  STREAMREC_HD void operator()(int64_t i) const {
    const int64_t first = head[i];
    inverse[i] = ids[first];
    if (first == i) distinct[ids[i]] = keys[i];
  }
};

struct Counts {
  StreamrecBlock b;
  const int64_t* ids;
  const int64_t* firsts;
  int64_t* counts;
  int64_t* total;
  STREAMREC_HD void operator()(int64_t p) const {
    const int64_t begin = b.offsets[p], end = b.offsets[p + 1];
    // ids after the part's last position: its last id + its last first-flag
    const int64_t after = end > 0 ? ids[end - 1] + firsts[end - 1] : 0;
    counts[p] = end > begin ? after - ids[begin] : 0;
    if (p == b.parts - 1) *total = after;
  }
};

int exclusive_sum(void* temp, size_t* temp_bytes, const int64_t* in, int64_t* out, int64_t n,
                  cudaStream_t stream) {
#if defined(__CUDACC__)
  if (temp != nullptr) count_launch();
  const cudaError_t err = cub::DeviceScan::ExclusiveSum(temp, *temp_bytes, in, out, n, stream);
  if (err != cudaSuccess)
    return set_error(STREAMREC_CUDA_ERR_CUDA, "unique_tables: CUB's scan failed: %s",
                     cudaGetErrorString(err));
#else
  (void)stream;
  if (temp == nullptr) {
    *temp_bytes = 0;
    return STREAMREC_CUDA_OK;
  }
  count_launch();
  thrust::exclusive_scan(thrust::device, in, in + n, out, int64_t{0});
#endif
  return STREAMREC_CUDA_OK;
}

// The scratch: the map (a power of two >= 2n slots: at most half full), head, firsts, ids
// and the scan's own, in 256-byte aligned parts.
struct Plan {
  uint64_t slots;
  size_t scan_bytes;
  size_t map_at, head_at, firsts_at, ids_at, scan_at, bytes;
};

size_t round256(size_t b) { return (b + 255) / 256 * 256; }

Plan plan(int64_t n) {
  Plan p{};
  p.slots = 1;
  while (p.slots < 2 * static_cast<uint64_t>(n)) p.slots <<= 1;
  exclusive_sum(nullptr, &p.scan_bytes, nullptr, nullptr, n, nullptr);
  const size_t ids = sizeof(int64_t) * static_cast<size_t>(n);
  p.map_at = 0;
  p.head_at = p.map_at + round256(2 * sizeof(int64_t) * p.slots);
  p.firsts_at = p.head_at + round256(ids);
  p.ids_at = p.firsts_at + round256(ids);
  p.scan_at = p.ids_at + round256(ids);
  p.bytes = p.scan_at + round256(p.scan_bytes);
  return p;
}

}  // namespace
}  // namespace streamrec_cuda

using namespace streamrec_cuda;

extern "C" size_t streamrec_cuda_unique_tables_scratch_bytes(int64_t n) {
  return n <= 0 ? 0 : plan(n).bytes;
}

extern "C" int streamrec_cuda_unique_tables(const int64_t* keys, int64_t n,
                                            const int64_t* offsets, int64_t parts,
                                            int64_t* distinct, int64_t* inverse,
                                            int64_t* counts, int64_t* total, void* scratch,
                                            size_t scratch_bytes, cudaStream_t stream) {
  constexpr const char* kOp = "unique_tables";
  STREAMREC_CUDA_REQUIRE(n >= 0 && parts >= 0, "%s: n and parts must be >= 0", kOp);
  STREAMREC_CUDA_REQUIRE(parts > 0 || n == 0, "%s: a block of no part holds no key", kOp);
  STREAMREC_CUDA_REQUIRE(
      parts == 0 || (offsets != nullptr && counts != nullptr && total != nullptr),
      "%s: offsets, counts and total must be set", kOp);
  STREAMREC_CUDA_REQUIRE(n <= (int64_t{1} << 31) - 1,
                         "%s: at most 2^31 - 1 keys per call (CUB's scan), got %lld", kOp,
                         static_cast<long long>(n));
  if (parts == 0) return ok();
  StreamrecBlock b{};
  b.offsets = offsets;
  b.parts = parts;
  b.n = n;
  if (n == 0) {
    STREAMREC_CUDA_TRY(zero_async(counts, sizeof(int64_t) * static_cast<size_t>(parts), stream,
                                  kOp));
    STREAMREC_CUDA_TRY(zero_async(total, sizeof(int64_t), stream, kOp));
    return ok();
  }
  STREAMREC_CUDA_REQUIRE(keys != nullptr && distinct != nullptr && inverse != nullptr,
                         "%s: keys, distinct and inverse must be set", kOp);
  const Plan p = plan(n);
  STREAMREC_CUDA_REQUIRE(scratch != nullptr && scratch_bytes >= p.bytes,
                         "%s: scratch must hold %zu bytes "
                         "(streamrec_cuda_unique_tables_scratch_bytes), got %zu",
                         kOp, p.bytes, scratch_bytes);
  char* base = static_cast<char*>(scratch);
  int64_t* map = reinterpret_cast<int64_t*>(base + p.map_at);
  int64_t* head = reinterpret_cast<int64_t*>(base + p.head_at);
  int64_t* firsts = reinterpret_cast<int64_t*>(base + p.firsts_at);
  int64_t* ids = reinterpret_cast<int64_t*>(base + p.ids_at);
  const uint64_t mask = p.slots - 1;
  STREAMREC_CUDA_TRY(launch(static_cast<int64_t>(p.slots), Empty{map}, stream, kOp));
  STREAMREC_CUDA_TRY(launch(n, Claim{b, keys, map, mask}, stream, kOp));
  STREAMREC_CUDA_TRY(launch(n, Heads{b, keys, map, mask, head, firsts}, stream, kOp));
  size_t scan_bytes = p.scan_bytes;
  STREAMREC_CUDA_TRY(exclusive_sum(base + p.scan_at, &scan_bytes, firsts, ids, n, stream));
  STREAMREC_CUDA_TRY(launch(n, Spread{keys, head, ids, distinct, inverse}, stream, kOp));
  STREAMREC_CUDA_TRY(launch(parts, Counts{b, ids, firsts, counts, total}, stream, kOp));
  return ok();
}
