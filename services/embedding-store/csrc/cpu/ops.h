// The whole API of the sparse-table operations (streamrec.embedding_store._C), as free
// functions over CPU tensors, named after HierarchicalKV (find, find_or_insert,
// insert_or_assign). The CUDA extension (csrc/cuda/streamrec_cuda.h) implements the same ops;
// the row math and the probe rules both run are written once, in csrc/shared.
//
// Hash index: open addressing with linear probing over one (capacity, 2) int64 tensor of
// [key, row] slots; row == -1 marks an empty slot, a row < 0 never matches a key (the CUDA
// index's tombstones keep their key); capacity is a power of two. Rows are ids
// into the table's row matrix. Erasing is done by rebuilding (index_build) after compaction,
// which shrink() does once a day.
//
// Errors: every op checks its arguments before it writes anything and raises c10::Error
// (RuntimeError in Python) naming the op and the value: a full index (no empty slot for a new
// key; the index is left as it was), a row id outside the table, params not finalized, a size
// that overflows int64. Inputs an op only reads may start at any byte (a message's arrays):
// a misaligned one is read from an aligned copy; tensors an op writes must be aligned.
// One file per op or op family, named in each section below; the argument checks they share
// are in checks.h, the index's probing in index_probe.h.
//
// Shapes: (n,) is one value per key or position, (R, width) the table's row matrix (R rows
// of TableParams::width floats), (capacity, 2) the index.
#pragma once

#include <torch/types.h>

#include <tuple>
#include <vector>

#include "table_params.h"

