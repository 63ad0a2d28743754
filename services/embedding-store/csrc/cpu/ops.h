// The sparse-table operations, as free functions over tensors, named after HierarchicalKV
// (find, find_or_insert, insert_or_assign, export_batch). A CUDA extension implements the
// same signatures over device tensors so the Python store stays the same.
//
// Hash index: open addressing with linear probing over one (capacity, 2) int64 tensor of
// [key, row] slots; row == -1 marks an empty slot; capacity is a power of two. Rows are ids
// into the table's row matrix. Erasing is done by rebuilding
// (index_build) after compaction, which shrink() does once a day.
#pragma once

#include <torch/extension.h>

#include <tuple>

#include "table_params.h"

namespace streamrec {

// kept_scratch: the ops keep their scratch vectors per thread between calls (thread_local,
// resized, never shrunk). Fresh memory costs a page fault per 4 KiB, about 2 s per GiB on
// small VMs: for a call over 100k keys that is more than the call's work.

// --- per-step buffers (buffer_pool.cpp) ---
// An empty tensor for a per-step result (a pull's rows, a push's sums): 1 MiB or more comes
// from a pool of mappings that keep their pages between steps (no page faults once warm);
// smaller, or with STREAMREC_KEEP_FREED_MEMORY=0, it is torch::empty.
torch::Tensor step_buffer(at::IntArrayRef sizes, const torch::TensorOptions& options);

// --- hash index (hash_index.cpp) ---
// slots: (capacity, 2) int64 [key, row] pairs, row == -1 for an empty slot.
// find_count and find_gather report an absent key as -2 - s, s the empty slot where its probe
// ended (any value < 0 means absent): insert_init can claim that slot without probing again,
// as long as the index was not rebuilt in between (inserts only fill empty slots, so the probe
// run before s still holds other keys).
// Row id per key, -1 where absent. keys: (n,) int64 -> (n,) int64.
torch::Tensor find(const torch::Tensor& slots, const torch::Tensor& keys);
// Row id per key, inserting absent keys with ids next_row, next_row + 1, ... in order of
// first occurrence (duplicates share one id). The caller guarantees room in the index.
// Returns (rows (n,) int64, new_keys (m,) int64 in id order).
std::tuple<torch::Tensor, torch::Tensor> find_or_insert(torch::Tensor slots,
                                                        const torch::Tensor& keys,
                                                        int64_t next_row);
// Sets key -> val for every pair (last wins). keys, vals: (n,) int64.
void insert_or_assign(torch::Tensor slots, const torch::Tensor& keys, const torch::Tensor& vals);
// Distinct keys in order of first occurrence and each key's position among them (a hash
// dedup, cheaper than sorting). keys: (n,) int64 -> (uniq (u,) int64, inverse (n,) int64).
std::tuple<torch::Tensor, torch::Tensor> unique(const torch::Tensor& keys);
// A fresh index of `capacity` slots holding keys[i] -> i (built in parallel).
// keys: (n,) int64, distinct (the caller's row keys).
torch::Tensor index_build(int64_t capacity, const torch::Tensor& keys);
// Row id per key and the number of absent keys, in one pass.
// keys: (n,) int64 -> (rows (n,) int64, -2 - slot where absent; misses).
std::tuple<torch::Tensor, int64_t> find_count(const torch::Tensor& slots, const torch::Tensor& keys);
// Fused find + gather (one pass, two-stage prefetch of slot then row): weights of each key,
// zeros where absent (left unwritten unless zero_misses: a pull that creates them fills them).
// keys: (n,) int64 -> (out (n, dim) float32, rows (n,) int64 (-2 - slot where absent), misses).
std::tuple<torch::Tensor, torch::Tensor, int64_t> find_gather(const torch::Tensor& slots,
                                                              const torch::Tensor& keys,
                                                              const torch::Tensor& data,
                                                              const TableParams& p,
                                                              bool zero_misses);

// --- a request's rows, client side (batch_rows.cpp) ---
// Rows idx of the parts laid end to end (a request's reply parts, not concatenated first):
// parts (u_p, d) float32, idx (n,) int64 in [0, sum u_p) -> (n, d), parallel with prefetch.
torch::Tensor take_rows(const std::vector<torch::Tensor>& parts, const torch::Tensor& idx);
// Rows of src summed by inverse (a dedup's inverse: every row of [0, u) has a position):
// (n, d) float32, (n,) int64 -> ((u, d) float32, whether every sum is finite). A row seen
// once is copied; a repeated row is summed over its positions in index order in float64.
std::tuple<torch::Tensor, bool> sum_rows(const torch::Tensor& src, const torch::Tensor& inverse,
                                         int64_t u);
// Whether no value of a contiguous float32 tensor is NaN or Inf (parallel).
bool all_finite(const torch::Tensor& t);

// --- rows (rows.cpp) ---
// Initialises rows [start, start + count): stats zero, weights from the initializers
// (deterministic per seed, key and column), optimizer state to its initial value, embedx
// expanded at once when embedx_threshold <= 0. data: (R, width) float32; row_keys: (R,) int64.
void init_rows(torch::Tensor data, const torch::Tensor& row_keys, int64_t start, int64_t count,
               const TableParams& p);
// Weights of the given rows, zeros where rows[i] == -1. -> (n, dim) float32.
torch::Tensor gather(const torch::Tensor& data, const torch::Tensor& rows, const TableParams& p);
// Per-key deterministic initial weights as init_rows and the expansion draw them; embedx as
// zeros unless with_embedx. keys: (n,) int64 -> (n, dim) float32.
torch::Tensor initial_weights(const torch::Tensor& keys, const TableParams& p, bool with_embedx);

// Fused creation: for every i with rows[i] < 0, inserts keys[i] (duplicates share one
// row) with ids start, start + 1, ... in order of first occurrence, sets row_keys, initialises
// the row as init_rows does, sets rows[i] and, when out is defined, copies the row's weights
// to out[i]. Only the misses are visited, in parallel (row ids as a serial insert gives them,
// see hash_index.cpp); the caller reserves room for every miss in data, row_keys and the
// index; no other thread may use the index meanwhile (the store's write lock). rows: (n,) int64 (updated in place);
// out: (n, dim) float32 or undefined. hinted: rows < -1 hold the slots find_count or
// find_gather found on this same index (probing starts there); false probes from home.
// Returns the number of rows created.
int64_t insert_init(torch::Tensor slots, torch::Tensor data, torch::Tensor row_keys,
                    const torch::Tensor& keys, torch::Tensor rows, torch::Tensor out,
                    int64_t start, const TableParams& p, bool hinted);

// Initialises one row (pointer to its first column) as init_rows does; expand: embedx drawn
// at once (embedx_threshold <= 0).
void init_row(float* row, int64_t key, const TableParams& p, bool expand);

// Maps the memory of rows [start, end) of a contiguous tensor (madvise MADV_POPULATE_WRITE,
// contents unchanged), so that first writes there take no page faults; the store calls it
// from a background thread ahead of row creation. False where the kernel lacks it.
bool prefault(const torch::Tensor& t, int64_t start, int64_t end);

// Asks the kernel for transparent huge pages over the whole 2 MiB pages of a contiguous
// tensor (madvise MADV_HUGEPAGE): random probes of a large index or row matrix then miss
// the TLB far less (find_gather 1.7x faster on a 2M-row table). Call before first touch.
// False where the range holds no whole huge page or the kernel refuses.
bool advise_huge(const torch::Tensor& t);

// Which build of the hot draws this CPU runs: "avx512", or "portable" (no AVX-512, or
// STREAMREC_SIMD=portable in the environment at import). Both give the same bits.
const char* simd_path();

// Fills the embedx weights of one row (pointer to its first column) from its initializer.
void init_embedx(float* row, int64_t key, const TableParams& p);

// --- optimizer (optimizer.cpp) ---
// Fused push: show/click, unseen days, dirty flag, the embed rule, the embedx rule on expanded
// rows, then expansion of rows whose score reached embedx_threshold. Repeated rows are summed
// first (grads, shows, clicks); rows of -1 are skipped.
// rows: (n,) int64; grads: (n, dim) float32; shows, clicks: (n,) float32; row_keys: (R,)
// int64 (the expansion initialises embedx from the row's key). Returns the number of rows
// expanded.
int64_t update(torch::Tensor data, const torch::Tensor& row_keys, const torch::Tensor& rows,
               const torch::Tensor& grads, const torch::Tensor& shows,
               const torch::Tensor& clicks, const TableParams& p);

// Counts of bad inputs of a push, before anything is written:
// (rows of grads with NaN/Inf, shows or clicks that are NaN/Inf or negative).
// grads: (n, dim) float32; shows, clicks: (n,) float32.
std::tuple<int64_t, int64_t> check_push(const torch::Tensor& grads, const torch::Tensor& shows,
                                        const torch::Tensor& clicks);

// --- day advance, shrink, save selection (shrink.cpp) ---
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
