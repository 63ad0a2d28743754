// The ssd tier's hot parts (ssd_tier.py): its compact key -> slot index, its cache's CLOCK
// eviction and row creation at scattered rows, and the copies of rows between the cache and
// the file's records.
//
// The compact index is two arrays of the same capacity (any size >= 1, not a power of two):
// keys (cap,) int64 and vals (cap,) int32, vals == -1 marking an empty slot: 12 bytes a slot,
// 15 a key at the 0.8 load the tier keeps it under. A key's probe starts at fastrange(mix64(
// key), cap) and walks forward (linear probing); erase shifts the run after it back (no
// tombstones, so probes stay short after any number of erases).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <numeric>
#include <vector>

#include "checks.h"
#include "ops.h"
#include "parallel.h"

namespace streamrec {
namespace {

constexpr int64_t kGrain = 4096;

inline uint64_t compact_home(int64_t key, uint64_t cap) {
  const unsigned __int128 h = static_cast<unsigned __int128>(mix64(static_cast<uint64_t>(key)));
  return static_cast<uint64_t>((h * cap) >> 64);
}

// Slot holding key, or the empty slot ending its probe; cap when every slot holds another key.
inline uint64_t compact_probe(const CompactIndex& x, int64_t key) {
  const uint64_t cap = static_cast<uint64_t>(x.cap);
  uint64_t i = compact_home(key, cap);
  for (uint64_t step = 0; step < cap; ++step) {
    if (x.vals[i] < 0 || x.keys[i] == key) return i;
    if (++i == cap) i = 0;
  }
  return cap;
}

}  // namespace

int64_t compact_find(const CompactIndex& x, Span<const int64_t> keys, int64_t* out) {
  std::atomic<int64_t> misses{0};
  const uint64_t cap = static_cast<uint64_t>(x.cap);
  parallel_for(0, keys.n, kGrain, [&](int64_t b, int64_t e) {
    int64_t miss = 0;
    for (int64_t i = b; i < e; ++i) {
      if (i + 8 < e) __builtin_prefetch(x.keys + compact_home(keys.data[i + 8], cap));
      const uint64_t j = compact_probe(x, keys.data[i]);
      out[i] = (j < cap && x.vals[j] >= 0) ? x.vals[j] : -1;
      miss += out[i] < 0;
    }
    misses += miss;
  });
  return misses.load();
}

int64_t compact_assign(const CompactIndex& x, Span<const int64_t> keys, Span<const int64_t> vals) {
  constexpr const char* kOp = "compact_assign";
  STREAMREC_CHECK(keys.n == vals.n, kOp, ": keys and vals differ in length (", keys.n, " and ",
                  vals.n, ")");
  for (int64_t i = 0; i < vals.n; ++i)
    STREAMREC_CHECK(vals.data[i] >= 0 && vals.data[i] <= INT32_MAX, kOp, ": vals must be in [0, ",
                    INT32_MAX, "], got ", vals.data[i], " at position ", i);
  const uint64_t cap = static_cast<uint64_t>(x.cap);
  int64_t added = 0;
  for (int64_t i = 0; i < keys.n; ++i) {
    if (i + 8 < keys.n) {  // the probes' cache misses overlapped, as compact_find's
      const uint64_t h = compact_home(keys.data[i + 8], cap);
      __builtin_prefetch(x.keys + h, 1);
      __builtin_prefetch(x.vals + h, 1);
    }
    const uint64_t j = compact_probe(x, keys.data[i]);
    STREAMREC_CHECK(j < cap, kOp, ": the index is full (", cap, " slots); resize it first");
    added += x.vals[j] < 0;
    x.keys[j] = keys.data[i];
    x.vals[j] = static_cast<int32_t>(vals.data[i]);
  }
  return added;
}

int64_t compact_find_or_add(const CompactIndex& x, Span<const int64_t> keys, int64_t first,
                            int64_t* out, bool* added) {
  constexpr const char* kOp = "compact_find_or_add";
  STREAMREC_CHECK(first >= 0 && first + keys.n - 1 <= INT32_MAX, kOp, ": values from ", first,
                  " for ", keys.n, " keys would pass ", INT32_MAX);
  const uint64_t cap = static_cast<uint64_t>(x.cap);
  int64_t next = first;
  for (int64_t i = 0; i < keys.n; ++i) {
    if (i + 8 < keys.n) {
      const uint64_t h = compact_home(keys.data[i + 8], cap);
      __builtin_prefetch(x.keys + h, 1);
      __builtin_prefetch(x.vals + h, 1);
    }
    const uint64_t j = compact_probe(x, keys.data[i]);
    if (j == cap) {  // full: the keys added by this call are taken out again
      for (int64_t q = 0; q < i; ++q) added[q] = false;
      for (int64_t q = 0; q < i; ++q)
        if (out[q] >= first) compact_erase(x, Span<const int64_t>{keys.data + q, 1});
      STREAMREC_CHECK(false, kOp, ": the index is full (", cap, " slots); resize it first");
    }
    added[i] = x.vals[j] < 0;
    if (added[i]) {
      x.keys[j] = keys.data[i];
      x.vals[j] = static_cast<int32_t>(next++);
    }
    out[i] = x.vals[j];
  }
  return next - first;
}

int64_t compact_erase(const CompactIndex& x, Span<const int64_t> keys) {
  const uint64_t cap = static_cast<uint64_t>(x.cap);
  int64_t erased = 0;
  for (int64_t q = 0; q < keys.n; ++q) {
    uint64_t i = compact_probe(x, keys.data[q]);
    if (i == cap || x.vals[i] < 0) continue;
    ++erased;
    // backward shift: move each later entry of the run into the hole unless its home lies
    // cyclically in (hole, entry]
    uint64_t j = i;
    for (;;) {
      x.vals[i] = -1;
      for (;;) {
        if (++j == cap) j = 0;
        if (x.vals[j] < 0) goto next;
        const uint64_t h = compact_home(x.keys[j], cap);
        const bool stays = (i <= j) ? (i < h && h <= j) : (i < h || h <= j);
        if (!stays) break;
      }
      x.keys[i] = x.keys[j];
      x.vals[i] = x.vals[j];
      i = j;
    }
  next:;
  }
  return erased;
}

int64_t clock_victims(uint8_t* ref, int64_t n_rows, int64_t* hand, int64_t count, int64_t* out) {
  int64_t found = 0, h = *hand;
  // a row passed with its bit set loses it; after two laps every unpinned row has been taken
  for (int64_t seen = 0; found < count && seen < 2 * n_rows + 1; ++seen) {
    uint8_t& r = ref[h];
    if (r == kRefUsed) {
      r = kRefIdle;
    } else if (r == kRefIdle) {
      out[found++] = h;
      r = kRefFree;
    }
    if (++h == n_rows) h = 0;
  }
  *hand = h;
  return found;
}

void mark_rows(uint8_t* ref, bool* dirty, int64_t n_rows, Span<const int64_t> rows, int value,
               bool set_dirty) {
  check_rows_below(rows, n_rows, "mark_rows");
  for (int64_t i = 0; i < rows.n; ++i) {
    const int64_t r = rows.data[i];
    if (r < 0) continue;
    if (value >= 0) ref[r] = static_cast<uint8_t>(value);
    if (set_dirty) dirty[r] = true;
  }
}

void init_rows_at(Matrix<float> data, Span<const int64_t> row_keys, Span<const int64_t> rows,
                  const TableParams& p) {
  check_rows_below(rows, std::min(data.rows, row_keys.n), "init_rows_at");
  const bool expand = expand_at_creation(p);
  parallel_for(0, rows.n, 1024, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t r = rows.data[i];
      if (r >= 0) init_row(data.data + r * p.width, row_keys.data[r], p, expand);
    }
  });
}

