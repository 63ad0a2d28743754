// The fused push (csrc/cpu/update.cpp on the device), of one table (update) or of every part of
// a block (update_tables): positions grouped with a stable radix sort of (key, position) over
// only the bits keys need, a position's key being its row + 1 (one table) or (table, row + 1,
// part) (a block), absent positions sorting first as 0; each group's gradients, shows and
// clicks summed in float64 in position order by a segmented reduction whose pieces of kPiece
// positions are counted from the group's start (so the floats depend on the group alone, not
// on where it lies in the batch: a block gives each table the bits a call of its own gives,
// and a key repeated 10^5 times is still many threads' work); then one warp per distinct
// (table, row) runs the shared push step (../shared/row_update.h) once per part in part order,
// its lanes on strided columns (coalesced), the same floats as the CPU core's one thread.
//
// Why a sort and not a hash-grouped reduction: a hash map of row -> accumulator sums each
// group by atomics, in whatever order threads arrive, so the floats would change from run to
// run (and between a block and its tables one at a time); grouping by hash and then ordering
// each group's positions is a sort again. The sort is over row bits only (20-30 bits for
// tables of 1M-1G rows); bench/embedding_store_gpu.py --cpu times both reductions.
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

constexpr int64_t kPiece = 64;  // positions of a group one thread sums per column

// Stable sort of (key, value) pairs by the low `bits` bits of key, out of place. temp == NULL:
// *temp_bytes gets the scratch the sort needs.
int sort_pairs(void* temp, size_t* temp_bytes, const uint64_t* keys_in, uint64_t* keys_out,
               const int64_t* vals_in, int64_t* vals_out, int64_t n, int bits,
               cudaStream_t stream) {
#if defined(__CUDACC__)
  if (temp != nullptr) count_launch();
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
  count_launch();
  thrust::copy(thrust::device, keys_in, keys_in + n, keys_out);
  thrust::copy(thrust::device, vals_in, vals_in + n, vals_out);
  thrust::stable_sort_by_key(thrust::device, keys_out, keys_out + n, vals_out);
#endif
  return STREAMREC_CUDA_OK;
}

// One table's sort keys: row + 1 (0: absent); flags a row >= R (before anything is written).
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

// A block's sort keys, (table, row + 1, part) from the high bits down: a (table, row)'s parts
// lie together, in part order. A row >= its table's R flags the push and the table.
struct KeysTables {
  StreamrecBlock b;
  const int64_t* rows;
  int row_bits;
  uint64_t* keyed;
  int64_t* positions;
  int32_t* flag;
  STREAMREC_HD void operator()(int64_t i) const {
    positions[i] = i;
    const int64_t r = rows[i];
    if (r < 0) {
      keyed[i] = 0;
      return;
    }
    const int64_t p = part_of(b, i), t = table_index(b, p);
    if (r >= b.tables[t].table.R) {
      raise_flag(flag, STREAMREC_CUDA_ERR_ROW_OUTSIDE);
      raise_flag(b.tables[t].error, STREAMREC_CUDA_ERR_ROW_OUTSIDE);
      keyed[i] = 0;
      return;
    }
    const uint64_t row_key = (static_cast<uint64_t>(t) << row_bits) | (static_cast<uint64_t>(r) + 1);
    keyed[i] = (row_key << b.part_bits) | static_cast<uint64_t>(p);
  }
};

// The summed values of a position: dim gradients, then its show, then its click (W = dim + 2
// columns per position); shows NULL: 1, clicks NULL: 0.
struct Values {
  const float* grads;
  const float* shows;
  const float* clicks;
  int64_t dim;
  STREAMREC_HD double at(int64_t i, int64_t c) const {
    if (c < dim) return grads[i * dim + c];
    if (c == dim) return shows != nullptr ? shows[i] : 1.0f;
    return clicks != nullptr ? clicks[i] : 0.0f;
  }
};

STREAMREC_HD inline bool starts_group(const uint64_t* sorted, int64_t j) {
  return sorted[j] != 0 && (j == 0 || sorted[j - 1] != sorted[j]);
}

