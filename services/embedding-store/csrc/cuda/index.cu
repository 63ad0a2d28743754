// The GPU hash index (streamrec_cuda.h, "hash index"): open addressing with linear probing over
// the CPU core's (capacity, 2) int64 [key, row] slots, the probe rules of
// ../shared/row_layout.h (home slot, slot states, holds()). Every int64 is a key, so a slot's
// state is its row word, claimed with a 64-bit compare-and-swap (EMPTY or TOMB -> BUSY), then
// the key is written, then the row id published (release; readers acquire): a probe that
// meets BUSY waits for the key (the claiming thread is resident and publishes in a few
// instructions; sm_70+ schedules the threads of a warp independently, so a waiter in the
// claimer's warp does not stall it). Probes are bounded by capacity steps: a full index is a
// flag, never a hang.
#include "common.cuh"

namespace streamrec_cuda {
namespace {

constexpr uint64_t kNoSlot = ~uint64_t{0};
constexpr int64_t kChunk = 256;  // slots per thread of size and export (fewer atomics)

STREAMREC_HD inline Atomic<int64_t> word(int64_t* s, uint64_t i, int part) {
  return Atomic<int64_t>(s[2 * i + part]);
}

// A short pause while another thread publishes a slot.
STREAMREC_HD inline void backoff() {
#if defined(__CUDA_ARCH__)
  __nanosleep(32);
#endif
}

// The row word of slot i once no insert is writing it (waits out BUSY); acquire, so the key
// written before it is visible.
STREAMREC_HD inline int64_t settled_row(int64_t* s, uint64_t i) {
  int64_t r = word(s, i, 1).load(cuda::memory_order_acquire);
  while (r == kBusyRow) {
    backoff();
    r = word(s, i, 1).load(cuda::memory_order_acquire);
  }
  return r;
}

// Row of key (>= 0), or -1 when absent. Read-only calls: no insert writes meanwhile.
STREAMREC_HD inline int64_t lookup(const int64_t* s, uint64_t mask, int64_t key) {
  uint64_t i = home(key, mask);
  for (uint64_t step = 0; step <= mask; ++step) {
    const int64_t r = s[2 * i + 1];
    if (r == kEmptyRow) return -1;
    if (holds(r, s[2 * i], key)) return r;
    i = (i + 1) & mask;
  }
  return -1;  // full of other keys and tombstones
}

// What an insert's probe found.
struct Probe {
  int64_t row;     // the key's row when found (>= 0), else -1
  uint64_t slot;   // the key's slot when found, else the slot to claim
  int64_t expect;  // the claimed slot's row word now (kEmptyRow or kTombRow)
  bool full;       // neither the key nor a free slot
};

// Walks key's probe run: the key's slot, or the free slot to claim (the first tombstone
// before the run's end, else the empty slot that ends it).
STREAMREC_HD inline Probe probe_insert(int64_t* s, uint64_t mask, int64_t key) {
  uint64_t i = home(key, mask);
  uint64_t tomb = kNoSlot;
  for (uint64_t step = 0; step <= mask; ++step) {
    const int64_t r = settled_row(s, i);
    if (r == kEmptyRow) {
      if (tomb != kNoSlot) return {-1, tomb, kTombRow, false};
      return {-1, i, kEmptyRow, false};
    }
    if (r == kTombRow) {
      if (tomb == kNoSlot) tomb = i;
    } else if (holds(r, word(s, i, 0).load(cuda::memory_order_relaxed), key)) {
      return {r, i, 0, false};
    }
    i = (i + 1) & mask;
  }
  if (tomb != kNoSlot) return {-1, tomb, kTombRow, false};
  return {-1, 0, 0, true};
}

// Claims key's slot. A claim that loses the race probes again (the winner may hold this very
// key: the next probe waits for it).
struct Claim {
  int64_t row;    // >= 0: the key was present with this row
  uint64_t slot;  // the slot now BUSY for this thread (row < 0), kNoSlot when full
};

STREAMREC_HD inline Claim claim(int64_t* s, uint64_t mask, int64_t key) {
  for (;;) {
    const Probe p = probe_insert(s, mask, key);
    if (p.full) return {-1, kNoSlot};
    if (p.row >= 0) return {p.row, p.slot};
    int64_t expect = p.expect;
    if (word(s, p.slot, 1).compare_exchange_strong(expect, kBusyRow,
                                                   cuda::memory_order_acquire)) {
      word(s, p.slot, 0).store(key, cuda::memory_order_relaxed);
      return {-1, p.slot};
    }
  }
}

// Publishes row word r (a row id, or kTombRow to give the slot back) in a slot this thread
// claimed: release, so the key written before it is seen with it.
STREAMREC_HD inline void publish(int64_t* s, uint64_t slot, int64_t r) {
  word(s, slot, 1).store(r, cuda::memory_order_release);
}

struct InitSlots {
  int64_t* s;
  STREAMREC_HD void operator()(int64_t i) const {
    s[2 * i] = 0;
    s[2 * i + 1] = kEmptyRow;
  }
};

struct Find {
  const int64_t* s;
  uint64_t mask;
  const int64_t* keys;
  int64_t* rows;
  int64_t* misses;
  STREAMREC_HD void operator()(int64_t i) const {
    const int64_t r = lookup(s, mask, keys[i]);
    rows[i] = r;
    if (r < 0 && misses != nullptr) fetch_add_one(misses);
  }
};

STREAMREC_HD inline uint64_t mask_of(const StreamrecIndex& x) {
  return static_cast<uint64_t>(x.capacity - 1);
}

// A row created by this call, as find_or_insert's first pass leaves it in rows[i] for the
// second to initialise (-1 is a failed key; ids are >= 0).
STREAMREC_HD inline int64_t created_mark(int64_t id) { return -2 - id; }

// One key of find_or_insert's first pass (both the one-table call and the block's): its row,
// or a new row id drawn from next_row (< table.R), its key written and its slot published at
// once (probes passing it wait only for the id); created_mark(id) where mark (the second pass
// initialises it), -1 where it failed (the code raised in flag).
STREAMREC_HD inline int64_t insert_key(int64_t* s, uint64_t mask, int64_t key, int64_t* next_row,
                                       const StreamrecRows& table, int64_t* created,
                                       int32_t* flag, bool mark) {
  const Claim c = claim(s, mask, key);
  if (c.row >= 0) return c.row;
  if (c.slot == kNoSlot) {
    raise_flag(flag, STREAMREC_CUDA_ERR_INDEX_FULL);
    return -1;
  }
  const int64_t id = fetch_add_one(next_row);
  if (id >= table.R) {
    raise_flag(flag, STREAMREC_CUDA_ERR_ROWS_FULL);
    publish(s, c.slot, kTombRow);  // the key stays absent (holds() never matches a tomb)
    return -1;
  }
  *key_at(table, id) = key;
  publish(s, c.slot, id);
  if (created != nullptr) fetch_add_one(created);
  return mark ? created_mark(id) : id;
}

// The second pass's work on position i: the row the first pass created there (rows[i] a
// created_mark) initialised by the row's lanes (consecutive columns: coalesced), then the
// leader writes the id, after every lane has read the mark. Positions of keys found, or
// failed, only read their row.
template <class Lanes>
STREAMREC_HD inline void init_created(int64_t* rows, int64_t i, int64_t key,
                                      const StreamrecRows& t, const StreamrecTableParams& p,
                                      bool expand, const Lanes& lanes) {
  const int64_t r = rows[i];
  if (r >= -1) return;
  const int64_t id = created_mark(r);  // its own inverse
  init_row_lanes(row_at(t, id, p.stride), key, p, expand, lanes);
  lanes.sync();
  if (lanes.leader()) rows[i] = id;
}

// First pass of one table: a new key's rows[i] marked (created_mark) where rows are
// initialised, for InitCreated, the second pass.
struct FindOrInsert {
  int64_t* s;
  uint64_t mask;
  const int64_t* keys;
  int64_t* rows;
  StreamrecNewRows nr;
  bool init;
  STREAMREC_HD void operator()(int64_t i) const {
    rows[i] = insert_key(s, mask, keys[i], nr.next_row, nr.table, nr.created, nr.flag, init);
  }
};

struct InitCreated {
  int64_t* rows;
  const int64_t* keys;
  StreamrecRows t;
  StreamrecTableParams p;
  bool expand;
  template <class Lanes>
  STREAMREC_HD void operator()(int64_t i, const Lanes& lanes) const {
    init_created(rows, i, keys[i], t, p, expand, lanes);
  }
};

// ---- blocks: each position's table from its part ----
struct FindTables {
  StreamrecBlock b;
  const int64_t* keys;
  int64_t* rows;
  STREAMREC_HD void operator()(int64_t i) const {
    const StreamrecIndex& x = table_of(b, i).index;
    rows[i] = lookup(x.slots, mask_of(x), keys[i]);
  }
};

// First pass of a block: as FindOrInsert, into the position's table (its next_row, its
// created counter, its error word); nothing when skip holds a code.
struct FindOrInsertTables {
  StreamrecBlock b;
  const int64_t* keys;
  int64_t* rows;
  const int32_t* skip;
  STREAMREC_HD void operator()(int64_t i) const {
    if (flagged(skip)) {
      rows[i] = -1;
      return;
    }
    const StreamrecBlockTable& t = table_of(b, i);
    rows[i] = insert_key(t.index.slots, mask_of(t.index), keys[i], t.next_row, t.table,
                         t.counters, t.error, true);
  }
};

struct InitCreatedTables {
  StreamrecBlock b;
  int64_t* rows;
  const int64_t* keys;
  template <class Lanes>
  STREAMREC_HD void operator()(int64_t i, const Lanes& lanes) const {
    if (rows[i] >= -1) return;  // most positions: no table lookup
    const StreamrecBlockTable& t = table_of(b, i);
    init_created(rows, i, keys[i], t.table, t.params, expand_at_creation(t.params), lanes);
  }
};

struct BlockSizes {
  const StreamrecBlockTable* tables;
  int64_t* sizes;
  STREAMREC_HD void operator()(int64_t t) const { sizes[t] = *tables[t].next_row; }
};

struct InsertOrAssign {
  int64_t* s;
  uint64_t mask;
  const int64_t* keys;
  const int64_t* vals;
  int32_t* flag;
  STREAMREC_HD void operator()(int64_t i) const {
    if (vals[i] < 0) {  // it would read as an empty slot or a tombstone
      raise_flag(flag, STREAMREC_CUDA_ERR_ARGUMENT);
      return;
    }
    const Claim c = claim(s, mask, keys[i]);
    if (c.slot == kNoSlot)
      raise_flag(flag, STREAMREC_CUDA_ERR_INDEX_FULL);
    else if (c.row >= 0)
      word(s, c.slot, 1).exchange(vals[i], cuda::memory_order_relaxed);
    else
      publish(s, c.slot, vals[i]);
  }
};

struct Erase {
  int64_t* s;
  uint64_t mask;
  const int64_t* keys;
  int64_t* erased;
  STREAMREC_HD void operator()(int64_t i) const {
    const int64_t key = keys[i];
    uint64_t j = home(key, mask);
    for (uint64_t step = 0; step <= mask; ++step) {
      int64_t r = word(s, j, 1).load(cuda::memory_order_acquire);
      if (r == kEmptyRow) return;
      if (holds(r, word(s, j, 0).load(cuda::memory_order_relaxed), key)) {
        // a duplicate key in the batch erases once
        if (word(s, j, 1).compare_exchange_strong(r, kTombRow, cuda::memory_order_relaxed))
          add_to(erased, 1);
        return;
      }
      j = (j + 1) & mask;
    }
  }
};

// Thread t counts slots t, t + threads, ... (coalesced on the GPU), one atomic add per thread.
struct Size {
  const int64_t* s;
  int64_t cap, threads;
  int64_t* size;
  STREAMREC_HD void operator()(int64_t t) const {
    int64_t live = 0;
    for (int64_t i = t; i < cap; i += threads) live += s[2 * i + 1] >= 0;
    if (live > 0) add_to(size, live);
  }
};

struct Export {
  const int64_t* s;
  int64_t* keys;
  int64_t* rows;
  int64_t* count;
  STREAMREC_HD void operator()(int64_t i) const {
    const int64_t r = s[2 * i + 1];
    if (r < 0) return;
    const int64_t at = fetch_add_one(count);
    keys[at] = s[2 * i];
    rows[at] = r;
  }
};

struct Rebuild {
  const int64_t* src;
  int64_t* dst;
  uint64_t dst_mask;
  int32_t* flag;
  STREAMREC_HD void operator()(int64_t i) const {
    const int64_t r = src[2 * i + 1];
    if (r < 0) return;
    const Claim c = claim(dst, dst_mask, src[2 * i]);
    if (c.slot == kNoSlot)
      raise_flag(flag, STREAMREC_CUDA_ERR_INDEX_FULL);
    else if (c.row < 0)
      publish(dst, c.slot, r);
  }
};

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
  STREAMREC_CUDA_TRY(launch(index.capacity, InitSlots{index.slots}, stream, "index_init"));
  return ok();
}

extern "C" int streamrec_cuda_find(StreamrecIndex index, const int64_t* keys, int64_t n,
                                   int64_t* rows, int64_t* misses, cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_index(index, "find"));
  STREAMREC_CUDA_TRY(check_keys(keys, n, "find"));
  STREAMREC_CUDA_REQUIRE(n == 0 || rows != nullptr, "find: rows is NULL");
  STREAMREC_CUDA_TRY(
      launch(n, Find{index.slots, mask_of(index), keys, rows, misses}, stream, "find"));
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
  STREAMREC_CUDA_REQUIRE(new_rows.next_row != nullptr && new_rows.flag != nullptr,
                         "%s: new_rows.next_row and flag must be set", kOp);
  STREAMREC_CUDA_TRY(check_table(new_rows.table, false, true, kOp));
  StreamrecTableParams p{};
  bool expand = false;
  if (new_rows.table.chunks != nullptr) {
    STREAMREC_CUDA_TRY(check_params(params, kOp));
    p = *params;
    expand = expand_at_creation(p);
  }
  const bool init = new_rows.table.chunks != nullptr;
  STREAMREC_CUDA_TRY(launch(
      n, FindOrInsert{index.slots, mask_of(index), keys, rows, new_rows, init}, stream, kOp));
  if (init)
    STREAMREC_CUDA_TRY(
        launch_rows(n, InitCreated{rows, keys, new_rows.table, p, expand}, stream, kOp));
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
  STREAMREC_CUDA_TRY(
      launch(n, InsertOrAssign{index.slots, mask_of(index), keys, vals, flag}, stream, kOp));
  return ok();
}

