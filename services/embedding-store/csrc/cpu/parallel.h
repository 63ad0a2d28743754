// The ops' parallel loops. They run on the intra-op threads of the tensor library that loads
// the extension (its parallel_for: the team size the Python side sets, serial inside another
// parallel region, OpenMP underneath), so the two functions below are defined in bind_checks.cpp,
// with the binding files, the only ones that see that library; the ops call them through these plain signatures.
#pragma once

#include <cstdint>

namespace streamrec {

// Calls fn(body, b, e) over chunks [b, e) of [begin, end), each at least `grain` long
// unless the range is shorter, in parallel.
using ChunkFn = void (*)(const void* body, int64_t b, int64_t e);
void parallel_chunks(int64_t begin, int64_t end, int64_t grain, ChunkFn fn, const void* body);

// The intra-op thread count.
int num_threads();

// body(b, e) over chunks of [begin, end), in parallel (parallel_chunks).
template <class F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& body) {
  parallel_chunks(
      begin, end, grain,
      [](const void* f, int64_t b, int64_t e) { (*static_cast<const F*>(f))(b, e); }, &body);
}

}  // namespace streamrec
