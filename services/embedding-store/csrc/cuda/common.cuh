// Shared by every .cu file of the CUDA library (internal): the error state behind
// streamrec_cuda_last_error, the check macros, the atomics and the one launch helper.
//
// The library has two builds of the same sources. nvcc (make cuda): kernels on the GPU, on
// the caller's stream. g++ with STREAMREC_CPU_DEVICE (make cuda-cpu, cuda_ext.build_cpu): the
// same kernel bodies on CPU threads through Thrust's OpenMP backend, libcu++'s
// cuda::atomic_ref for the atomics (both from the CUDA toolkit's CCCL headers), "device"
// memory being host memory and streams ignored. The row math is ../shared/ (host and
// device, no device-only branch), so the CPU build runs what the GPU runs.
#pragma once

#include <cuda/atomic>

#include <cstddef>
#include <cstdint>

#include "../shared/row_update.h"
#include "streamrec_cuda.h"

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#elif defined(STREAMREC_CPU_THREADS)
#include <thread>
#include <vector>
#else
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#endif

namespace streamrec_cuda {

using namespace ::streamrec;  // the shared row layout and row math

constexpr int kThreads = 256;  // threads per block of every 1-D launch

// Records the calling thread's last error (printf-style) and returns code.
int set_error(int code, const char* fmt, ...);
// Clears the calling thread's last error; returns STREAMREC_CUDA_OK.
int ok();
// Checks the params a host call was given (pointer, finalized columns).
int check_params(const StreamrecTableParams* p, const char* op);

// ---- memory and streams (errors.cu: the CUDA runtime, or host memory in the CPU build) ----
int zero_async(void* p, size_t bytes, cudaStream_t stream, const char* op);
// Copies bytes from device memory to the host and waits for the stream.
int read_back(void* host, const void* device, size_t bytes, cudaStream_t stream, const char* op);
// The error of the last launch (the CPU build launches synchronously: none).
int launched(const char* op);
// The calling host thread's counts (streamrec_cuda_launch_count / _sync_count): a kernel, a
// memset or a library op (a sort, a scan) queued; a wait for the device.
void count_launch();
void count_sync();
// CUDA devices the runtime sees (0 in the CPU build, or without a driver).
int device_count();
// The CUDA version the driver supports and the one linked in (1000 major + 10 minor; 0 in
// the CPU build, or without a driver).
int driver_version();
int runtime_version();

// Four floats moved in one 16-byte access (a float4 load or store on the GPU), at a 16-byte
// aligned address.
#if defined(__CUDACC__)
using Vec4 = float4;
#else
struct __attribute__((may_alias, aligned(16))) Vec4 {
  float x, y, z, w;
};
#endif

// ---- atomics on device memory (the GPU's, or the CPU build's threads) ----
template <class T>
using Atomic = cuda::atomic_ref<T, cuda::thread_scope_device>;

// Sets a kernel error flag once (the first code wins).
STREAMREC_HD inline void raise_flag(int32_t* flag, int32_t code) {
  if (flag == nullptr) return;
  int32_t zero = 0;
  Atomic<int32_t>(*flag).compare_exchange_strong(zero, code, cuda::memory_order_relaxed);
}

// Whether a flag holds a code (another thread's writes to it may race: relaxed atomic load).
STREAMREC_HD inline bool flagged(const int32_t* flag) {
  return flag != nullptr &&
         Atomic<int32_t>(*const_cast<int32_t*>(flag)).load(cuda::memory_order_relaxed) != 0;
}

STREAMREC_HD inline void add_to(int64_t* counter, int64_t v) {
  if (counter != nullptr) Atomic<int64_t>(*counter).fetch_add(v, cuda::memory_order_relaxed);
}

// ---- warp-aggregated counters: one atomic a warp (libcu++'s atomics are inline asm, which
// nvcc does not aggregate by itself) ----
// The threads that call together: on the GPU the warp's active threads (__activemask: those
// converged here, a 1-D block's lane threadIdx.x % 32) that add to the same counter (a block's
// warp may straddle two tables: __match_any_sync on the counter's address), the lowest of them
// the leader, which adds for all and shuffles the old value to the others; in the CPU build
// each call is a warp of one (mask 1, lane 0), so the same arithmetic runs there.
struct Voters {
  unsigned mask;
  int lane;
};

#if defined(__CUDA_ARCH__)  // the one warp-only block: a vote of the warp's active threads
STREAMREC_HD inline Voters voters(const void* counter) {
  const unsigned mask = __match_any_sync(__activemask(), reinterpret_cast<uintptr_t>(counter));
  return {mask, static_cast<int>(threadIdx.x % 32)};
}
STREAMREC_HD inline int popcount(unsigned m) { return __popc(m); }
// The leader's x, for every voter.
STREAMREC_HD inline int64_t from_leader(const Voters& v, int64_t x, int leader) {
  return __shfl_sync(v.mask, static_cast<long long>(x), leader);
}
#else  // a warp of one
STREAMREC_HD inline Voters voters(const void*) { return {1u, 0}; }
STREAMREC_HD inline int popcount(unsigned m) { return __builtin_popcount(m); }
STREAMREC_HD inline int64_t from_leader(const Voters&, int64_t x, int) { return x; }
#endif

// *counter += 1 for the calling thread; returns its own old value (distinct per caller, as a
// fetch_add of 1 each would give), with one atomic add per warp.
STREAMREC_HD inline int64_t fetch_add_one(int64_t* counter) {
  const Voters v = voters(counter);
  const int leader = popcount((v.mask & (0u - v.mask)) - 1u);  // the lowest voter's lane
  int64_t old = 0;
  if (v.lane == leader)
    old = Atomic<int64_t>(*counter).fetch_add(popcount(v.mask), cuda::memory_order_relaxed);
  const unsigned below = v.lane == 0 ? 0u : v.mask & (~0u >> (32 - v.lane));
  return from_leader(v, old, leader) + popcount(below);
}

// ---- row addresses: the one place a row id becomes a pointer (StreamrecRows) ----
STREAMREC_HD inline int64_t chunk_mask(const StreamrecRows& t) {
  return (int64_t{1} << t.shift) - 1;
}
// Row r's first float; r in [0, t.R).
STREAMREC_HD inline float* row_at(const StreamrecRows& t, int64_t r, int64_t stride) {
  return t.chunks[r >> t.shift] + (r & chunk_mask(t)) * stride;
}
// Row r's key; r in [0, t.R).
STREAMREC_HD inline int64_t* key_at(const StreamrecRows& t, int64_t r) {
  return t.key_chunks[r >> t.shift] + (r & chunk_mask(t));
}
// Checks a table a host call was given: R >= 0, shift in [0, 62], chunks (and key_chunks
// where keys) set when R > 0.
int check_table(const StreamrecRows& t, bool values, bool keys, const char* op);

// ---- blocks (StreamrecBlock): every table of a step in one call ----
// The part holding position i (< n): the last p with offsets[p] <= i (an empty part never
// holds one), by binary search over the (P + 1,) offsets (a few cached loads).
STREAMREC_HD inline int64_t part_of(const StreamrecBlock& b, int64_t i) {
  int64_t lo = 0, hi = b.parts;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (b.offsets[mid] <= i)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}
// The table index of part p, and the table itself.
STREAMREC_HD inline int64_t table_index(const StreamrecBlock& b, int64_t p) {
  return b.part_table[p];
}
STREAMREC_HD inline const StreamrecBlockTable& table_of(const StreamrecBlock& b, int64_t i) {
  return b.tables[table_index(b, part_of(b, i))];
}
// Checks a block a host call was given (its device arrays are the caller's contract).
int check_block(const StreamrecBlock& b, const char* op);
// Bits that hold every value in [0, top].
int bits_for(uint64_t top);

// ---- the launch helper: f(i) for every i in [0, n), in parallel, on the stream ----
// f is a __host__ __device__ functor (a kernel body); it is copied to the device by value.
#if defined(__CUDACC__)
template <class F>
__global__ void each_kernel(int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    f(i);
}

// Blocks for n items, capped (the grid-stride loop covers the rest).
inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

template <class F>
int launch(int64_t n, const F& f, cudaStream_t stream, const char* op) {
  if (n <= 0) return STREAMREC_CUDA_OK;
  count_launch();
  each_kernel<<<blocks_for(n), kThreads, 0, stream>>>(n, f);
  return launched(op);
}
#elif defined(STREAMREC_CPU_THREADS)
// The ThreadSanitizer build (tests/embedding_store/test_cuda_race.py): STREAMREC_CPU_THREADS
// std::threads, item i on thread i mod threads (neighbours race, as a warp's threads would);
// TSan sees std::thread's synchronisation, not libgomp's.
template <class F>
int launch(int64_t n, const F& f, cudaStream_t /*stream*/, const char* /*op*/) {
  constexpr int64_t kCpuThreads = STREAMREC_CPU_THREADS;
  if (n <= 0) return STREAMREC_CUDA_OK;
  count_launch();
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < kCpuThreads && t < n; ++t)
    pool.emplace_back([&f, n, t] {
      for (int64_t i = t; i < n; i += kCpuThreads) f(i);
    });
  for (std::thread& th : pool) th.join();
  return STREAMREC_CUDA_OK;
}
#else
template <class F>
int launch(int64_t n, const F& f, cudaStream_t /*stream*/, const char* /*op*/) {
  if (n <= 0) return STREAMREC_CUDA_OK;
  count_launch();
  thrust::for_each_n(thrust::device, thrust::counting_iterator<int64_t>(0), n, f);
  return STREAMREC_CUDA_OK;
}
#endif

