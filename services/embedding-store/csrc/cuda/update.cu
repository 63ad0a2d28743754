// The fused push (csrc/cpu/update.cpp on the device): positions grouped by row with a stable
// radix sort of (row + 1, position) over only the bits rows need (absent positions sort first
// as 0); each group's gradients, shows and clicks summed in float64 by a segmented reduction
// (pieces of kPiece sorted positions summed in parallel, then each group adds its pieces in
// order: a key repeated 10^5 times is no longer one thread's serial loop); then one warp per
// distinct row runs the shared push step (../shared/row_update.h), its lanes on strided
// columns (coalesced), the same floats as the CPU core's one thread.
#include "common.cuh"

#if defined(__CUDACC__)
#include <cub/device/device_radix_sort.cuh>
#else
#include <thrust/copy.h>
#include <thrust/execution_policy.h>
#include <thrust/sort.h>
#endif

namespace streamrec_cuda {
namespace {

constexpr int64_t kPiece = 64;  // sorted positions one thread sums per column

// Stable sort of (key, value) pairs by the low `bits` bits of key, out of place. temp == NULL:
// *temp_bytes gets the scratch the sort needs.
int sort_pairs(void* temp, size_t* temp_bytes, const uint64_t* keys_in, uint64_t* keys_out,
               const int64_t* vals_in, int64_t* vals_out, int64_t n, int bits,
               cudaStream_t stream) {
#if defined(__CUDACC__)
  const cudaError_t err = cub::DeviceRadixSort::SortPairs(
      temp, *temp_bytes, keys_in, keys_out, vals_in, vals_out, static_cast<int>(n), 0, bits,
      stream);
  if (err != cudaSuccess)
    return set_error(STREAMREC_CUDA_ERR_CUDA, "update: CUB's radix sort failed: %s",
                     cudaGetErrorString(err));
#else
  (void)bits;
  (void)stream;
  if (temp == nullptr) {
    *temp_bytes = 0;
    return STREAMREC_CUDA_OK;
  }
  thrust::copy(thrust::device, keys_in, keys_in + n, keys_out);
  thrust::copy(thrust::device, vals_in, vals_in + n, vals_out);
  thrust::stable_sort_by_key(thrust::device, keys_out, keys_out + n, vals_out);
#endif
  return STREAMREC_CUDA_OK;
}

// Bits that hold every value in [0, top].
int bits_for(uint64_t top) {
  int b = 1;
  while (b < 64 && (top >> b) != 0) ++b;
  return b;
}

STREAMREC_HD inline bool flagged(const int32_t* flag) {
  return Atomic<int32_t>(*const_cast<int32_t*>(flag)).load(cuda::memory_order_relaxed) != 0;
}

// Flags a row >= R (before anything is written); the sort's keys and positions.
struct Keys {
  const int64_t* rows;
  int64_t R;
  uint64_t* keyed;
  int64_t* positions;
  int32_t* flag;
  STREAMREC_HD void operator()(int64_t i) const {
    const int64_t r = rows[i];
    if (r >= R) raise_flag(flag, STREAMREC_CUDA_ERR_ROW_OUTSIDE);
    keyed[i] = r < 0 || r >= R ? 0 : static_cast<uint64_t>(r) + 1;
    positions[i] = i;
  }
};

// The summed values of a position: dim gradients, then its show, then its click (W = dim + 2
// columns per position).
struct Values {
  const float* grads;
  const float* shows;
  const float* clicks;
  int64_t dim;
  STREAMREC_HD double at(int64_t i, int64_t c) const {
    return c < dim ? grads[i * dim + c] : (c == dim ? shows[i] : clicks[i]);
  }
};

STREAMREC_HD inline bool starts_group(const uint64_t* sorted, int64_t j) {
  return sorted[j] != 0 && (j == 0 || sorted[j - 1] != sorted[j]);
}

// Piece p's column c: each run of one row inside the piece summed in position order. A run
// that is a whole group writes its float sum at its head; a group's run cut by the piece's
// start goes to first, one cut by its end to last (a run cut by both: first).
struct PieceSums {
  const uint64_t* sorted;
  const int64_t* order;
  int64_t n, W;
  Values v;
  float* sums;     // (n, W): at each group head
  double* first;   // (pieces, W)
  double* last;    // (pieces, W)
  const int32_t* flag;
  STREAMREC_HD void operator()(int64_t t) const {
    if (flagged(flag)) return;
    const int64_t p = t / W, c = t - p * W;
    const int64_t b = p * kPiece, e = b + kPiece < n ? b + kPiece : n;
    for (int64_t s = b; s < e;) {
      const uint64_t key = sorted[s];
      double acc = 0.0;
      int64_t q = s;
      for (; q < e && sorted[q] == key; ++q) acc += v.at(order[q], c);
      if (key != 0) {
        const bool whole = (s == 0 || sorted[s - 1] != key) && (q == n || sorted[q] != key);
        if (whole)
          sums[s * W + c] = static_cast<float>(acc);
        else if (s == b)
          first[p * W + c] = acc;
        else
          last[p * W + c] = acc;
      }
      s = q;
    }
  }
};

// A group spanning pieces: its head's piece part, then every later piece's first run, in order.
struct GroupSums {
  const uint64_t* sorted;
  int64_t n, W;
  float* sums;
  const double* first;
  const double* last;
  const int32_t* flag;
  STREAMREC_HD void operator()(int64_t t) const {
    if (flagged(flag)) return;
    const int64_t j = t / W, c = t - j * W;
    if (!starts_group(sorted, j)) return;
    const int64_t p = j / kPiece, piece_end = (p + 1) * kPiece;
    if (piece_end >= n || sorted[piece_end] != sorted[j]) return;  // whole in its piece
    int64_t lo = piece_end, hi = n;  // the group's end: the first position of a larger key
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (sorted[mid] == sorted[j])
        lo = mid + 1;
      else
        hi = mid;
    }
    double acc = j == p * kPiece ? first[p * W + c] : last[p * W + c];
    for (int64_t q = p + 1; q <= (lo - 1) / kPiece; ++q) acc += first[q * W + c];
    sums[j * W + c] = static_cast<float>(acc);
  }
};

struct Apply {
  StreamrecRows t;
  const uint64_t* sorted;
  int64_t dim, W;
  const float* sums;
  int64_t* expanded;
  StreamrecTableParams p;
  const int32_t* flag;
  // every lane of the row's warp (the same j, so the same branches: the warp stays together)
  template <class Lanes>
  STREAMREC_HD void operator()(int64_t j, const Lanes& lanes) const {
    if (flagged(flag) || !starts_group(sorted, j)) return;
    const float* s = sums + j * W;
    const int64_t row = static_cast<int64_t>(sorted[j] - 1);
    if (update_row(row_at(t, row, p.stride), key_at(t, row), s, s[dim], s[dim + 1], p,
                   PortablePairs{}, lanes) != 0 &&
        lanes.leader())
      add_to(expanded, 1);
  }
};

// The scratch of one update, carved in 256-byte aligned parts.
struct Scratch {
  int64_t n, W, pieces;
  size_t sort_bytes;
  char* base;
  size_t at;
  char* take(size_t bytes) {
    char* p = base == nullptr ? nullptr : base + at;
    at += (bytes + 255) / 256 * 256;
    return p;
  }
};

struct Parts {
  uint64_t* keyed;
  uint64_t* sorted;
  int64_t* positions;
  int64_t* order;
  float* sums;
  double* first;
  double* last;
  void* sort_temp;
};

Parts carve(Scratch& s) {
  const size_t ids = sizeof(int64_t) * static_cast<size_t>(s.n);
  const size_t piece = sizeof(double) * static_cast<size_t>(s.pieces * s.W);
  Parts parts;
  parts.keyed = reinterpret_cast<uint64_t*>(s.take(ids));
  parts.sorted = reinterpret_cast<uint64_t*>(s.take(ids));
  parts.positions = reinterpret_cast<int64_t*>(s.take(ids));
  parts.order = reinterpret_cast<int64_t*>(s.take(ids));
  parts.sums = reinterpret_cast<float*>(s.take(sizeof(float) * static_cast<size_t>(s.n * s.W)));
  parts.first = reinterpret_cast<double*>(s.take(piece));
  parts.last = reinterpret_cast<double*>(s.take(piece));
  parts.sort_temp = s.take(s.sort_bytes);
  return parts;
}

Scratch plan(int64_t n, int64_t dim) {
  Scratch s{n, dim + 2, (n + kPiece - 1) / kPiece, 0, nullptr, 0};
  sort_pairs(nullptr, &s.sort_bytes, nullptr, nullptr, nullptr, nullptr, n, 64, nullptr);
  carve(s);
  return s;
}

}  // namespace
}  // namespace streamrec_cuda