namespace streamrec {

// kept_scratch: the ops keep their scratch vectors per thread between calls (thread_local,
// resized, never shrunk). Fresh memory costs a page fault per 4 KiB, about 2 s per GiB on
// small VMs: for a call over 100k keys that is more than the call's work.

// --- per-step buffers (buffer_pool.cpp) ---
// An empty tensor for a per-step result (a pull's rows, a push's sums): 1 MiB or more comes
// from a pool of mappings that keep their pages between steps (no page faults once warm);
// smaller, or with STREAMREC_KEEP_FREED_MEMORY=0, it is torch::empty. Raises when the byte
// size of `sizes` overflows int64.
torch::Tensor step_buffer(at::IntArrayRef sizes, const torch::TensorOptions& options);

// --- lookups (index_find.cpp) ---
// slots: (capacity, 2) int64 [key, row] pairs, row == -1 for an empty slot.
// find_count and find_gather report an absent key as -2 - s, s the empty slot where its probe
// ended (any value < 0 means absent): insert_init can claim that slot without probing again,
// as long as the index was not rebuilt in between (inserts only fill empty slots, so the probe
// run before s still holds other keys). On a full index (no empty slot) an absent key reads -1.
//
// Row id per key, -1 where absent. keys: (n,) int64 -> (n,) int64.
torch::Tensor find(const torch::Tensor& slots, const torch::Tensor& keys);
// Row id per key and the number of absent keys, in one pass.
// keys: (n,) int64 -> (rows (n,) int64, -2 - slot where absent; misses).
std::tuple<torch::Tensor, int64_t> find_count(const torch::Tensor& slots,
                                              const torch::Tensor& keys);
// Fused find + gather (one pass, two-stage prefetch of slot then row): weights of each key,
// zeros where absent (left unwritten unless zero_misses: a pull that creates them fills them).
// keys: (n,) int64; data: (R, width) float32
//   -> (out (n, dim) float32, rows (n,) int64 (-2 - slot where absent), misses).
// Raises when the index maps a key to a row outside data (an index of another table).
std::tuple<torch::Tensor, torch::Tensor, int64_t> find_gather(const torch::Tensor& slots,
                                                              const torch::Tensor& keys,
                                                              const torch::Tensor& data,
                                                              const TableParams& p,
                                                              bool zero_misses);

// --- serial inserts (index_insert.cpp) ---
// Row id per key, inserting absent keys with ids next_row, next_row + 1, ... in order of
// first occurrence (duplicates share one id). A key without an empty slot raises (index
// full), with the index as it was. slots: (capacity, 2) int64, updated in place;
// keys: (n,) int64; next_row >= 0 -> (rows (n,) int64, new_keys (m,) int64 in id order).
std::tuple<torch::Tensor, torch::Tensor> find_or_insert(torch::Tensor slots,
                                                        const torch::Tensor& keys,
                                                        int64_t next_row);
// Sets key -> val for every pair (last wins). A key without an empty slot raises (index
// full), with the index as it was (the call's assignments undone too).
// slots: (capacity, 2) int64, updated in place; keys: (n,) int64; vals: (n,) int64 row ids >= 0.
void insert_or_assign(torch::Tensor slots, const torch::Tensor& keys, const torch::Tensor& vals);

// --- parallel build (index_build.cpp) ---
// A fresh index of `capacity` slots (a power of two, > n) holding keys[i] -> i, built in
// parallel. keys: (n,) int64, distinct (the caller's row keys) -> (capacity, 2) int64.
torch::Tensor index_build(int64_t capacity, const torch::Tensor& keys);

// --- fused creation (index_insert_init.cpp) ---
// The arguments of insert_init, one struct (as HierarchicalKV passes a kernel's arguments).
struct InsertInitArgs {
  torch::Tensor slots;     // (capacity, 2) int64: the index, updated in place
  torch::Tensor data;      // (R, width) float32: rows [start, start + created) written
  torch::Tensor row_keys;  // (R,) int64: each row's key, written with data
  torch::Tensor keys;      // (n,) int64
  torch::Tensor rows;      // (n,) int64: row per key, < 0 where absent; updated in place
  torch::Tensor out;       // (n, dim) float32 weights per key, or undefined / empty: none
  int64_t start = 0;       // the first new row id; rows [start, start + created) must be free
  bool hinted = false;     // rows < -1 hold the slots find_count or find_gather found on this
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
// Distinct keys in order of first occurrence and each key's position among them (a hash
// dedup, cheaper than sorting). keys: (n,) int64 -> (uniq (u,) int64, inverse (n,) int64).
std::tuple<torch::Tensor, torch::Tensor> unique(const torch::Tensor& keys);

// --- a request's rows, client side (batch_rows.cpp) ---
// Rows idx of the parts laid end to end (a request's reply parts, not concatenated first):
// parts (u_p, d) float32, idx (n,) int64 in [0, sum u_p) -> (n, d), parallel with prefetch.
torch::Tensor take_rows(const std::vector<torch::Tensor>& parts, const torch::Tensor& idx);
// Rows of src summed by inverse (a dedup's inverse: every row of [0, u) has a position):
// src (n, d) float32, inverse (n,) int64 in [0, u), 0 <= u <= n -> ((u, d) float32, whether
// every sum is finite). A row seen once is copied; a repeated row is summed over its positions
// in index order in float64.
std::tuple<torch::Tensor, bool> sum_rows(const torch::Tensor& src, const torch::Tensor& inverse,
                                         int64_t u);
// Whether no value of a contiguous float32 tensor is NaN or Inf (parallel).
bool all_finite(const torch::Tensor& t);

// --- row initialisation (row_init.cpp) ---
// Initialises rows [start, start + count): stats zero, weights from the initializers
// (deterministic per seed, key and column), optimizer state to its initial value, embedx
// expanded at once when embedx_threshold <= 0. data: (R, width) float32, updated in place;
// row_keys: (R,) int64.
void init_rows(torch::Tensor data, const torch::Tensor& row_keys, int64_t start, int64_t count,
               const TableParams& p);
// Per-key deterministic initial weights as init_rows and the expansion draw them; embedx as
// zeros unless with_embedx. keys: (n,) int64 -> (n, dim) float32.
torch::Tensor initial_weights(const torch::Tensor& keys, const TableParams& p, bool with_embedx);
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
// Weights of the given rows, zeros where rows[i] < 0 (absent); a row >= R raises.
// data: (R, width) float32; rows: (n,) int64 -> (n, dim) float32.
torch::Tensor gather(const torch::Tensor& data, const torch::Tensor& rows, const TableParams& p);

// --- memory advice (memory_advice.cpp) ---
// Maps the memory of rows [start, end) of a contiguous tensor (madvise MADV_POPULATE_WRITE,
// contents unchanged), so that first writes there take no page faults; the store calls it
// from a background thread ahead of row creation. False where the kernel lacks it.
bool prefault(const torch::Tensor& t, int64_t start, int64_t end);
// Asks the kernel for transparent huge pages over the whole 2 MiB pages of a contiguous
// tensor (madvise MADV_HUGEPAGE): random probes of a large index or row matrix then miss
// the TLB far less (find_gather 1.7x faster on a 2M-row table). Call before first touch.
// False where the range holds no whole huge page or the kernel refuses.
bool advise_huge(const torch::Tensor& t);

// --- the fused push (update.cpp) ---
// The arguments of update, one struct.
struct PushArgs {
  torch::Tensor data;      // (R, width) float32: the table's rows, updated in place
  torch::Tensor row_keys;  // (R,) int64: each row's key (an expansion draws embedx from it)
  torch::Tensor rows;      // (n,) int64: row per position; < 0 (absent) skipped, >= R raises
  torch::Tensor grads;     // (n, dim) float32
  torch::Tensor shows;     // (n,) float32
  torch::Tensor clicks;    // (n,) float32
};
// Fused push: show/click, unseen days, dirty flag, the embed rule, the embedx rule on expanded
// rows, then expansion of rows whose score reached embedx_threshold. Repeated rows are summed
// first (grads, shows, clicks). Every row is checked before any is written. Returns the
// number of rows expanded.
int64_t update(const PushArgs& a, const TableParams& p);

// --- push input check (check_push.cpp) ---
// Counts of bad inputs of a push, before anything is written:
// (rows of grads with NaN/Inf, shows or clicks that are NaN/Inf or negative).
// grads: (n, dim) float32; shows, clicks: (n,) float32.
std::tuple<int64_t, int64_t> check_push(const torch::Tensor& grads, const torch::Tensor& shows,
                                        const torch::Tensor& clicks);

// --- day advance, shrink, save selection (shrink.cpp) ---
// data: (R, width) float32; size: the rows in use, 0 <= size <= R.
// unseen_days += 1 on rows [0, size).
void advance_day(torch::Tensor data, int64_t size);
// Decays show/click of rows [0, size) and returns the keep mask (size,) bool:
// false where score < delete_threshold or unseen_days > delete_after_unseen_days.
torch::Tensor shrink(torch::Tensor data, int64_t size, const TableParams& p);
// Rows a save mode takes, (size,) bool. mode: 0 all, 1 base (score >= base_threshold),
// 2 delta (changed since the last base/delta, score >= delta_threshold,
// unseen_days <= delta_keep_days).
torch::Tensor select_rows(const torch::Tensor& data, int64_t size, int64_t mode,
                          const TableParams& p);
// Clears the changed-since-save flag of rows [0, size).
void clear_dirty(torch::Tensor data, int64_t size);

}  // namespace streamrec
