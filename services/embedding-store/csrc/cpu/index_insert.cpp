// Serial inserts into the hash index: find_or_insert and insert_or_assign. Misses are a small
// share once a table is warm, so inserting is serial (finding is not). A key that finds no
// empty slot raises after the call's writes are undone: the index is as it was.
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "checks.h"
#include "index_probe.h"
#include "ops.h"

namespace streamrec {

void find_or_insert(Matrix<int64_t> slots, Span<const int64_t> keys, int64_t next_row,
                    int64_t* r, std::vector<int64_t>& new_keys) {
  constexpr const char* kOp = "find_or_insert";
  const int64_t n = keys.n;
  // row ids >= 0 (a negative one reads as absent), and next_row + n fits in int64
  STREAMREC_CHECK(next_row >= 0 && next_row <= std::numeric_limits<int64_t>::max() - n, kOp,
                  ": next_row ", next_row, " with ", n, " keys gives row ids outside [0, 2^63)");
  find({slots.data, slots.rows, slots.cols}, keys, r);
  int64_t* s = slots.data;
  const int64_t* k = keys.data;
  const uint64_t mask = static_cast<uint64_t>(slots.rows - 1);
  std::vector<uint64_t> taken;  // slots filled by this call, in id order
  for (int64_t i = 0; i < n; ++i) {
    if (r[i] != -1) continue;
    const uint64_t j = probe(s, mask, k[i]);
    if (j == kNoSlot) {
      for (const uint64_t q : taken) s[2 * q + 1] = kEmptyRow;  // they were empty before
      index_full(kOp, mask + 1, k[i]);
    }
    if (s[2 * j + 1] == kEmptyRow) {
      s[2 * j] = k[i];
      s[2 * j + 1] = next_row + static_cast<int64_t>(taken.size());
      taken.push_back(j);
    }
    r[i] = s[2 * j + 1];
  }
  new_keys.resize(taken.size());
  for (size_t q = 0; q < taken.size(); ++q) new_keys[q] = s[2 * taken[q]];
}

void insert_or_assign(Matrix<int64_t> slots, Span<const int64_t> keys, Span<const int64_t> vals) {
  constexpr const char* kOp = "insert_or_assign";
  const int64_t n = keys.n;
  STREAMREC_CHECK(vals.n == n, kOp, ": keys and vals differ in length (", n, " and ", vals.n,
                  ")");
  int64_t* s = slots.data;
  const int64_t* k = keys.data;
  const int64_t* v = vals.data;
  // a value < 0 would read as an absent key, -1 as an empty slot that breaks probe runs
  for (int64_t i = 0; i < n; ++i)
    STREAMREC_CHECK(v[i] >= 0, kOp, ": vals must be row ids >= 0, got ", v[i], " at position ",
                    i);
  const uint64_t mask = static_cast<uint64_t>(slots.rows - 1);
  // (slot, its row before), kept between calls (kept_scratch in ops.h)
  auto& undo = thread_scratch<std::vector<std::pair<uint64_t, int64_t>>>();
  undo.clear();
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t j = probe(s, mask, k[i]);
    if (j == kNoSlot) {
      for (auto it = undo.rbegin(); it != undo.rend(); ++it) s[2 * it->first + 1] = it->second;
      index_full(kOp, mask + 1, k[i]);
    }
    undo.emplace_back(j, s[2 * j + 1]);
    s[2 * j] = k[i];
    s[2 * j + 1] = v[i];
  }
}

}  // namespace streamrec
