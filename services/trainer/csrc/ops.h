// The trainer's compiled operations (streamrec.trainer._C): the text line parser.
//
// One pass over a chunk of tab-separated lines (Criteo or the generator's format, see
// streamrec/trainer/data.py), single-threaded on purpose: it runs on the trainer's prefetch
// thread beside torch's own threads, and the binding releases the GIL for the whole parse.
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

#include <torch/extension.h>

#include <cstdint>
#include <optional>

namespace streamrec::trainer {

constexpr int64_t kNumDense = 13;

// What parse_lines returns: the good lines' columns, n rows, and the line counts.
struct ParsedLines {
  torch::Tensor dense;                   // (n, 13) float32: max(int, 0) as float32; the
                                         // caller applies log1p (numpy's, see data.py)
  torch::Tensor labels;                  // (n,) float32 in {0, 1}
  torch::Tensor keys;                    // (n, S) int64, 0 where absent
  std::optional<torch::Tensor> present;  // (n, S) bool; nullopt when every key is present
  std::optional<torch::Tensor> ptrue;    // (n,) float32, generated format only
  int64_t lines = 0;                     // non-blank lines
  int64_t malformed = 0;                 // of those, the ones skipped
  int64_t first_bad_fields = -1;  // 0-based index (blank lines counted) of the first line
                                  // with the wrong field count; -1: none
  int64_t first_bad_value = -1;   // the same for the first line with a bad value
};

// --- parse_lines.cpp ---
// Parses `nbytes` bytes of whole lines (a missing final newline is allowed); `data` is only
// read, never past data + nbytes. Outputs are allocated once, to the line count, and narrowed
// to the good lines.
//
//   data:       (nbytes,) text
//   generated:  the generated format (label, p_true first; decimal keys) instead of Criteo
//   num_slots:  S, categorical fields per line, >= 0
ParsedLines parse_lines(const uint8_t* data, int64_t nbytes, bool generated, int64_t num_slots);

}  // namespace streamrec::trainer
