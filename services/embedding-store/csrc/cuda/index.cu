// The GPU hash index (streamrec_cuda.h, "hash index"): open addressing with linear probing over
// the CPU core's (capacity, 2) int64 [key, row] slots. Every int64 is a key, so a slot's state
// is its row word, claimed with a 64-bit atomicCAS (EMPTY or TOMB -> BUSY), then the key is
// written, then the row id published (threadfence between): a probe that meets BUSY waits for
// the key (the claiming thread is resident and publishes in a few instructions; sm_70+
// schedules the threads of a warp independently, so a waiter in the claimer's warp does not
// stall it). Probes are bounded by capacity steps: a full index is a flag, never a hang.
#include "common.cuh"
#include "row_init.cuh"

namespace streamrec_cuda {
namespace {

constexpr int64_t kEmpty = -1;  // row word of a never-used slot: ends a probe
constexpr int64_t kBusy = -2;   // claimed, key being written
constexpr int64_t kTomb = -3;   // erased: probes walk past, inserts reuse

__device__ inline unsigned long long* row_word(int64_t* s, uint64_t i) {
  return reinterpret_cast<unsigned long long*>(s + 2 * i + 1);
}

__device__ inline int64_t load(const int64_t* p) {
  return *reinterpret_cast<const volatile int64_t*>(p);
}

__device__ inline void store(int64_t* p, int64_t v) { *reinterpret_cast<volatile int64_t*>(p) = v; }

// The row word of slot i once no insert is writing it (waits out BUSY).
__device__ inline int64_t settled_row(const int64_t* s, uint64_t i) {
  int64_t r = load(s + 2 * i + 1);
  while (r == kBusy) {
    __nanosleep(32);
    r = load(s + 2 * i + 1);
  }
  __threadfence();  // the key was written before the row: read it after
  return r;
}

__device__ inline uint64_t home(int64_t key, uint64_t mask) {
  return mix64(static_cast<uint64_t>(key)) & mask;
}

// Row of key (>= 0), or -1 when absent (read-only kernels: no slot is BUSY meanwhile).
__device__ inline int64_t lookup(const int64_t* s, uint64_t mask, int64_t key) {
  uint64_t i = home(key, mask);
  for (uint64_t step = 0; step <= mask; ++step) {
    const int64_t r = s[2 * i + 1];
    if (r == kEmpty) return -1;
    if (r >= 0 && s[2 * i] == key) return r;
    i = (i + 1) & mask;
  }
  return -1;  // full of other keys and tombstones
}

// What an insert's probe found.
struct Probe {
  int64_t row;     // the key's row when found (>= 0), else -1
  uint64_t slot;   // the key's slot when found, else the slot to claim
  int64_t expect;  // the claimed slot's row word now (kEmpty or kTomb)
  bool full;       // neither the key nor a free slot
};

// Walks key's probe run: the key's slot, or the free slot to claim (the first tombstone
// before the run's end, else the empty slot that ends it).
__device__ inline Probe probe_insert(const int64_t* s, uint64_t mask, int64_t key) {
  uint64_t i = home(key, mask);
  int64_t tomb = -1;
  for (uint64_t step = 0; step <= mask; ++step) {
    const int64_t r = settled_row(s, i);
    if (r == kEmpty) {
      if (tomb >= 0) return {-1, static_cast<uint64_t>(tomb), kTomb, false};
      return {-1, i, kEmpty, false};
    }
    if (r == kTomb) {
      if (tomb < 0) tomb = static_cast<int64_t>(i);
    } else if (load(s + 2 * i) == key) {
      return {r, i, 0, false};
    }
    i = (i + 1) & mask;
  }
  if (tomb >= 0) return {-1, static_cast<uint64_t>(tomb), kTomb, false};
  return {-1, 0, 0, true};
}

// Claims key's slot: returns (found row or -1, claimed slot or ~0). A claim that loses the
// race probes again (the winner may hold this very key: the next probe waits for it).
struct Claim {
  int64_t row;    // >= 0: the key was present with this row
  uint64_t slot;  // the slot now BUSY for this thread (row < 0), ~0 when full
};

__device__ inline Claim claim(int64_t* s, uint64_t mask, int64_t key) {
  for (;;) {
    const Probe p = probe_insert(s, mask, key);
    if (p.full) return {-1, ~uint64_t{0}};
    if (p.row >= 0) return {p.row, p.slot};
    const unsigned long long seen =
        atomicCAS(row_word(s, p.slot), static_cast<unsigned long long>(p.expect),
                  static_cast<unsigned long long>(kBusy));
    if (seen == static_cast<unsigned long long>(p.expect)) {
      store(s + 2 * p.slot, key);
      __threadfence();
      return {-1, p.slot};
    }
  }
}

// Publishes row id r in a slot this thread claimed.
__device__ inline void publish(int64_t* s, uint64_t slot, int64_t r) {
  __threadfence();
  store(s + 2 * slot + 1, r);
}

__global__ void init_kernel(int64_t* s, int64_t cap) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < cap;
       i += int64_t{gridDim.x} * blockDim.x) {
    s[2 * i] = 0;
    s[2 * i + 1] = kEmpty;
  }
}

