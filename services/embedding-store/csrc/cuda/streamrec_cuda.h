// The whole C API of the CUDA extension: the sparse-table ops of csrc/cpu/ops.h over
// raw device pointers, for Python's ctypes (services/embedding-store/tiers/cuda_ext.py). One kernel
// family per .cu file; this header is the contract (HierarchicalKV's style: argument structs
// with a comment per field, every pointer with its shape and memory space, the stream last).
//
// Conventions:
// - Every function returns 0 (STREAMREC_CUDA_OK) or an error code below; the message of the
//   last error of the calling host thread is streamrec_cuda_last_error(). No C++ exception
//   crosses this boundary. Launches are asynchronous on `stream`: an error a kernel finds
//   (a full index) is reported by streamrec_cuda_status() after a synchronisation, through
//   the device flag the call was given. A flag belongs to one call (cuda_ext.py zeroes a new
//   one per call): two calls sharing a flag, from two threads, could read or clear each
//   other's error, and a flag already set makes the update skip its push.
// - "device" pointers are CUDA global memory (torch CUDA tensors' data_ptr()); "host"
//   pointers are CPU memory. All arrays are contiguous.
// - Two builds of one source (common.cuh): nvcc's, on a GPU; and the CPU build (g++,
//   STREAMREC_CPU_DEVICE), where "device" memory is host memory, streams are ignored (pass
//   NULL) and every call has finished when it returns; streamrec_cuda_cpu_device() says which.
// - Not safe for two calls on one index from two streams at once (lookups read plain words):
//   the store serialises a table's calls.
// - Row layout (csrc/shared/row_layout.h): a row is stride float32 (stride >= width: the
//   columns past width are padding, never read or written)
//   [show, click, unseen_days, flags, embed_w, embedx_w (dim-1), embed_state, embedx_state];
//   a table's rows live in fixed-size chunks (StreamrecRows), so that growth allocates new
//   chunks and copies nothing.
//
// Hash index: the CPU core's layout, (capacity, 2) int64 [key, row] slots, capacity a power of
// two, a key's probe starting at mix64(key) & (capacity - 1) and walking forward (linear
// probing) at most capacity slots. Every int64 is a valid key, so a slot's state lives in its
// row word: >= 0 a row id, -1 empty, -2 being written (an insert claimed it with atomicCAS and
// is writing the key), -3 erased (a tombstone: probes walk past it, inserts reuse it; its old
// key is never matched, on the CPU core's probes either: csrc/shared/row_layout.h holds()). A full
// index sets STREAMREC_CUDA_ERR_INDEX_FULL in the call's error flag and never loops; keys that
// found a slot are inserted (the index stays consistent), the others read -1, and a retry
// after a rebuild into a larger index (streamrec_cuda_index_rebuild) is idempotent.
#pragma once

#include <stddef.h>
#include <stdint.h>

#if defined(STREAMREC_CPU_DEVICE)
typedef struct CUstream_st* cudaStream_t;  // the CPU build: streams are ignored
#else
#include <cuda_runtime.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

// ---- error codes ----
#define STREAMREC_CUDA_OK 0
#define STREAMREC_CUDA_ERR_CUDA 1          // a CUDA runtime call failed (message names it)
#define STREAMREC_CUDA_ERR_ARGUMENT 2      // a bad argument (null pointer, size, capacity)
#define STREAMREC_CUDA_ERR_INDEX_FULL 3    // no empty slot for a new key (kernel flag)
#define STREAMREC_CUDA_ERR_ROWS_FULL 4     // no free row for a new key (kernel flag)
#define STREAMREC_CUDA_ERR_ROW_OUTSIDE 5   // a row id >= R (kernel flag)
#define STREAMREC_CUDA_ERR_NONFINITE 6     // a push's gradient is NaN or Inf (kernel flag)
#define STREAMREC_CUDA_ERR_BAD_COUNT 7     // a push's show or click is NaN, Inf or < 0 (flag)