// The first position of [lo, hi) whose key differs from key (every one from lo on is >= key).
STREAMREC_HD inline int64_t group_end(const uint64_t* sorted, int64_t lo, int64_t hi,
                                      uint64_t key) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (sorted[mid] == key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// A group of more than kPiece positions is summed in pieces starting kPiece, 2 kPiece, ...
// positions after its head; window w ([w kPiece, (w + 1) kPiece) of the sorted positions)
// holds at most one such piece start (two groups' starts lie more than kPiece apart), whose
// piece's sum goes to partial[w]. Thread (w, c): the window's piece, column c.
struct PieceSums {
  const uint64_t* sorted;
  const int64_t* order;
  int64_t n, W;
  Values v;
  double* partial;  // (windows, W)
  const int32_t* flag;
  STREAMREC_HD void operator()(int64_t t) const {
    if (flagged(flag)) return;
    const int64_t w = t / W, c = t - w * W;
    const int64_t b = w * kPiece, e = b + kPiece < n ? b + kPiece : n;
    uint64_t key = sorted[b];
    // the head of the group the window starts in: the first position holding its key
    int64_t lo = 0, hi = b;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (sorted[mid] < key)
        lo = mid + 1;
      else
        hi = mid;
    }
    int64_t head = lo;
    for (int64_t h = b; h < e; ++h) {
      if (sorted[h] != key) {
        key = sorted[h];
        head = h;
      }
      if (key == 0 || h - head < kPiece || (h - head) % kPiece != 0) continue;
      const int64_t end = h + kPiece < n ? h + kPiece : n;
      double acc = 0.0;
      for (int64_t q = h; q < end && sorted[q] == key; ++q) acc += v.at(order[q], c);
      partial[w * W + c] = acc;
      return;
    }
  }
};

// Each group's sum at its head: its first piece here, then the later pieces' partial sums,
// in order.
struct GroupSums {
  const uint64_t* sorted;
  const int64_t* order;
  int64_t n, W;
  Values v;
  float* sums;  // (n, W): at each group head
  const double* partial;
  const int32_t* flag;
  STREAMREC_HD void operator()(int64_t t) const {
    if (flagged(flag)) return;
    const int64_t j = t / W, c = t - j * W;
    if (!starts_group(sorted, j)) return;
    const uint64_t key = sorted[j];
    const int64_t end = j + kPiece < n ? j + kPiece : n;
    double acc = 0.0;
    for (int64_t q = j; q < end && sorted[q] == key; ++q) acc += v.at(order[q], c);
    for (int64_t h = j + kPiece; h < n && sorted[h] == key; h += kPiece)
      acc += partial[(h / kPiece) * W + c];
    sums[j * W + c] = static_cast<float>(acc);
  }
};

// Where Apply finds a group's table: one table (every key a row + 1), or a block's.
struct OneTable {
  StreamrecRows t;
  StreamrecTableParams p;
  int64_t* expanded;
  STREAMREC_HD const StreamrecRows& rows(uint64_t) const { return t; }
  STREAMREC_HD const StreamrecTableParams& params(uint64_t) const { return p; }
  STREAMREC_HD int64_t* expanded_of(uint64_t) const { return expanded; }
  STREAMREC_HD int64_t row(uint64_t key) const { return static_cast<int64_t>(key - 1); }
};

struct BlockTables {
  StreamrecBlock b;
  int row_bits;
  int part_bits;
  STREAMREC_HD const StreamrecBlockTable& table(uint64_t key) const {
    return b.tables[key >> (part_bits + row_bits)];
  }
  STREAMREC_HD const StreamrecRows& rows(uint64_t key) const { return table(key).table; }
  STREAMREC_HD const StreamrecTableParams& params(uint64_t key) const {
    return table(key).params;
  }
  STREAMREC_HD int64_t* expanded_of(uint64_t key) const { return table(key).counters + 1; }
  STREAMREC_HD int64_t row(uint64_t key) const {
    const uint64_t row_mask = (uint64_t{1} << row_bits) - 1;
    return static_cast<int64_t>(((key >> part_bits) & row_mask) - 1);
  }
};