__global__ void find_kernel(const int64_t* s, uint64_t mask, const int64_t* keys, int64_t n,
                            int64_t* rows, unsigned long long* misses) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = lookup(s, mask, keys[i]);
    rows[i] = r;
    if (r < 0 && misses != nullptr) atomicAdd(misses, 1ULL);
  }
}

__global__ void find_or_insert_kernel(int64_t* s, uint64_t mask, const int64_t* keys, int64_t n,
                                      int64_t* rows, StreamrecNewRows nr,
                                      StreamrecTableParams p, bool expand) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t key = keys[i];
    const Claim c = claim(s, mask, key);
    if (c.row >= 0) {
      rows[i] = c.row;
      continue;
    }
    if (c.slot == ~uint64_t{0}) {
      raise_flag(nr.flag, STREAMREC_CUDA_ERR_INDEX_FULL);
      rows[i] = -1;
      continue;
    }
    const int64_t id = static_cast<int64_t>(
        atomicAdd(reinterpret_cast<unsigned long long*>(nr.next_row), 1ULL));
    if (id >= nr.max_rows) {
      raise_flag(nr.flag, STREAMREC_CUDA_ERR_ROWS_FULL);
      publish(s, c.slot, kTomb);  // consistent: the key stays absent
      rows[i] = -1;
      continue;
    }
    nr.row_keys[id] = key;
    if (nr.data != nullptr) init_row(nr.data + id * p.width, key, p, expand);
    if (nr.created != nullptr) atomicAdd(reinterpret_cast<unsigned long long*>(nr.created), 1ULL);
    publish(s, c.slot, id);
    rows[i] = id;
  }
}

__global__ void insert_or_assign_kernel(int64_t* s, uint64_t mask, const int64_t* keys,
                                        const int64_t* vals, int64_t n, int32_t* flag) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (vals[i] < 0) {  // it would read as an empty slot or a tombstone
      raise_flag(flag, STREAMREC_CUDA_ERR_ARGUMENT);
      continue;
    }
    const Claim c = claim(s, mask, keys[i]);
    if (c.slot == ~uint64_t{0}) {
      raise_flag(flag, STREAMREC_CUDA_ERR_INDEX_FULL);
    } else if (c.row >= 0) {
      atomicExch(row_word(s, c.slot), static_cast<unsigned long long>(vals[i]));
    } else {
      publish(s, c.slot, vals[i]);
    }
  }
}

__global__ void erase_kernel(int64_t* s, uint64_t mask, const int64_t* keys, int64_t n,
                             unsigned long long* erased) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t key = keys[i];
    uint64_t j = home(key, mask);
    for (uint64_t step = 0; step <= mask; ++step) {
      const int64_t r = load(s + 2 * j + 1);
      if (r == kEmpty) break;
      if (r >= 0 && load(s + 2 * j) == key) {
        // a duplicate key in the batch erases once
        const unsigned long long seen = atomicCAS(
            row_word(s, j), static_cast<unsigned long long>(r), static_cast<unsigned long long>(kTomb));
        if (seen == static_cast<unsigned long long>(r) && erased != nullptr)
          atomicAdd(erased, 1ULL);
        break;
      }
      j = (j + 1) & mask;
    }
  }
}