// ---- per-row launches: the threads that share one row (update_row's Lanes) ----
constexpr int kWarp = 32;

#if defined(__CUDACC__)
// Lane `lane` of the warp that owns a row: columns lane, lane + 32, ... (a warp touches
// consecutive floats: coalesced); the 8 lanes of sum_of_squares summed by lanes 0..7, then
// shared by shuffles and combined as the CPU combines them; lane 0 writes the row's scalars.
struct WarpLanes {
  int lane;
  __device__ int64_t first() const { return lane; }
  __device__ int64_t step() const { return kWarp; }
  __device__ bool leader() const { return lane == 0; }
  __device__ void sync() const { __syncwarp(); }
  __device__ double sum_of_squares(const float* g, int64_t d) const {
    const double mine = lane < 8 ? squares_lane(g, d, lane) : 0.0;
    double part[8];
    for (int l = 0; l < 8; ++l) part[l] = __shfl_sync(0xffffffffu, mine, l);
    return combine8(part);
  }
};

// f(row, lanes) on every lane of one warp per row: item i is lane i % 32 of row i / 32 (the
// grid-stride loop steps by whole warps and n is a multiple of 32, so a warp stays together).
template <class F>
struct EachRowWarp {
  F f;
  __device__ void operator()(int64_t i) const {
    f(i / kWarp, WarpLanes{static_cast<int>(i % kWarp)});
  }
};