// Message of the calling thread's last error ("" when none); valid until its next call.
const char* streamrec_cuda_last_error(void);
// Version of this API (bumped when a signature changes): the loader checks it.
int streamrec_cuda_api_version(void);
// Number of CUDA devices the runtime sees (0 when none or no driver, and in the CPU build);
// never fails.
int streamrec_cuda_device_count(void);
// The CUDA version the installed driver supports (cudaDriverGetVersion: 1000 * major + 10 *
// minor, 0 without a driver) and the runtime's this library links (statically, nvcc's
// default: CUDA 13's needs a driver supporting 13000, r580 or newer); both 0 in the CPU
// build. Never fail.
int streamrec_cuda_driver_version(void);
int streamrec_cuda_runtime_version(void);
// 1 in the CPU build (device pointers are host memory), 0 in nvcc's.
int streamrec_cuda_cpu_device(void);
// Reads the kernel error flag `flag` (device, one int32, 0 = no error) after synchronising
// `stream`, resets it to 0 and returns its code (0, or an ERR_* code a kernel set); the
// message names what the kernel found.
int streamrec_cuda_status(int32_t* flag, cudaStream_t stream);
// What the calling host thread has asked of the device since it started (never fails): the
// kernels (and memsets, and library ops such as a sort or a scan, each counted once) its calls
// launched, and the times a call waited for the device (streamrec_cuda_status). The CPU build
// counts the same ops at the same places, so a test without a GPU can assert how many a step
// launches and that it does not wait.
uint64_t streamrec_cuda_launch_count(void);
uint64_t streamrec_cuda_sync_count(void);

// ---- table parameters (csrc/cpu/table_params.h, finalized on the host) ----
// Rule kinds: 0 naive SGD, 1 AdaGrad, 2 StdAdaGrad, 3 Adam. Init kinds: 0 zeros,
// 1 uniform [a, b), 2 normal (mean a, std b).
typedef struct {
  int64_t kind;          // rule kind
  double learning_rate;  // step size
  double initial_g2sum;  // AdaGrad / StdAdaGrad: g2sum offset
  double lower_bound;    // weight_bounds[0]: weights clipped below
  double upper_bound;    // weight_bounds[1]: weights clipped above
  double beta1;          // Adam first-moment decay
  double beta2;          // Adam second-moment decay
  double epsilon;        // Adam denominator offset
} StreamrecRule;

typedef struct {
  int64_t kind;  // init kind
  double a;      // uniform low / normal mean
  double b;      // uniform high / normal std
} StreamrecInit;

typedef struct {
  int64_t dim;                      // weights per row: 1 embed + dim-1 embedx
  int64_t width;                    // floats per row (TableParams::width)
  int64_t embed_state;              // first column of the embed rule's state
  int64_t embedx_state;             // first column of the embedx rule's state
  StreamrecRule embed_rule;         // rule of column kEmbedW
  StreamrecRule embedx_rule;        // rule of the embedx columns
  StreamrecInit embed_init;         // initializer of the embed weight
  StreamrecInit embedx_init;        // initializer of the embedx weights
  double nonclk_coeff;              // score = nonclk_coeff (show - click) + click_coeff click
  double click_coeff;               // see nonclk_coeff
  double embedx_threshold;          // a row expands once its score reaches this
  double show_click_decay_rate;     // shrink multiplies show and click by this
  double delete_threshold;          // shrink drops rows scoring below this
  double delete_after_unseen_days;  // shrink drops rows unseen for more days than this
  double base_threshold;            // a base save takes rows scoring at least this
  double delta_threshold;           // a delta save takes dirty rows scoring at least this
  double delta_keep_days;           // ... and unseen for at most this many days
  uint64_t seed;                    // initializer seed (store seed mixed with the table name)
  int64_t stride;                   // floats from one row's start to the next's, >= width: the
                                    // device tier pads rows to a multiple of 4 (16 bytes), so
                                    // the weights (from column 4) load as float4
  int64_t dtype;                    // RowDtype: 0 fp32, 1 fp16, 2 bf16 (row_layout.h)
  uint64_t round_step;              // push counter: stochastic rounding's salt (row_codec.h)
} StreamrecTableParams;