// At the first position of each (table, row): the push step once per part holding it (its
// groups, in part order: a table listed twice steps the row twice, as two calls would).
// Every lane of the row's warp runs it (the same j, so the same branches: the warp stays
// together).
template <class Tables>
struct Apply {
  Tables tables;
  const uint64_t* sorted;
  int64_t n, dim, W;
  int part_bits;
  const float* sums;
  const int32_t* flag;
  template <class Lanes>
  STREAMREC_HD void operator()(int64_t j, const Lanes& lanes) const {
    if (flagged(flag)) return;
    const uint64_t key = sorted[j];
    if (key == 0 || (j > 0 && (sorted[j - 1] >> part_bits) == (key >> part_bits))) return;
    const StreamrecRows& t = tables.rows(key);
    const StreamrecTableParams& p = tables.params(key);
    const int64_t row = tables.row(key);
    float* w = row_at(t, row, p.stride);
    const int64_t* row_key = key_at(t, row);
    for (int64_t q = j; q < n && (sorted[q] >> part_bits) == (key >> part_bits);
         q = group_end(sorted, q, n, sorted[q])) {
      if (q > j) lanes.sync();  // the step before wrote the row
      const float* s = sums + q * W;
      if (update_row(w, row_key, s, s[dim], s[dim + 1], p, PortablePairs{}, lanes) != 0 &&
          lanes.leader())
        add_to(tables.expanded_of(key), 1);
    }
  }
};

// The push's inputs, one position each: a NaN/Inf gradient or a bad show/click flags the
// push and the position's table.
struct CheckPush {
  StreamrecBlock b;
  Values v;
  int32_t* flag;
  STREAMREC_HD void operator()(int64_t i) const {
    bool finite = true;
    for (int64_t c = 0; c < v.dim; ++c) {
      const float g = v.grads[i * v.dim + c];
      finite = finite && g - g == 0.0f;  // false for NaN and +-Inf
    }
    const double show = v.at(i, v.dim), click = v.at(i, v.dim + 1);
    const bool counts = show - show == 0.0 && click - click == 0.0 && show >= 0 && click >= 0;
    if (finite && counts) return;
    const int32_t code = finite ? STREAMREC_CUDA_ERR_BAD_COUNT : STREAMREC_CUDA_ERR_NONFINITE;
    raise_flag(flag, code);
    raise_flag(table_of(b, i).error, code);
  }
};

// The scratch of one update, carved in 256-byte aligned parts.
struct Scratch {
  int64_t n, W, windows;
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
  double* partial;
  void* sort_temp;
};

Parts carve(Scratch& s) {
  const size_t ids = sizeof(int64_t) * static_cast<size_t>(s.n);
  Parts parts;
  parts.keyed = reinterpret_cast<uint64_t*>(s.take(ids));
  parts.sorted = reinterpret_cast<uint64_t*>(s.take(ids));
  parts.positions = reinterpret_cast<int64_t*>(s.take(ids));
  parts.order = reinterpret_cast<int64_t*>(s.take(ids));
  parts.sums = reinterpret_cast<float*>(s.take(sizeof(float) * static_cast<size_t>(s.n * s.W)));
  parts.partial =
      reinterpret_cast<double*>(s.take(sizeof(double) * static_cast<size_t>(s.windows * s.W)));
  parts.sort_temp = s.take(s.sort_bytes);
  return parts;
}

Scratch plan(int64_t n, int64_t dim) {
  Scratch s{n, dim + 2, (n + kPiece - 1) / kPiece, 0, nullptr, 0};
  sort_pairs(nullptr, &s.sort_bytes, nullptr, nullptr, nullptr, nullptr, n, 64, nullptr);
  carve(s);
  return s;
}

// Carves the caller's scratch for n positions of dim weights (checked to be large enough).
int carve_scratch(int64_t n, int64_t dim, void* scratch, size_t scratch_bytes, Scratch* s,
                  Parts* x, const char* op) {
  STREAMREC_CUDA_REQUIRE(n <= (int64_t{1} << 31) - 1, "%s: at most 2^31 - 1 positions per call "
                                                      "(CUB's sort), got %lld",
                         op, static_cast<long long>(n));
  *s = plan(n, dim);
  STREAMREC_CUDA_REQUIRE(scratch != nullptr && scratch_bytes >= s->at,
                         "%s: scratch must hold %zu bytes (streamrec_cuda_update_scratch_bytes), "
                         "got %zu",
                         op, s->at, scratch_bytes);
  s->base = static_cast<char*>(scratch);
  s->at = 0;
  *x = carve(*s);
  return STREAMREC_CUDA_OK;
}