template <class F>
int launch_rows(int64_t rows, const F& f, cudaStream_t stream, const char* op) {
  return launch(rows * kWarp, EachRowWarp<F>{f}, stream, op);
}
#else
// The CPU build: one thread plays a row's whole warp (every column; no sync needed), with the
// warp's arithmetic: sum_of_squares as 8 squares_lane sums and combine8.
struct OneThreadLanes {
  int64_t first() const { return 0; }
  int64_t step() const { return 1; }
  bool leader() const { return true; }
  void sync() const {}
  double sum_of_squares(const float* g, int64_t d) const {
    double part[8];
    for (int l = 0; l < 8; ++l) part[l] = squares_lane(g, d, l);
    return combine8(part);
  }
};

template <class F>
struct EachRowThread {
  F f;
  void operator()(int64_t i) const { f(i, OneThreadLanes{}); }
};

template <class F>
int launch_rows(int64_t rows, const F& f, cudaStream_t stream, const char* op) {
  return launch(rows, EachRowThread<F>{f}, stream, op);
}
#endif

}  // namespace streamrec_cuda

// Argument checks of the host entry points: records the message, returns ERR_ARGUMENT.
#define STREAMREC_CUDA_REQUIRE(cond, ...)                                        \
  do {                                                                           \
    if (!(cond)) return ::streamrec_cuda::set_error(STREAMREC_CUDA_ERR_ARGUMENT, \
                                                    __VA_ARGS__);                \
  } while (0)

// Returns at once the error code of a host helper that failed.
#define STREAMREC_CUDA_TRY(expr)                  \
  do {                                            \
    const int streamrec_rc_ = (expr);             \
    if (streamrec_rc_ != 0) return streamrec_rc_; \
  } while (0)