// ---- a table's rows: fixed-size chunks of 2^shift rows ----
// Row r is at chunks[r >> shift] + (r & (2^shift - 1)) * stride (stride from the params), its
// key at key_chunks[r >> shift][r & (2^shift - 1)]: growth appends chunks and moves no row,
// so a table never needs twice its memory. A single (R, stride) matrix is one chunk (shift
// with 2^shift >= R).
typedef struct {
  float* const* chunks;        // (ceil(R / 2^shift),) device array of device pointers, each a
                               // (2^shift, stride) float32 chunk (the last one may hold fewer
                               // rows, at least up to R), 16-byte aligned; NULL where an op
                               // needs no row values (find_or_insert without init)
  int64_t* const* key_chunks;  // (ceil(R / 2^shift),) device array of device pointers, each a
                               // (2^shift,) int64 chunk of row keys; NULL where an op reads no key
  int64_t shift;               // log2 of rows per chunk, 0..62
  int64_t R;                   // rows addressable: ids in [0, R)
} StreamrecRows;

// ---- hash index (index.cu) ----
typedef struct {
  int64_t* slots;    // (capacity, 2) int64 device: [key, row] pairs
  int64_t capacity;  // slots, a power of two >= 1
} StreamrecIndex;

// Empties every slot (row = -1).
int streamrec_cuda_index_init(StreamrecIndex index, cudaStream_t stream);
// Row per key, -1 where absent; *misses (device int64, may be NULL) += the absent keys.
// keys: (n,) int64 device; rows: (n,) int64 device, written.
int streamrec_cuda_find(StreamrecIndex index, const int64_t* keys, int64_t n, int64_t* rows,
                        int64_t* misses, cudaStream_t stream);

// Where new rows go: ids come from *next_row (device int64, atomically incremented), each
// below table.R; when table.chunks is not NULL a new row is initialised at once (as init_rows).
typedef struct {
  int64_t* next_row;    // (1,) int64 device: the next free row id, updated
  StreamrecRows table;  // key_chunks required (the key of every new row is written there);
                        // a new id must be < table.R (else ERR_ROWS_FULL in flag); chunks
                        // NULL: new rows left unwritten
  int64_t* created;     // (1,) int64 device or NULL: += rows this call created
  int32_t* flag;        // (1,) int32 device: set to an ERR_* code by a failing key
} StreamrecNewRows;

// Row per key, inserting absent keys (duplicates in keys share one row). New ids are
// next_row, next_row + 1, ... in an unspecified order (the CPU's are in order of first
// occurrence): compare tables by key, not by row id. After ERR_ROWS_FULL *next_row may exceed
// table.R (ids drawn past it were given back): the caller sets it to min(*next_row,
// table.R) before a retry (cuda_ext.py does), so the retry leaves no hole in the rows.
// keys: (n,) int64 device; rows: (n,) int64 device, written (-1 for a key that failed).
int streamrec_cuda_find_or_insert(StreamrecIndex index, const int64_t* keys, int64_t n,
                                  int64_t* rows, StreamrecNewRows new_rows,
                                  const StreamrecTableParams* params, cudaStream_t stream);
// Sets key -> val (insert or assign). Duplicate keys in one call: one of their values wins
// (unspecified which; the CPU's last wins). keys, vals: (n,) int64 device, vals >= 0 (a key
// with a val < 0 is skipped and sets ERR_ARGUMENT in flag); flag: (1,) int32 device.
int streamrec_cuda_insert_or_assign(StreamrecIndex index, const int64_t* keys,
                                    const int64_t* vals, int64_t n, int32_t* flag,
                                    cudaStream_t stream);
// Erases keys (their slots become tombstones; their rows stay in the table until the caller
// compacts). keys: (n,) int64 device; erased: (1,) int64 device or NULL, += keys erased.
int streamrec_cuda_erase(StreamrecIndex index, const int64_t* keys, int64_t n, int64_t* erased,
                         cudaStream_t stream);
// Live entries of the index into *size (device int64, overwritten).
int streamrec_cuda_size(StreamrecIndex index, int64_t* size, cudaStream_t stream);
// Every live [key, row] pair, in an unspecified order (an atomic counter places them).
// keys, rows: (capacity,) int64 device, the first *count written; count: (1,) int64 device,
// overwritten.
int streamrec_cuda_export(StreamrecIndex index, int64_t* keys, int64_t* rows, int64_t* count,
                          cudaStream_t stream);
