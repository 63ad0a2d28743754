// A driver of the CUDA library's C API for its ThreadSanitizer build (test_cuda_race.py):
// the kernels' bodies on racing std::threads, over the index's insert protocol (claims,
// duplicate keys in one call, tombstones reused, rows full, a rebuild), the push's hot keys,
// the dirty marks, and the block ops (a table listed twice, a hot key across parts, the dedup). Exits nonzero, naming the check, when a result is wrong; TSan reports
// any data race on stderr (and exits 66).
#include <cstdio>
#include <cstdlib>
#include <set>
#include <vector>

#include "streamrec_cuda.h"

namespace {

int failed(const char* what) {
  std::fprintf(stderr, "race driver: %s\n", what);
  return 1;
}

#define CHECK(cond)                         \
  do {                                      \
    if (!(cond)) return failed(#cond);      \
  } while (0)
#define OK(call) CHECK((call) == STREAMREC_CUDA_OK)

StreamrecTableParams adagrad_dim8() {
  StreamrecTableParams p{};
  StreamrecRule rule{1, 0.05, 3.0, -10.0, 10.0, 0.9, 0.999, 1e-8};
  StreamrecInit init{1, -1e-2, 1e-2};
  p.dim = 8;
  p.embed_state = 4 + 8;     // kEmbedW + dim
  p.embedx_state = 12 + 1;   // + AdaGrad's one g2sum
  p.width = 13 + 1;
  p.stride = 16;             // rows padded to 16 bytes, as the device tier pads them
  p.embed_rule = p.embedx_rule = rule;
  p.embed_init = p.embedx_init = init;
  p.nonclk_coeff = 0.1;
  p.click_coeff = 1.0;
  p.embedx_threshold = 2.0;
  p.seed = 7;
  return p;
}

int run() {
  const StreamrecTableParams p = adagrad_dim8();
  const int64_t R = 400, n = 20000, distinct = 300;
  std::vector<int64_t> slots(2 * 1024), keys(n), rows(n), row_keys(R), next(1, 0), created(1, 0);
  std::vector<float> data(R * p.stride);
  std::vector<int32_t> flag(1, 0);
  for (int64_t i = 0; i < n; ++i) keys[i] = static_cast<int64_t>((i * 7919) % distinct) * 1000003;
  StreamrecIndex index{slots.data(), 1024};
  OK(streamrec_cuda_index_init(index, nullptr));
  // two chunks of 256 rows (the second one partly past R): rows cross a chunk border
  float* chunks[2] = {data.data(), data.data() + 256 * p.stride};
  int64_t* key_chunks[2] = {row_keys.data(), row_keys.data() + 256};
  const StreamrecRows table{chunks, key_chunks, 8, R};
  StreamrecNewRows nr{next.data(), table, created.data(), flag.data()};
  OK(streamrec_cuda_find_or_insert(index, keys.data(), n, rows.data(), nr, &p, nullptr));
  OK(streamrec_cuda_status(flag.data(), nullptr));
  CHECK(next[0] == distinct && created[0] == distinct);
  for (int64_t i = 0; i < n; ++i) CHECK(rows[i] >= 0 && row_keys[rows[i]] == keys[i]);
  // the push: row 0 at most positions (a hot key), the rest spread
  std::vector<int64_t> push_rows(n);
  for (int64_t i = 0; i < n; ++i) push_rows[i] = i % 3 == 0 ? rows[i] : rows[0];
  std::vector<float> grads(n * p.dim, 0.01f), shows(n, 1.0f), clicks(n, 0.5f);
  std::vector<int64_t> expanded(1, 0);
  const size_t bytes = streamrec_cuda_update_scratch_bytes(n, p.dim);
  std::vector<char> scratch(bytes + 256);
  char* aligned = scratch.data() + (256 - reinterpret_cast<uintptr_t>(scratch.data()) % 256) % 256;
  StreamrecPush push{table,        push_rows.data(), grads.data(),    shows.data(),
                     clicks.data(), n,                expanded.data(), flag.data()};
  OK(streamrec_cuda_update(push, aligned, bytes, &p, nullptr));
  OK(streamrec_cuda_status(flag.data(), nullptr));
  CHECK(expanded[0] > 0);
  const float hot_show = data[rows[0] * p.stride + 0];
  CHECK(hot_show == 13400.0f);  // 2/3 of 20000 positions and 67 of key 0's own
  // erase a third (duplicates erase once), then new keys reuse the tombstones
  std::vector<int64_t> erased(1, 0);
  OK(streamrec_cuda_erase(index, keys.data(), distinct / 3, erased.data(), nullptr));
  CHECK(erased[0] == distinct / 3);
  std::vector<int64_t> fresh(200), vals(200);
  for (int64_t i = 0; i < 200; ++i) fresh[i] = -1 - 17 * (i % 150), vals[i] = 5000 + i % 150;
  OK(streamrec_cuda_insert_or_assign(index, fresh.data(), vals.data(), 200, flag.data(), nullptr));
  OK(streamrec_cuda_status(flag.data(), nullptr));
  std::vector<int64_t> size(1, 0);
  OK(streamrec_cuda_size(index, size.data(), nullptr));
  CHECK(size[0] == distinct - distinct / 3 + 150);
  // rows full: ids past R are given back, the keys stay absent
  std::vector<int64_t> more(300), more_rows(300);
  for (int64_t i = 0; i < 300; ++i) more[i] = 1 + 31 * i;
  OK(streamrec_cuda_find_or_insert(index, more.data(), 300, more_rows.data(), nr, &p, nullptr));
  CHECK(streamrec_cuda_status(flag.data(), nullptr) == STREAMREC_CUDA_ERR_ROWS_FULL);
  // growth: every live pair in a larger index, found again
  std::vector<int64_t> big(2 * 4096), found(n);
  StreamrecIndex grown{big.data(), 4096};
  OK(streamrec_cuda_index_rebuild(index, grown, flag.data(), nullptr));
  OK(streamrec_cuda_status(flag.data(), nullptr));
  OK(streamrec_cuda_find(grown, fresh.data(), 200, found.data(), nullptr, nullptr));
  for (int64_t i = 0; i < 200; ++i) CHECK(found[i] == vals[i]);
  OK(streamrec_cuda_mark_dirty(table, push_rows.data(), n, &p, nullptr));
  return 0;
}

// The block ops: two tables, table 0 listed twice (its two parts race on one index, one
// next_row and one created counter, beside table 1's), a hot key in both parts of table 0,
// and the dedup of every part (its claims and atomic minimum).
int run_block() {
  const StreamrecTableParams p = adagrad_dim8();
  const int64_t R = 512, per_part = 3000, distinct = 200, n = 3 * per_part;
  std::vector<int64_t> slots0(2 * 1024), slots1(2 * 1024), keys(n), rows(n);
  std::vector<int64_t> row_keys0(R), row_keys1(R), next(2, 0), counters(4, 0);
  std::vector<float> data0(R * p.stride), data1(R * p.stride);
  std::vector<int32_t> errors(2, 0), flag(1, 0);
  for (int64_t i = 0; i < n; ++i) keys[i] = static_cast<int64_t>((i * 104729) % distinct) * 7;
  StreamrecIndex index0{slots0.data(), 1024}, index1{slots1.data(), 1024};
  OK(streamrec_cuda_index_init(index0, nullptr));
  OK(streamrec_cuda_index_init(index1, nullptr));
  float* chunks0[1] = {data0.data()};
  float* chunks1[1] = {data1.data()};
  int64_t* key_chunks0[1] = {row_keys0.data()};
  int64_t* key_chunks1[1] = {row_keys1.data()};
  StreamrecBlockTable tables[2] = {
      {index0, {chunks0, key_chunks0, 9, R}, &next[0], &errors[0], &counters[0], p},
      {index1, {chunks1, key_chunks1, 9, R}, &next[1], &errors[1], &counters[2], p}};
  const int64_t offsets[4] = {0, per_part, 2 * per_part, n};
  const int64_t part_table[3] = {0, 1, 0};
  const StreamrecBlock block{tables, offsets, part_table, 3, n, p.dim, R, 2};
  OK(streamrec_cuda_find_or_insert_tables(block, keys.data(), rows.data(), nullptr, nullptr));
  CHECK(errors[0] == 0 && errors[1] == 0);
  CHECK(next[0] == distinct && next[1] == distinct);
  CHECK(counters[0] == distinct && counters[2] == distinct);
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int64_t>& rk = i >= per_part && i < 2 * per_part ? row_keys1 : row_keys0;
    CHECK(rows[i] >= 0 && rk[rows[i]] == keys[i]);
  }
  // a hot key: position 0's row at every even position of table 0's two parts
  std::vector<int64_t> push_rows(rows);
  for (int64_t i = 0; i < n; i += 2)
    if (i < per_part || i >= 2 * per_part) push_rows[i] = rows[0];
  std::vector<float> grads(n * p.dim, 0.01f);
  OK(streamrec_cuda_check_push_tables(block, grads.data(), nullptr, nullptr, flag.data(),
                                      nullptr));
  CHECK(flag[0] == 0);
  const size_t bytes = streamrec_cuda_update_tables_scratch_bytes(n, p.dim);
  std::vector<char> scratch(bytes + 256);
  char* aligned = scratch.data() + (256 - reinterpret_cast<uintptr_t>(scratch.data()) % 256) % 256;
  OK(streamrec_cuda_update_tables(block, push_rows.data(), grads.data(), nullptr, nullptr,
                                  flag.data(), aligned, bytes, nullptr));
  CHECK(flag[0] == 0 && errors[0] == 0);
  int64_t hot = 0;  // shows of position 0's row: its even positions and its key's own odd ones
  for (int64_t i = 0; i < n; ++i)
    if ((i < per_part || i >= 2 * per_part) && push_rows[i] == rows[0]) ++hot;
  CHECK(data0[rows[0] * p.stride + 0] == static_cast<float>(hot));
  // the dedup of the three parts
  std::vector<int64_t> uniq(n), inverse(n), counts(3), total(1);
  const size_t ubytes = streamrec_cuda_unique_tables_scratch_bytes(n);
  std::vector<char> uscratch(ubytes + 256);
  char* ualigned =
      uscratch.data() + (256 - reinterpret_cast<uintptr_t>(uscratch.data()) % 256) % 256;
  OK(streamrec_cuda_unique_tables(keys.data(), n, offsets, 3, uniq.data(), inverse.data(),
                                  counts.data(), total.data(), ualigned, ubytes, nullptr));
  CHECK(counts[0] == distinct && counts[1] == distinct && counts[2] == distinct);
  CHECK(total[0] == 3 * distinct);
  for (int64_t i = 0; i < n; ++i) CHECK(uniq[inverse[i]] == keys[i]);
  for (int64_t j = 0; j < distinct; ++j) CHECK(uniq[j] == keys[j]);  // first occurrences
  return 0;
}

}  // namespace

int main() { return run() != 0 ? 1 : run_block(); }