void init_records(Matrix<float> records, Span<const int64_t> keys, const TableParams& p,
                  float* out) {
  constexpr const char* kOp = "init_records";
  STREAMREC_CHECK(records.rows == keys.n && records.cols == p.width + 2, kOp, ": records must be (",
                  keys.n, ", ", p.width + 2, "), got (", records.rows, ", ", records.cols, ")");
  const bool expand = expand_at_creation(p);
  parallel_for(0, keys.n, 1024, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float* rec = records.data + i * records.cols;
      std::memcpy(rec, keys.data + i, sizeof(int64_t));
      init_row(rec + 2, keys.data[i], p, expand);
      if (out != nullptr)
        read_weights(out + i * p.dim, rec + 2, p);
    }
  });
}

void records_to_rows(Matrix<const float> file, Span<const int64_t> slots, Matrix<float> data,
                     Span<const int64_t> rows) {
  constexpr const char* kOp = "records_to_rows";
  STREAMREC_CHECK(slots.n == rows.n && file.cols == data.cols + 2, kOp,
                  ": slots and rows differ in length, or records are not rows + 2 words");
  check_rows_below(slots, file.rows, kOp);
  check_rows_below(rows, data.rows, kOp);
  const int64_t w = data.cols;
  parallel_for(0, rows.n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      std::memcpy(data.data + rows.data[i] * w, file.data + slots.data[i] * (w + 2) + 2,
                  sizeof(float) * w);
  });
}