// The sort, the two sums and the steps, once the keys are in x.keyed.
template <class Tables>
int reduce_and_apply(const Scratch& s, const Parts& x, int bits, const Values& v,
                     const Tables& tables, int part_bits, int32_t* flag, cudaStream_t stream,
                     const char* op) {
  const int64_t n = s.n, W = s.W;
  size_t sort_bytes = s.sort_bytes;
  STREAMREC_CUDA_TRY(sort_pairs(x.sort_temp, &sort_bytes, x.keyed, x.sorted, x.positions,
                                x.order, n, bits, stream));
  STREAMREC_CUDA_TRY(launch(s.windows * W,
                            PieceSums{x.sorted, x.order, n, W, v, x.partial, flag}, stream, op));
  STREAMREC_CUDA_TRY(launch(
      n * W, GroupSums{x.sorted, x.order, n, W, v, x.sums, x.partial, flag}, stream, op));
  STREAMREC_CUDA_TRY(launch_rows(
      n, Apply<Tables>{tables, x.sorted, n, v.dim, W, part_bits, x.sums, flag}, stream, op));
  return STREAMREC_CUDA_OK;
}

}  // namespace
}  // namespace streamrec_cuda

using namespace streamrec_cuda;

extern "C" size_t streamrec_cuda_update_scratch_bytes(int64_t n, int64_t dim) {
  if (n <= 0 || dim <= 0) return 0;
  return plan(n, dim).at;
}

extern "C" size_t streamrec_cuda_update_tables_scratch_bytes(int64_t n, int64_t dim) {
  return streamrec_cuda_update_scratch_bytes(n, dim);
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
  Scratch s{};
  Parts x{};
  STREAMREC_CUDA_TRY(carve_scratch(a.n, p.dim, scratch, scratch_bytes, &s, &x, kOp));
  STREAMREC_CUDA_TRY(
      launch(a.n, Keys{a.rows, a.table.R, x.keyed, x.positions, a.flag}, stream, kOp));
  const Values v{a.grads, a.shows, a.clicks, p.dim};
  STREAMREC_CUDA_TRY(reduce_and_apply(s, x, bits_for(static_cast<uint64_t>(a.table.R)), v,
                                      OneTable{a.table, p, a.expanded}, 0, a.flag, stream, kOp));
  return ok();
}

extern "C" int streamrec_cuda_check_push_tables(StreamrecBlock block, const float* grads,
                                                const float* shows, const float* clicks,
                                                int32_t* flag, cudaStream_t stream) {
  constexpr const char* kOp = "check_push_tables";
  STREAMREC_CUDA_TRY(check_block(block, kOp));
  STREAMREC_CUDA_REQUIRE(flag != nullptr, "%s: flag must be set", kOp);
  STREAMREC_CUDA_REQUIRE(block.n == 0 || grads != nullptr, "%s: grads must be set", kOp);
  STREAMREC_CUDA_TRY(zero_async(flag, sizeof(int32_t), stream, kOp));
  const Values v{grads, shows, clicks, block.dim};
  STREAMREC_CUDA_TRY(launch(block.n, CheckPush{block, v, flag}, stream, kOp));
  return ok();
}

extern "C" int streamrec_cuda_update_tables(StreamrecBlock block, const int64_t* rows,
                                            const float* grads, const float* shows,
                                            const float* clicks, int32_t* flag, void* scratch,
                                            size_t scratch_bytes, cudaStream_t stream) {
  constexpr const char* kOp = "update_tables";
  STREAMREC_CUDA_TRY(check_block(block, kOp));
  if (block.n == 0) return ok();
  STREAMREC_CUDA_REQUIRE(rows != nullptr && grads != nullptr && flag != nullptr,
                         "%s: rows, grads and flag must be set", kOp);
  const int row_bits = bits_for(static_cast<uint64_t>(block.max_rows));
  const int part_bits = static_cast<int>(block.part_bits);
  STREAMREC_CUDA_REQUIRE(2 * part_bits + row_bits <= 64,
                         "%s: %lld parts of up to %lld rows need %d bits of sort key, over 64",
                         kOp, static_cast<long long>(block.parts),
                         static_cast<long long>(block.max_rows), 2 * part_bits + row_bits);
  Scratch s{};
  Parts x{};
  STREAMREC_CUDA_TRY(carve_scratch(block.n, block.dim, scratch, scratch_bytes, &s, &x, kOp));
  STREAMREC_CUDA_TRY(launch(
      block.n, KeysTables{block, rows, row_bits, x.keyed, x.positions, flag}, stream, kOp));
  const Values v{grads, shows, clicks, block.dim};
  STREAMREC_CUDA_TRY(reduce_and_apply(s, x, 2 * part_bits + row_bits, v,
                                      BlockTables{block, row_bits, part_bits}, part_bits, flag,
                                      stream, kOp));
  return ok();
}