extern "C" int streamrec_cuda_erase(StreamrecIndex index, const int64_t* keys, int64_t n,
                                    int64_t* erased, cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_index(index, "erase"));
  STREAMREC_CUDA_TRY(check_keys(keys, n, "erase"));
  STREAMREC_CUDA_TRY(
      launch(n, Erase{index.slots, mask_of(index), keys, erased}, stream, "erase"));
  return ok();
}

extern "C" int streamrec_cuda_size(StreamrecIndex index, int64_t* size, cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_index(index, "size"));
  STREAMREC_CUDA_REQUIRE(size != nullptr, "size: size is NULL");
  STREAMREC_CUDA_TRY(zero_async(size, sizeof(int64_t), stream, "size"));
  const int64_t threads = (index.capacity + kChunk - 1) / kChunk;
  STREAMREC_CUDA_TRY(launch(threads, Size{index.slots, index.capacity, threads, size}, stream,
                            "size"));
  return ok();
}

extern "C" int streamrec_cuda_export(StreamrecIndex index, int64_t* keys, int64_t* rows,
                                     int64_t* count, cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_index(index, "export"));
  STREAMREC_CUDA_REQUIRE(keys != nullptr && rows != nullptr && count != nullptr,
                         "export: keys, rows and count must be set");
  STREAMREC_CUDA_TRY(zero_async(count, sizeof(int64_t), stream, "export"));
  STREAMREC_CUDA_TRY(
      launch(index.capacity, Export{index.slots, keys, rows, count}, stream, "export"));
  return ok();
}