void pread_records(int fd, int64_t file_rows, Span<const int64_t> slots, Matrix<float> data,
                   Span<const int64_t> rows) {
  constexpr const char* kOp = "pread_records";
  STREAMREC_CHECK(slots.n == rows.n, kOp, ": slots and rows differ in length");
  check_rows_below(slots, file_rows, kOp);
  check_rows_below(rows, data.rows, kOp);
  const int64_t n = rows.n, w = data.cols, rec = w + 2;
  const int64_t rec_bytes = static_cast<int64_t>(sizeof(float)) * rec;
  constexpr int64_t kRun = 256;   // records per pread at most
  constexpr int64_t kBlock = 64;  // records a thread takes at a time
  // I/O threads, not the compute threads: a file larger than the page cache makes each
  // read wait on the disk, and an SSD answers many reads at once (queue depth: 64 reads in
  // flight reach this machine's disk's random-read IOPS, fio)
  const int64_t n_threads = std::clamp<int64_t>(n / kBlock, 1, 64);
  std::atomic<int64_t> next{0};
  std::mutex failed_mutex;
  std::string failed;
  auto work = [&]() {
    std::vector<float> buf(kRun * rec);
    for (;;) {
      const int64_t b = next.fetch_add(kBlock);
      if (b >= n) return;
      const int64_t e = std::min(b + kBlock, n);
      for (int64_t i = b; i < e;) {
        int64_t j = i + 1;  // [i, j): consecutive slots, one read
        while (j < e && j - i < kRun && slots.data[j] == slots.data[j - 1] + 1) ++j;
        const size_t want = static_cast<size_t>((j - i) * rec_bytes);
        size_t got = 0;
        while (got < want) {
          const ssize_t r = ::pread(fd, reinterpret_cast<char*>(buf.data()) + got, want - got,
                                    static_cast<off_t>(slots.data[i] * rec_bytes + got));
          if (r < 0 && errno == EINTR) continue;
          if (r <= 0) {
            std::lock_guard<std::mutex> lock(failed_mutex);
            failed = r < 0 ? std::strerror(errno) : "end of file";
            next.store(n);  // the others stop too
            return;
          }
          got += static_cast<size_t>(r);
        }
        for (int64_t q = i; q < j; ++q)
          std::memcpy(data.data + rows.data[q] * w, buf.data() + (q - i) * rec + 2,
                      sizeof(float) * w);
        i = j;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < n_threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  STREAMREC_CHECK(failed.empty(), kOp, ": reading records failed: ", failed);
}

void rows_to_records(Matrix<const float> data, Span<const int64_t> row_keys,
                     Span<const int64_t> rows, Matrix<float> file, Span<const int64_t> slots) {
  constexpr const char* kOp = "rows_to_records";
  STREAMREC_CHECK(slots.n == rows.n && file.cols == data.cols + 2, kOp,
                  ": slots and rows differ in length, or records are not rows + 2 words");
  check_rows_below(slots, file.rows, kOp);
  check_rows_below(rows, std::min(data.rows, row_keys.n), kOp);
  const int64_t w = data.cols;
  parallel_for(0, rows.n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float* rec = file.data + slots.data[i] * (w + 2);
      std::memcpy(rec, row_keys.data + rows.data[i], sizeof(int64_t));
      std::memcpy(rec + 2, data.data + rows.data[i] * w, sizeof(float) * w);
    }
  });
}

}  // namespace streamrec
