// The whole API of the sparse-table operations (streamrec.embedding_store._C), as free
// functions over plain arrays (views.h), named after HierarchicalKV (find, find_or_insert,
// insert_or_assign). The CUDA extension (csrc/cuda/streamrec_cuda.h) implements the same ops;
// the row math and the probe rules both run are written once, in csrc/shared. The binding
// files (bindings.cpp, bind_*.cpp), the only ones that see tensors, check each tensor argument
// (dtype, shape, contiguity, alignment), allocate the outputs the ops write and keep each op's Python signature.
//
// Hash index: open addressing with linear probing over one (capacity, 2) int64 matrix of
// [key, row] slots; row == -1 marks an empty slot, a row < 0 never matches a key (the CUDA
// index's tombstones keep their key); capacity is a power of two. Rows are ids
// into the table's row matrix. Erasing is done by rebuilding (index_build) after compaction,
// which shrink() does once a day.
//
// Errors: every op checks its arguments before it writes anything and raises OpError
// (errors.h; RuntimeError in Python) naming the op and the value: a full index (no empty slot
// for a new key; the index is left as it was), a row id outside the table, params not
// finalized, a size that overflows int64. Inputs an op only reads may start at any byte (a
// message's arrays): the binding files hand a misaligned one over as an aligned copy; arrays
// an op writes must be aligned. One file per op or op family, named in each section below;
// the value checks they share are in checks.h, the index's probing in index_probe.h.
//
// Shapes: (n,) is one value per key or position, (R, width) the table's row matrix (R rows
// of TableParams::width floats), (capacity, 2) the index. An output's shape is given where
// the caller allocates it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "table_params.h"
#include "views.h"