extern "C" int streamrec_cuda_index_rebuild(StreamrecIndex src, StreamrecIndex dst,
                                            int32_t* flag, cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_index(src, "index_rebuild"));
  STREAMREC_CUDA_TRY(check_index(dst, "index_rebuild"));
  STREAMREC_CUDA_REQUIRE(flag != nullptr, "index_rebuild: flag is NULL");
  STREAMREC_CUDA_REQUIRE(src.slots != dst.slots, "index_rebuild: src and dst are one index");
  STREAMREC_CUDA_TRY(launch(dst.capacity, InitSlots{dst.slots}, stream, "index_rebuild"));
  STREAMREC_CUDA_TRY(launch(src.capacity, Rebuild{src.slots, dst.slots, mask_of(dst), flag},
                            stream, "index_rebuild"));
  return ok();
}

extern "C" int streamrec_cuda_find_tables(StreamrecBlock block, const int64_t* keys,
                                          int64_t* rows, cudaStream_t stream) {
  constexpr const char* kOp = "find_tables";
  STREAMREC_CUDA_TRY(check_block(block, kOp));
  STREAMREC_CUDA_REQUIRE(block.n == 0 || (keys != nullptr && rows != nullptr),
                         "%s: keys and rows must be set", kOp);
  STREAMREC_CUDA_TRY(launch(block.n, FindTables{block, keys, rows}, stream, kOp));
  return ok();
}