// Growth: inserts every live pair of src into dst (emptied first); dst.capacity must exceed
// src's live entries (else ERR_INDEX_FULL in flag). flag: (1,) int32 device.
int streamrec_cuda_index_rebuild(StreamrecIndex src, StreamrecIndex dst, int32_t* flag,
                                 cudaStream_t stream);

// ---- row creation (row_init.cu): the CPU core's counter-based draws ----
// Initialises rows [start, start + count) of table from their keys (stats zero, dirty,
// weights drawn per (seed, key, column), optimizer state initial, embedx expanded at once when
// score(0, 0) >= embedx_threshold). table: chunks and key_chunks set; start + count <= R.
int streamrec_cuda_init_rows(StreamrecRows table, int64_t start, int64_t count,
                             const StreamrecTableParams* params, cudaStream_t stream);
// Initial weights of keys as init_rows draws them (embedx zeros unless with_embedx).
// keys: (n,) int64 device; out: (n, dim) float32 device.
int streamrec_cuda_initial_weights(const int64_t* keys, int64_t n, int with_embedx,
                                   float* out, const StreamrecTableParams* params,
                                   cudaStream_t stream);

// ---- gather and bag pooling (gather.cu) ----
// Weights of rows, zeros where rows[i] < 0; a row >= R sets ERR_ROW_OUTSIDE in flag (and
// reads zeros). table: chunks set; rows: (n,) int64 device; out: (n, dim) float32 device;
// flag: (1,) int32 device.
int streamrec_cuda_gather(StreamrecRows table, const int64_t* rows, int64_t n, float* out,
                          int32_t* flag, const StreamrecTableParams* params,
                          cudaStream_t stream);
// Pooled bags: out[b] = sum (mode 0) or mean (mode 1) of the weights of rows[offsets[b] ..
// offsets[b + 1]) (absent rows count as zeros; an empty bag pools to zeros), as
// torch.nn.functional.embedding_bag. rows: (nnz,) int64 device; offsets: (bags + 1,) int64
// device, rising from 0 to nnz; out: (bags, dim) float32 device; flag as gather.
int streamrec_cuda_gather_pooled(StreamrecRows table, const int64_t* rows,
                                 const int64_t* offsets, int64_t bags, int mode, float* out,
                                 int32_t* flag, const StreamrecTableParams* params,
                                 cudaStream_t stream);
// Columns [col, col + cols) of rows (whole rows: col 0, cols stride), for export, inspection
// and compaction: out (n, cols) float32 device, zeros where rows[i] < 0; out_keys (n,) int64
// device or NULL: the rows' keys (-1 where rows[i] < 0); a row >= R sets ERR_ROW_OUTSIDE in
// flag and reads as absent. 0 <= col, col + cols <= stride.
int streamrec_cuda_read_rows(StreamrecRows table, const int64_t* rows, int64_t n, int64_t col,
                             int64_t cols, float* out, int64_t* out_keys, int32_t* flag,
                             const StreamrecTableParams* params, cudaStream_t stream);
// The inverse: columns [col, col + cols) of rows[i] = in[i] (n, cols) float32 device, and
// their keys = in_keys (n,) int64 device when not NULL; rows < 0 skipped, >= R set
// ERR_ROW_OUTSIDE in flag (that row unwritten). Distinct rows (a repeated row: one of its
// values wins).
int streamrec_cuda_write_rows(StreamrecRows table, const int64_t* rows, int64_t n, int64_t col,
                              int64_t cols, const float* in, const int64_t* in_keys,
                              int32_t* flag, const StreamrecTableParams* params,
                              cudaStream_t stream);