namespace streamrec {

// kept_scratch: the ops keep their scratch vectors per thread between calls (thread_local,
// resized, never shrunk). Fresh memory costs a page fault per 4 KiB, about 2 s per GiB on
// small VMs: for a call over 100k keys that is more than the call's work.
//
// An op takes its thread's scratch once, through thread_scratch<T>(), and uses the reference
// it returns. In a shared library (this extension) the address of a thread_local is a call to
// __tls_get_addr, and GCC repeats that call at uses it cannot prove to be the same, inside
// loops too: measured, the push's update ran 35% slower with its thread_locals named in place
// than the same code with one lookup (or built into an executable). The call is not inlined,
// so the reference it returns is a plain pointer to the caller.
template <class T>
__attribute__((noinline)) T& thread_scratch() {
  thread_local T scratch;
  return scratch;
}

// --- per-step buffers (buffer_pool.cpp) ---
// A mapping for a per-step result (a pull's rows, a push's sums) of at least `bytes`, from a
// pool of mappings that keep their pages between steps (no page faults once warm); {nullptr,
// 0} when the heap should serve it instead: under 1 MiB, or STREAMREC_KEEP_FREED_MEMORY=0.
// Each block taken goes back with step_block_give once its buffer dies.
struct StepBlock {
  void* ptr;
  size_t bytes;
};
StepBlock step_block_take(size_t bytes);
void step_block_give(StepBlock b);

// --- lookups (index_find.cpp) ---
// slots: (capacity, 2) [key, row] pairs, row == -1 for an empty slot.
// find_count and find_gather report an absent key as -2 - s, s the empty slot where its probe
// ended (any value < 0 means absent): insert_init can claim that slot without probing again,
// as long as the index was not rebuilt in between (inserts only fill empty slots, so the probe
// run before s still holds other keys). On a full index (no empty slot) an absent key reads -1.
//
// Row id per key into rows (n,), -1 where absent; returns the number absent.
int64_t find(Matrix<const int64_t> slots, Span<const int64_t> keys, int64_t* rows);
// Row id per key into rows (n,), -2 - slot where absent, in one pass; returns the number
// absent.
int64_t find_count(Matrix<const int64_t> slots, Span<const int64_t> keys, int64_t* rows);
// Fused find + gather (one pass, two-stage prefetch of slot then row): weights of each key
// into out (n, dim), zeros where absent (left unwritten unless zero_misses: a pull that
// creates them fills them), rows (n,) as find_count gives them; returns the number absent.
// data: (R, width). Raises when the index maps a key to a row outside data (an index of
// another table).
int64_t find_gather(Matrix<const int64_t> slots, Span<const int64_t> keys,
                    Matrix<const float> data, const TableParams& p, bool zero_misses,
                    int64_t* rows, float* out);

// --- serial inserts (index_insert.cpp) ---
// Row id per key into rows (n,), inserting absent keys with ids next_row, next_row + 1, ...
// in order of first occurrence (duplicates share one id); new_keys gets the inserted keys in
// id order. A key without an empty slot raises (index full), with the index as it was.
// slots: updated in place; next_row >= 0.
void find_or_insert(Matrix<int64_t> slots, Span<const int64_t> keys, int64_t next_row,
                    int64_t* rows, std::vector<int64_t>& new_keys);
// Sets key -> val for every pair (last wins). A key without an empty slot raises (index
// full), with the index as it was (the call's assignments undone too).
// slots: updated in place; vals: (n,) row ids >= 0.
void insert_or_assign(Matrix<int64_t> slots, Span<const int64_t> keys, Span<const int64_t> vals);

// --- parallel build (index_build.cpp) ---
// Raises unless `capacity` suits an index of n keys (a power of two, > n): checked before the
// caller allocates it.
void check_build(int64_t capacity, int64_t n);
// Fills the fresh index slots (capacity, 2) (uninitialised, capacity checked) with keys[i]
// -> i, in parallel. keys: distinct (the caller's row keys).
void index_build(Span<const int64_t> keys, Matrix<int64_t> slots);

// --- fused creation (index_insert_init.cpp) ---
// The arguments of insert_init, one struct (as HierarchicalKV passes a kernel's arguments).
struct InsertInitArgs {
  Matrix<int64_t> slots;    // (capacity, 2): the index, updated in place
  Matrix<float> data;       // (R, width): rows [start, start + created) written
  Span<int64_t> row_keys;   // (R,): each row's key, written with data
  Span<const int64_t> keys;  // (n,)
  int64_t* rows = nullptr;  // (n,) row per key, < 0 where absent; updated in place
  float* out = nullptr;     // (n, dim) weights per key, or nullptr: none
  int64_t start = 0;        // the first new row id; rows [start, start + created) must be free
  bool hinted = false;      // rows < -1 hold the slots find_count or find_gather found on this
                            // same index (probing starts there); false: from the key's home
};
// Fused creation: for every i with rows[i] < 0, inserts keys[i] (duplicates share one
// row) with ids start, start + 1, ... in order of first occurrence, sets row_keys, initialises
// the row as init_rows does, sets rows[i] and, when out is given, copies the row's weights
// to out[i]. Only the misses are visited, in parallel (row ids as a serial insert gives them);
// the caller reserves room for every miss in data and row_keys (checked) and in the index
// (a full index raises and the index is left as it was); no other thread may use the index
// meanwhile (the store's write lock). Returns the number of rows created.
int64_t insert_init(const InsertInitArgs& a, const TableParams& p);

// --- hash dedup (unique.cpp) ---
// Distinct keys in order of first occurrence and each key's position among them into
// inverse (n,) (a hash dedup, cheaper than sorting). Returns the distinct keys (u,), kept
// by this thread until its next call (kept_scratch).
const std::vector<int64_t>& unique(Span<const int64_t> keys, int64_t* inverse);

// --- a request's rows, client side (batch_rows.cpp) ---
// Rows idx of the parts laid end to end (a request's reply parts, not concatenated first)
// into out (n, d), parallel with prefetch: parts (u_p, d) (read at any alignment), idx (n,)
// in [0, sum u_p) (checked, before anything is written).
void take_rows(const std::vector<Matrix<const float>>& parts, Span<const int64_t> idx,
               float* out);
// Rows of src summed by inverse (a dedup's inverse: every row of [0, u) has a position):
// src (n, d), inverse (n,) in [0, u) (checked), 0 <= u <= n (the caller's check) -> out
// (u, d); returns whether every sum is finite. A row seen once is copied; a repeated row is
// summed over its positions in index order in float64.
bool sum_rows(Matrix<const float> src, Span<const int64_t> inverse, int64_t u, float* out);
// Whether none of n floats is NaN or Inf (parallel).
bool all_finite_parallel(const float* v, int64_t n);

// --- row initialisation (row_init.cpp) ---
// Initialises rows [start, start + count): stats zero, weights from the initializers
// (deterministic per seed, key and column), optimizer state to its initial value, embedx
// expanded at once when embedx_threshold <= 0. data: (R, width), updated in place;
// row_keys: (R,) (the shorter of the two bounds the rows).
void init_rows(Matrix<float> data, Span<const int64_t> row_keys, int64_t start, int64_t count,
               const TableParams& p);
// Per-key deterministic initial weights as init_rows and the expansion draw them into out
// (n, dim); embedx as zeros unless with_embedx.
void initial_weights(Span<const int64_t> keys, const TableParams& p, bool with_embedx,
                     float* out);
// Initialises one row as init_rows does. row: (width,) floats of a finalized table;
// expand: embedx drawn at once (embedx_threshold <= 0).
void init_row(float* row, int64_t key, const TableParams& p, bool expand);
// Fills the embedx weights of one row from its initializer. row: (width,) floats.
void init_embedx(float* row, int64_t key, const TableParams& p);
// The uniform draws' pairs loop the shared row math (../shared/row_init.h) runs on this CPU:
// AVX-512 or the portable loop, chosen at load (simd_path), the same bits either way.
struct CpuPairs {
  void operator()(uint64_t stream, uint64_t j0, int64_t count, float a, float scale,
                  float* out) const;
};
// Which build of the hot draws this CPU runs: "avx512", or "portable" (no AVX-512, or
// STREAMREC_SIMD=portable in the environment at import). Both give the same bits.
const char* simd_path();

// --- gather (gather.cpp) ---
// Weights of the given rows into out (n, dim), zeros where rows[i] < 0 (absent); a row >= R
// raises. data: (R, width).
void gather(Matrix<const float> data, Span<const int64_t> rows, const TableParams& p,
            float* out);

// --- memory advice (memory_advice.cpp) ---
// Maps the memory of rows [start, end) of `rows` contiguous rows of row_bytes each at base
// (madvise MADV_POPULATE_WRITE, contents unchanged), so that first writes there take no page
// faults; the store calls it from a background thread ahead of row creation. False where the
// kernel lacks it.
bool prefault(void* base, int64_t rows, int64_t row_bytes, int64_t start, int64_t end);
// Asks the kernel for transparent huge pages over the whole 2 MiB pages of [base, base +
// bytes) (madvise MADV_HUGEPAGE): random probes of a large index or row matrix then miss
// the TLB far less (find_gather 1.7x faster on a 2M-row table). Call before first touch.
// False where the range holds no whole huge page or the kernel refuses.
bool advise_huge(void* base, int64_t bytes);

// --- the fused push (update.cpp) ---
// The arguments of update, one struct (read-only ones aligned by the caller).
struct PushArgs {
  Matrix<float> data;            // (R, width): the table's rows, updated in place
  Span<const int64_t> row_keys;  // (>= R,): each row's key (an expansion draws embedx from it)
  Span<const int64_t> rows;      // (n,): row per position; < 0 (absent) skipped, >= R raises
  const float* grads = nullptr;  // (n, dim)
  const float* shows = nullptr;  // (n,)
  const float* clicks = nullptr;  // (n,)
};
// Fused push: show/click, unseen days, dirty flag, the embed rule, the embedx rule on expanded
// rows, then expansion of rows whose score reached embedx_threshold. Repeated rows are summed
// first (grads, shows, clicks). Every row is checked before any is written. Returns the
// number of rows expanded.
int64_t update(const PushArgs& a, const TableParams& p);

// --- push input check (check_push.cpp) ---
// Counts of bad inputs of a push, before anything is written: rows of grads (n, dim) with
// NaN/Inf (read at any alignment), and shows or clicks (n,) (aligned) that are NaN/Inf or
// negative.
struct PushFaults {
  int64_t bad_rows;
  int64_t bad_counts;
};
PushFaults check_push(const float* grads, int64_t n, int64_t dim, const float* shows,
                      const float* clicks);

// --- day advance, shrink, save selection (shrink.cpp) ---
// data: (R, w) with w > kFlags (shrink and select_rows: w == width); size: the rows in use,
// 0 <= size <= R (the caller's check).
// unseen_days += 1 on rows [0, size).
void advance_day(Matrix<float> data, int64_t size);
// Decays show/click of rows [0, size) and writes the keep mask keep (size,): false where
// score < delete_threshold or unseen_days > delete_after_unseen_days.
void shrink(Matrix<float> data, int64_t size, const TableParams& p, bool* keep);
// Rows a save mode takes into sel (size,). mode: 0 all, 1 base (score >= base_threshold),
// 2 delta (changed since the last base/delta, score >= delta_threshold,
// unseen_days <= delta_keep_days); another raises.
void select_rows(Matrix<const float> data, int64_t size, int64_t mode, const TableParams& p,
                 bool* sel);
// Clears the changed-since-save flag of rows [0, size).
void clear_dirty(Matrix<float> data, int64_t size);

// --- the ssd tier (ssd_rows.cpp) ---
// A compact key -> value index: keys (cap,) int64 and vals (cap,) int32, vals < 0 marking an
// empty slot; any cap >= 1; linear probing from fastrange(mix64(key), cap). 12 bytes a slot.
struct CompactIndex {
  int64_t* keys = nullptr;
  int32_t* vals = nullptr;
  int64_t cap = 0;
};
// Value per key into out (n,), -1 where absent (parallel); returns the number absent.
int64_t compact_find(const CompactIndex& x, Span<const int64_t> keys, int64_t* out);
// Sets key -> val (last wins); vals in [0, 2^31). Raises when no slot is left (the caller
// keeps the load under 1). Returns the number of keys added.
int64_t compact_assign(const CompactIndex& x, Span<const int64_t> keys, Span<const int64_t> vals);
// Value per key into out (n,): the key's, or for a key absent, first, first + 1, ... in order
// of first occurrence (added[i] true there), inserted. Raises when no slot is left (the keys
// this call added taken out again). Returns the number of keys added.
int64_t compact_find_or_add(const CompactIndex& x, Span<const int64_t> keys, int64_t first,
                            int64_t* out, bool* added);
// Removes keys (absent ones ignored), shifting runs back; returns the number removed.
int64_t compact_erase(const CompactIndex& x, Span<const int64_t> keys);
// A cache row's CLOCK byte: used since the hand last passed, idle, free (no key), pinned
// (used by the call in progress: never a victim).
constexpr uint8_t kRefIdle = 0, kRefUsed = 1, kRefFree = 2, kRefPinned = 3;
// Up to `count` victims into out: the hand sweeps ref (n_rows,) from *hand, clearing used
// rows to idle and taking idle ones (set free); at most two laps. Returns the number found.
int64_t clock_victims(uint8_t* ref, int64_t n_rows, int64_t* hand, int64_t count, int64_t* out);
// ref[r] = value (left as it is when value < 0) and dirty[r] = true when set_dirty, for every
// r = rows[i] >= 0 (< n_rows).
void mark_rows(uint8_t* ref, bool* dirty, int64_t n_rows, Span<const int64_t> rows, int value,
               bool set_dirty);
// Initialises the rows rows[i] >= 0 as init_rows does (keys from row_keys). data: (R, width).
void init_rows_at(Matrix<float> data, Span<const int64_t> row_keys, Span<const int64_t> rows,
                  const TableParams& p);
// New file records: records[i] = [keys[i] as two words, the row init_rows gives it], and
// the row's weights into out (n, dim) unless out is null. records: (n, width + 2).
void init_records(Matrix<float> records, Span<const int64_t> keys, const TableParams& p,
                  float* out);
// data[rows[i]] = the row words of file record slots[i]. file: (F, w + 2) records [key as
// two words, row]; data: (R, w).
void records_to_rows(Matrix<const float> file, Span<const int64_t> slots, Matrix<float> data,
                     Span<const int64_t> rows);
// As records_to_rows, by pread from file descriptor fd (nothing mapped): slots ascending,
// each run of consecutive slots one read; file_rows: the records the file holds. Raises on
// a failed or short read.
void pread_records(int fd, int64_t file_rows, Span<const int64_t> slots, Matrix<float> data,
                   Span<const int64_t> rows);
// file record slots[i] = [row_keys[rows[i]], data[rows[i]]].
void rows_to_records(Matrix<const float> data, Span<const int64_t> row_keys,
                     Span<const int64_t> rows, Matrix<float> file, Span<const int64_t> slots);

}  // namespace streamrec