__global__ void size_kernel(const int64_t* s, int64_t cap, unsigned long long* size) {
  unsigned long long live = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < cap;
       i += int64_t{gridDim.x} * blockDim.x)
    live += s[2 * i + 1] >= 0;
  for (int d = 16; d > 0; d /= 2) live += __shfl_down_sync(0xffffffffu, live, d);
  if ((threadIdx.x & 31) == 0 && live > 0) atomicAdd(size, live);
}

__global__ void export_kernel(const int64_t* s, int64_t cap, int64_t* keys, int64_t* rows,
                              unsigned long long* count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < cap;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = s[2 * i + 1];
    if (r < 0) continue;
    const unsigned long long at = atomicAdd(count, 1ULL);
    keys[at] = s[2 * i];
    rows[at] = r;
  }
}

__global__ void rebuild_kernel(const int64_t* src, int64_t src_cap, int64_t* dst,
                               uint64_t dst_mask, int32_t* flag) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < src_cap;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = src[2 * i + 1];
    if (r < 0) continue;
    const Claim c = claim(dst, dst_mask, src[2 * i]);
    if (c.slot == ~uint64_t{0})
      raise_flag(flag, STREAMREC_CUDA_ERR_INDEX_FULL);
    else if (c.row < 0)
      publish(dst, c.slot, r);
  }
}

int check_index(const StreamrecIndex& x, const char* op) {
  STREAMREC_CUDA_REQUIRE(x.slots != nullptr, "%s: index slots is NULL", op);
  STREAMREC_CUDA_REQUIRE(x.capacity > 0 && (x.capacity & (x.capacity - 1)) == 0,
                         "%s: index capacity must be a power of two, got %lld", op,
                         static_cast<long long>(x.capacity));
  return STREAMREC_CUDA_OK;
}

int check_keys(const void* keys, int64_t n, const char* op) {
  STREAMREC_CUDA_REQUIRE(n >= 0, "%s: n must be >= 0, got %lld", op, static_cast<long long>(n));
  STREAMREC_CUDA_REQUIRE(n == 0 || keys != nullptr, "%s: keys is NULL", op);
  return STREAMREC_CUDA_OK;
}

}  // namespace
}  // namespace streamrec_cuda

using namespace streamrec_cuda;

extern "C" int streamrec_cuda_index_init(StreamrecIndex index, cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_index(index, "index_init"));
  init_kernel<<<blocks_for(index.capacity), kThreads, 0, stream>>>(index.slots, index.capacity);
  STREAMREC_CUDA_LAUNCHED();
  return ok();
}

extern "C" int streamrec_cuda_find(StreamrecIndex index, const int64_t* keys, int64_t n,
                                   int64_t* rows, int64_t* misses, cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_index(index, "find"));
  STREAMREC_CUDA_TRY(check_keys(keys, n, "find"));
  STREAMREC_CUDA_REQUIRE(n == 0 || rows != nullptr, "find: rows is NULL");
  if (n == 0) return ok();
  find_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
      index.slots, static_cast<uint64_t>(index.capacity - 1), keys, n, rows,
      reinterpret_cast<unsigned long long*>(misses));
  STREAMREC_CUDA_LAUNCHED();
  return ok();
}

extern "C" int streamrec_cuda_find_or_insert(StreamrecIndex index, const int64_t* keys,
                                             int64_t n, int64_t* rows, StreamrecNewRows new_rows,
                                             const StreamrecTableParams* params,
                                             cudaStream_t stream) {
  constexpr const char* kOp = "find_or_insert";
  STREAMREC_CUDA_TRY(check_index(index, kOp));
  STREAMREC_CUDA_TRY(check_keys(keys, n, kOp));
  STREAMREC_CUDA_REQUIRE(n == 0 || rows != nullptr, "%s: rows is NULL", kOp);
  STREAMREC_CUDA_REQUIRE(new_rows.next_row != nullptr && new_rows.row_keys != nullptr &&
                             new_rows.flag != nullptr,
                         "%s: new_rows.next_row, row_keys and flag must be set", kOp);
  STREAMREC_CUDA_REQUIRE(new_rows.max_rows >= 0, "%s: max_rows must be >= 0", kOp);
  StreamrecTableParams p{};
  bool expand = false;
  if (new_rows.data != nullptr) {
    STREAMREC_CUDA_TRY(check_params(params, kOp));
    p = *params;
    expand = p.nonclk_coeff * 0.0 + p.click_coeff * 0.0 >= p.embedx_threshold;
  }
  if (n == 0) return ok();
  find_or_insert_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
      index.slots, static_cast<uint64_t>(index.capacity - 1), keys, n, rows, new_rows, p,
      expand);
  STREAMREC_CUDA_LAUNCHED();
  return ok();
}