// ---- the fused push (update.cu) ----
typedef struct {
  StreamrecRows table;      // updated in place; key_chunks: an expansion draws embedx from
                            // the row's key
  const int64_t* rows;      // (n,) int64 device: row per position, < 0 skipped
  const float* grads;       // (n, dim) float32 device
  const float* shows;       // (n,) float32 device
  const float* clicks;      // (n,) float32 device
  int64_t n;                // positions
  int64_t* expanded;        // (1,) int64 device or NULL: += rows expanded
  int32_t* flag;            // (1,) int32 device, 0 on entry: ERR_ROW_OUTSIDE if a row >= R
                            // (then nothing is written)
} StreamrecPush;
// The CPU core's update: repeated rows summed first (in float64, by a segmented reduction in
// position order: a key repeated 10^5 times is summed by many threads), then per row
// show/click, unseen_days = 0, dirty, the embed rule, the embedx rule on expanded rows, or the
// expansion of rows whose score reached embedx_threshold. scratch: device memory of at least
// streamrec_cuda_update_scratch_bytes(n, dim) bytes, aligned to 256 (the caller's allocator:
// torch's caching allocator), unused once the stream has run the call.
int streamrec_cuda_update(StreamrecPush push, void* scratch, size_t scratch_bytes,
                          const StreamrecTableParams* params, cudaStream_t stream);
// Scratch bytes streamrec_cuda_update needs for n positions of dim weights (0 when n == 0).
size_t streamrec_cuda_update_scratch_bytes(int64_t n, int64_t dim);

// ---- blocks: every table of a step in one launch per op (index.cu, gather.cu, update.cu) ----
// A block is P parts laid end to end over n positions (keys, rows, gradients), part p holding
// positions [offsets[p], offsets[p + 1]) of table part_table[p]; a table may hold several
// parts (listed twice: its parts apply in part order, as calls one part at a time would). The
// ops take every table at once, so a step launches the same kernels whatever its table count,
// and none of them waits for the device: a kernel's error goes to the sticky error word of the
// table it concerns (StreamrecBlockTable.error), which the host reads at its next point that
// must synchronise anyway (cuda_ext.py / device_tier.py), naming the table.
//
//   part        0           1       2
//   table       "user" (0)  "item"  "user" (0)     part_table [0, 1, 0]
//   positions   [0, 3)      [3, 3)  [3, 5)         offsets    [0, 3, 3, 5]
typedef struct {
  StreamrecIndex index;         // the table's hash index
  StreamrecRows table;          // chunks and key_chunks set; new row ids must stay below R
                                // (reserved ahead by the host: R is min(rows, capacity))
  int64_t* next_row;            // (1,) int64 device: the next free row id, updated
  int32_t* error;               // (1,) int32 device: the first ERR_* code a kernel met for this
                                // table, kept until the host reads and clears it
  int64_t* counters;            // (2,) int64 device: += rows created, rows expanded
  StreamrecTableParams params;  // finalized; every table of a block has one dim
} StreamrecBlockTable;

typedef struct {
  const StreamrecBlockTable* tables;  // (T,) device
  const int64_t* offsets;             // (P + 1,) int64 device, rising from 0 to n
  const int64_t* part_table;          // (P,) int64 device, each in [0, T)
  int64_t parts;                      // P >= 0
  int64_t n;                          // positions: offsets[P]
  int64_t dim;                        // weights per row, the params' dim of every table
  int64_t max_rows;                   // >= every table's R (the push's sort takes its bits)
  int64_t part_bits;                  // bits that hold every part index, 1 + floor(log2 P)
} StreamrecBlock;

// find over every part: row per key (its part's table), -1 where absent.
// keys, rows: (n,) int64 device.
int streamrec_cuda_find_tables(StreamrecBlock block, const int64_t* keys, int64_t* rows,
                               cudaStream_t stream);
// find_or_insert over every part, new rows initialised (ids from their table's next_row; a
// key's duplicates, in one part or in two parts of one table, share one row). A table's failure
// (ERR_INDEX_FULL, ERR_ROWS_FULL) goes to its error word, that key's row -1. skip: (1,) int32
// device or NULL; when it holds an error code on entry (check_push_tables found a bad value)
// nothing is inserted and every row reads -1. keys, rows: (n,) int64 device.
int streamrec_cuda_find_or_insert_tables(StreamrecBlock block, const int64_t* keys,
                                         int64_t* rows, const int32_t* skip,
                                         cudaStream_t stream);
// The weights of rows (their part's table), zeros where rows[i] < 0; a row >= R sets its
// table's ERR_ROW_OUTSIDE (and reads zeros). rows: (n,) int64 device; out: (n, dim) float32.
int streamrec_cuda_gather_tables(StreamrecBlock block, const int64_t* rows, float* out,
                                 cudaStream_t stream);
