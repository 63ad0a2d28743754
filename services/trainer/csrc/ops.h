// The trainer's compiled operations (streamrec.trainer._C): the text line parser.
//
// One pass over a chunk of tab-separated lines (Criteo or the generator's format, see
// streamrec/trainer/data.py), single-threaded on purpose: it runs on the trainer's prefetch
// thread beside the model's own threads, and the binding releases the GIL for the whole parse.
//
//     criteo     label  I1..I13  C1..C{S}          C: hex, at most 16 digits, empty: no key
//     generated  label  p_true  I1..I13  C1..C{S}  C: decimal ints, empty: no key
//
// The rules are those of data.py's numpy reference parser (_parse_chunk_numpy), byte for byte:
// a line ends at '\n' with one '\r' before it stripped; an empty line is blank (skipped, not
// counted, but numbered); a line needs exactly ncols fields; 'int' fields are an optional '-'
// then decimal digits, at most 19 bytes, at most 2**63-1, empty reads 0; a bad field makes
// the line malformed (counted, skipped).
#pragma once

#include <cstdint>

namespace streamrec::trainer {

constexpr int64_t kNumDense = 13;

// Where parse_lines writes: arrays of `capacity` rows (parse_capacity), row r for the r-th
// good line; the caller keeps the first `rows` of each.
struct LineOutputs {
  float* dense;     // (capacity, 13) float32: max(int, 0) as float32; the caller applies
                    // log1p (numpy's, see data.py)
  float* labels;    // (capacity,) float32 in {0, 1}
  int64_t* keys;    // (capacity, S) int64, 0 where absent
  bool* present;    // (capacity, S) whether each key is present
  float* ptrue;     // (capacity,) float32, generated format only; nullptr for Criteo
};

// What parse_lines counts.
struct LineCounts {
  int64_t rows = 0;               // good lines, the rows written
  bool all_present = true;        // every key of those rows present
  int64_t lines = 0;              // non-blank lines
  int64_t malformed = 0;          // of those, the ones skipped
  int64_t first_bad_fields = -1;  // 0-based index (blank lines counted) of the first line
                                  // with the wrong field count; -1: none
  int64_t first_bad_value = -1;   // the same for the first line with a bad value
};

// --- parse_lines.cpp ---
// The rows parse_lines may write for `nbytes` bytes of whole lines (the line count, a final
// line without newline included), so the caller allocates the outputs once. Raises
// std::invalid_argument (ValueError in Python) for nbytes < 0 or num_slots < 0.
int64_t parse_capacity(const uint8_t* data, int64_t nbytes, int64_t num_slots);

// Parses `nbytes` bytes of whole lines (a missing final newline is allowed) into `out`, sized
// by parse_capacity; `data` is only read, never past data + nbytes.
//
//   data:       (nbytes,) text
//   generated:  the generated format (label, p_true first; decimal keys) instead of Criteo
//   num_slots:  S, categorical fields per line, >= 0
LineCounts parse_lines(const uint8_t* data, int64_t nbytes, bool generated, int64_t num_slots,
                       const LineOutputs& out);

}  // namespace streamrec::trainer