using namespace streamrec_cuda;

extern "C" size_t streamrec_cuda_update_scratch_bytes(int64_t n, int64_t dim) {
  if (n <= 0 || dim <= 0) return 0;
  return plan(n, dim).at;
}

extern "C" int streamrec_cuda_update(StreamrecPush a, void* scratch, size_t scratch_bytes,
                                     const StreamrecTableParams* params, cudaStream_t stream) {
  constexpr const char* kOp = "update";
  STREAMREC_CUDA_TRY(check_params(params, kOp));
  STREAMREC_CUDA_TRY(check_table(a.table, true, true, kOp));
  STREAMREC_CUDA_REQUIRE(a.n >= 0, "%s: n must be >= 0", kOp);
  if (a.n == 0) return ok();
  STREAMREC_CUDA_REQUIRE(a.rows != nullptr && a.grads != nullptr && a.shows != nullptr &&
                             a.clicks != nullptr && a.flag != nullptr,
                         "%s: rows, grads, shows, clicks and flag must be set", kOp);
  const StreamrecTableParams p = *params;
  const int64_t n = a.n, dim = p.dim;
  STREAMREC_CUDA_REQUIRE(n <= (int64_t{1} << 31) - 1, "%s: at most 2^31 - 1 positions per call "
                                                      "(CUB's sort), got %lld",
                         kOp, static_cast<long long>(n));
  Scratch s = plan(n, dim);
  STREAMREC_CUDA_REQUIRE(scratch != nullptr && scratch_bytes >= s.at,
                         "%s: scratch must hold %zu bytes (streamrec_cuda_update_scratch_bytes), "
                         "got %zu",
                         kOp, s.at, scratch_bytes);
  s.base = static_cast<char*>(scratch);
  s.at = 0;
  const Parts x = carve(s);
  const int64_t W = s.W;
  STREAMREC_CUDA_TRY(
      launch(n, Keys{a.rows, a.table.R, x.keyed, x.positions, a.flag}, stream, kOp));
  size_t sort_bytes = s.sort_bytes;
  STREAMREC_CUDA_TRY(sort_pairs(x.sort_temp, &sort_bytes, x.keyed, x.sorted, x.positions,
                                x.order, n, bits_for(static_cast<uint64_t>(a.table.R)), stream));
  const Values v{a.grads, a.shows, a.clicks, dim};
  STREAMREC_CUDA_TRY(launch(s.pieces * W,
                            PieceSums{x.sorted, x.order, n, W, v, x.sums, x.first, x.last, a.flag},
                            stream, kOp));
  STREAMREC_CUDA_TRY(
      launch(n * W, GroupSums{x.sorted, n, W, x.sums, x.first, x.last, a.flag}, stream, kOp));
  STREAMREC_CUDA_TRY(launch_rows(
      n, Apply{a.table, x.sorted, dim, W, x.sums, a.expanded, p, a.flag}, stream, kOp));
  return ok();
}