// The push's inputs checked before anything is written: flag (1,) int32 device is zeroed,
// then set (and the table's error word) where a gradient is NaN/Inf (ERR_NONFINITE) or a show
// or click is NaN/Inf/< 0 (ERR_BAD_COUNT). grads (n, dim), shows and clicks (n,) float32
// device; shows NULL: 1 per position, clicks NULL: 0.
int streamrec_cuda_check_push_tables(StreamrecBlock block, const float* grads,
                                     const float* shows, const float* clicks, int32_t* flag,
                                     cudaStream_t stream);
// The fused push of every part (streamrec_cuda_update's semantics per part): positions grouped
// by (table, row, part) with one radix sort, each group summed in float64 in position order
// (pieces of 64 positions counted from the group's start, so the floats do not depend on where
// the group lies in the block), then one warp per (table, row) runs the push step for each of
// its parts in part order. Nothing is written when flag (1,) int32 device holds a code on
// entry, or a row is >= its table's R (ERR_ROW_OUTSIDE, in flag and the table's word).
// rows: (n,) int64 device (< 0 skipped); grads, shows, clicks as check_push_tables; scratch:
// streamrec_cuda_update_tables_scratch_bytes(block.n, block.dim) bytes, aligned to 256.
int streamrec_cuda_update_tables(StreamrecBlock block, const int64_t* rows, const float* grads,
                                 const float* shows, const float* clicks, int32_t* flag,
                                 void* scratch, size_t scratch_bytes, cudaStream_t stream);
size_t streamrec_cuda_update_tables_scratch_bytes(int64_t n, int64_t dim);
// Every table's next_row into sizes (T,) int64 device (one launch: what the host reads back
// without waiting, to size its reservations). tables: as StreamrecBlock.tables.
int streamrec_cuda_block_sizes(const StreamrecBlockTable* tables, int64_t count, int64_t* sizes,
                               cudaStream_t stream);
// The keys' dedup of every part at once (the CPU core's unique_groups): distinct (n,) int64
// device gets each part's distinct keys in order of first occurrence, part after part (the
// first *total of it written); inverse (n,) int64 device each position's index in distinct;
// counts (P,) int64 device the distinct keys per part; total (1,) int64 device. scratch:
// streamrec_cuda_unique_tables_scratch_bytes(n) bytes, aligned to 256.
int streamrec_cuda_unique_tables(const int64_t* keys, int64_t n, const int64_t* offsets,
                                 int64_t parts, int64_t* distinct, int64_t* inverse,
                                 int64_t* counts, int64_t* total, void* scratch,
                                 size_t scratch_bytes, cudaStream_t stream);
size_t streamrec_cuda_unique_tables_scratch_bytes(int64_t n);

// ---- day advance, shrink, save selection, dirty marks (shrink.cu) ----
// table: chunks set; size: the rows in use, 0 <= size <= R.
// unseen_days += 1 on rows [0, size).
int streamrec_cuda_advance_day(StreamrecRows table, int64_t size,
                               const StreamrecTableParams* params, cudaStream_t stream);
// Decays show/click of rows [0, size); keep: (size,) uint8 device, 0 where score <
// delete_threshold or unseen_days > delete_after_unseen_days.
int streamrec_cuda_shrink(StreamrecRows table, int64_t size, uint8_t* keep,
                          const StreamrecTableParams* params, cudaStream_t stream);
// Rows a save mode takes: mode 0 all, 1 base, 2 delta (csrc/cpu/shrink.cpp's select_rows).
// sel: (size,) uint8 device.
int streamrec_cuda_select_rows(StreamrecRows table, int64_t size, int mode, uint8_t* sel,
                               const StreamrecTableParams* params, cudaStream_t stream);
// Clears the changed-since-save flag of rows [0, size).
int streamrec_cuda_clear_dirty(StreamrecRows table, int64_t size,
                               const StreamrecTableParams* params, cudaStream_t stream);
// Sets the changed-since-save flag of the given rows (< 0 skipped, >= R ignored).
// rows: (n,) int64 device.
int streamrec_cuda_mark_dirty(StreamrecRows table, const int64_t* rows, int64_t n,
                              const StreamrecTableParams* params, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