extern "C" int streamrec_cuda_insert_or_assign(StreamrecIndex index, const int64_t* keys,
                                               const int64_t* vals, int64_t n, int32_t* flag,
                                               cudaStream_t stream) {
  constexpr const char* kOp = "insert_or_assign";
  STREAMREC_CUDA_TRY(check_index(index, kOp));
  STREAMREC_CUDA_TRY(check_keys(keys, n, kOp));
  STREAMREC_CUDA_REQUIRE(n == 0 || (vals != nullptr && flag != nullptr),
                         "%s: vals and flag must be set", kOp);
  if (n == 0) return ok();
  insert_or_assign_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
      index.slots, static_cast<uint64_t>(index.capacity - 1), keys, vals, n, flag);
  STREAMREC_CUDA_LAUNCHED();
  return ok();
}

extern "C" int streamrec_cuda_erase(StreamrecIndex index, const int64_t* keys, int64_t n,
                                    int64_t* erased, cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_index(index, "erase"));
  STREAMREC_CUDA_TRY(check_keys(keys, n, "erase"));
  if (n == 0) return ok();
  erase_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
      index.slots, static_cast<uint64_t>(index.capacity - 1), keys, n,
      reinterpret_cast<unsigned long long*>(erased));
  STREAMREC_CUDA_LAUNCHED();
  return ok();
}

extern "C" int streamrec_cuda_size(StreamrecIndex index, int64_t* size, cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_index(index, "size"));
  STREAMREC_CUDA_REQUIRE(size != nullptr, "size: size is NULL");
  STREAMREC_CUDA_CHECK(cudaMemsetAsync(size, 0, sizeof(int64_t), stream));
  size_kernel<<<blocks_for(index.capacity), kThreads, 0, stream>>>(
      index.slots, index.capacity, reinterpret_cast<unsigned long long*>(size));
  STREAMREC_CUDA_LAUNCHED();
  return ok();
}

extern "C" int streamrec_cuda_export(StreamrecIndex index, int64_t* keys, int64_t* rows,
                                     int64_t* count, cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_index(index, "export"));
  STREAMREC_CUDA_REQUIRE(keys != nullptr && rows != nullptr && count != nullptr,
                         "export: keys, rows and count must be set");
  STREAMREC_CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof(int64_t), stream));
  export_kernel<<<blocks_for(index.capacity), kThreads, 0, stream>>>(
      index.slots, index.capacity, keys, rows, reinterpret_cast<unsigned long long*>(count));
  STREAMREC_CUDA_LAUNCHED();
  return ok();
}

extern "C" int streamrec_cuda_index_rebuild(StreamrecIndex src, StreamrecIndex dst,
                                            int32_t* flag, cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_index(src, "index_rebuild"));
  STREAMREC_CUDA_TRY(check_index(dst, "index_rebuild"));
  STREAMREC_CUDA_REQUIRE(flag != nullptr, "index_rebuild: flag is NULL");
  STREAMREC_CUDA_REQUIRE(src.slots != dst.slots, "index_rebuild: src and dst are one index");
  init_kernel<<<blocks_for(dst.capacity), kThreads, 0, stream>>>(dst.slots, dst.capacity);
  STREAMREC_CUDA_LAUNCHED();
  rebuild_kernel<<<blocks_for(src.capacity), kThreads, 0, stream>>>(
      src.slots, src.capacity, dst.slots, static_cast<uint64_t>(dst.capacity - 1), flag);
  STREAMREC_CUDA_LAUNCHED();
  return ok();
}