extern "C" int streamrec_cuda_find_or_insert_tables(StreamrecBlock block, const int64_t* keys,
                                                    int64_t* rows, const int32_t* skip,
                                                    cudaStream_t stream) {
  constexpr const char* kOp = "find_or_insert_tables";
  STREAMREC_CUDA_TRY(check_block(block, kOp));
  STREAMREC_CUDA_REQUIRE(block.n == 0 || (keys != nullptr && rows != nullptr),
                         "%s: keys and rows must be set", kOp);
  STREAMREC_CUDA_TRY(
      launch(block.n, FindOrInsertTables{block, keys, rows, skip}, stream, kOp));
  STREAMREC_CUDA_TRY(launch_rows(block.n, InitCreatedTables{block, rows, keys}, stream, kOp));
  return ok();
}

extern "C" int streamrec_cuda_block_sizes(const StreamrecBlockTable* tables, int64_t count,
                                          int64_t* sizes, cudaStream_t stream) {
  STREAMREC_CUDA_REQUIRE(count >= 0, "block_sizes: count must be >= 0");
  STREAMREC_CUDA_REQUIRE(count == 0 || (tables != nullptr && sizes != nullptr),
                         "block_sizes: tables and sizes must be set");
  STREAMREC_CUDA_TRY(launch(count, BlockSizes{tables, sizes}, stream, "block_sizes"));
  return ok();
}
