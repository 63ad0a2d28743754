// The trainer's compiled operations (streamrec.trainer._C): the text line parser, and the
// slot text parser (parse_slot, at the end).
//
// One pass over a chunk of tab-separated lines (Criteo or the generator's format, see
// streamrec/trainer/data/reader.py), single-threaded on purpose: it runs on the trainer's prefetch
// thread beside the model's own threads, and the binding releases the GIL for the whole parse.
//
//     criteo     label  I1..I13  C1..C{S}          C: hex, at most 16 digits, empty: no key
//     generated  label  p_true  I1..I13  C1..C{S}  C: decimal ints, empty: no key
//
// The rules are those of data/reader.py's numpy reference parser (_parse_chunk_numpy), byte for byte:
// a line ends at '\n' with one '\r' before it stripped; an empty line is blank (skipped, not
// counted, but numbered); a line needs exactly ncols fields; 'int' fields are an optional '-'
// then decimal digits, at most 19 bytes, at most 2**63-1, empty reads 0; a bad field makes
// the line malformed (counted, skipped), and so does a line of more than max_line_bytes
// bytes before its '\n'. The dense features are integers (<= 2**63-1): always finite.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace streamrec::trainer {

constexpr int64_t kNumDense = 13;

// Where parse_lines writes: arrays of `capacity` rows (parse_capacity), row r for the r-th
// good line; the caller keeps the first `rows` of each.
struct LineOutputs {
  float* dense;     // (capacity, 13) float32: max(int, 0) as float32; the caller applies
                    // log1p (numpy's, see data/reader.py)
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
  int64_t first_overlong = -1;    // the same for the first line longer than max_line_bytes
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
//   max_line_bytes: a non-blank line of more bytes than this before its '\n' (a '\r' counted)
//               is malformed whatever it holds (std::invalid_argument when < 0)
LineCounts parse_lines(const uint8_t* data, int64_t nbytes, bool generated, int64_t num_slots,
                       int64_t max_line_bytes, const LineOutputs& out);

// --- parse_slot.cpp ---
// PaddleRec slot text (streamrec/trainer/data/feature_data.py): one sample a line, `name:value`
// tokens split by ' ', '\t' or '\r', a list feature repeating its name, in any order:
//
//     click:1 age:0.31 user_id:17 genres:5 genres:9
//
// The rules are those of feature_data.py's numpy reference (_parse_slot_chunk_numpy), byte
// for byte: a line ends at '\n'; one without a token is blank (skipped, not counted, but
// numbered). A token's name runs to its first ':', its value to the token's end; a name the
// schema lacks is skipped. A line is malformed (counted, skipped) when it is longer than
// max_line_bytes (before its '\n'), a token has no ':', an empty name or an empty value, or
// the label or a dense feature is missing, twice, or not a number. A number is standard float
// syntax of at most kMaxNumber bytes: an optional sign, digits with at most one '.' (at least
// one digit), an optional exponent (e or E, an optional sign, digits), read as the correctly
// rounded float64 (std::from_chars), a dense one then rounded to float32; or nan / inf /
// infinity in any case, after an optional sign. A dense nan is a missing value (NaN in the
// output); a dense value whose float32 is infinite (inf, or beyond +-3.4028235e38) and a
// label that is not finite make the line malformed. A sparse value is a decimal int64 key
// ('-', digits, at most 19 bytes with the '-'), else a string id: keyhash's string key
// (FNV-1a 64, then the SplitMix64 finalizer) of its bytes.

// The longest label or dense value, in bytes (a sign included); a longer one is no number.
constexpr int64_t kMaxNumber = 128;

// Why a line is malformed (SlotCounts::first_bad_why), in the order a line is read: the first
// bad token decides, a missing label or dense feature is found at the line's end, and a line
// longer than max_line_bytes is that whatever else it holds.
enum SlotBad : int64_t {
  kSlotBadToken = 1,     // a token that is not name:value (begin, end: the token)
  kSlotRepeated = 2,     // the label or a dense feature a second time (fid; the 2nd value)
  kSlotNotNumber = 3,    // a label or dense value that is not a number (fid; the value)
  kSlotNotFinite = 4,    // a label not finite, a dense value infinite in float32 (fid; value)
  kSlotMissing = 5,      // no label or no value of a dense feature (fid: the first missing)
  kSlotOverlong = 6,     // longer than max_line_bytes (begin, end: the line, without '\n')
};

// Where parse_slot writes: capacity rows (parse_capacity(data, nbytes, 0)), row r for the
// r-th good line; the caller keeps the first `rows` (offsets: the first rows + 1 of each).
struct SlotColumns {
  int64_t capacity;
  float* labels;     // (capacity,) float32: 1 where the label's value is > 0, else 0
  float* dense;      // (capacity, D) float32: the values (read in float64, then rounded;
                     // NaN where the value is nan: missing)
  int64_t* offsets;  // (S, capacity + 1) int64: row r of feature k holds its keys
                     // keys[k][offsets[k, r] : offsets[k, r + 1]]
  // S vectors, filled by parse_slot: feature k's keys, row by row, each row's in line order
  std::vector<std::vector<int64_t>> keys;  // S x (nnz_k,)
};

// What parse_slot counts.
struct SlotCounts {
  int64_t rows = 0;        // good lines, the rows written
  int64_t lines = 0;       // non-blank lines
  int64_t malformed = 0;   // of those, the ones skipped
  int64_t first_bad = -1;  // 0-based index (blank lines counted) of the first malformed line
  int64_t line = 0;        // lines seen, blank ones and an unterminated last one counted
  // why the first malformed line is (a SlotBad), the feature id it names (-1: none) and the
  // bytes [begin, end) of data it names (the value, the token or the line; -1: none)
  int64_t first_bad_why = 0;
  int64_t first_bad_fid = -1;
  int64_t first_bad_begin = -1;
  int64_t first_bad_end = -1;
};

// Parses `nbytes` bytes of whole lines (a missing final newline is allowed) into `out`;
// `data` is only read.
//
//   names:      the label's, the D dense features', then the S sparse features' names
//   num_dense:  D, in [0, names.size() - 1]; std::invalid_argument (ValueError) otherwise
//   max_line_bytes: >= 0 (std::invalid_argument otherwise)
SlotCounts parse_slot(const uint8_t* data, int64_t nbytes, const std::vector<std::string>& names,
                      int64_t num_dense, int64_t max_line_bytes, SlotColumns& out);

}  // namespace streamrec::trainer

namespace streamrec::trainer {

// add_rows' operands: src[b, s] (dim contiguous floats at src + b * stride_b + s * stride_s)
// is added to row index[s, b] of out (rows, dim).
struct AddRowsArgs {
  float* out;
  int64_t rows;
  const int64_t* index;  // (features, batch), contiguous
  const float* src;
  int64_t stride_b, stride_s;
  int64_t features, batch, dim;
};

// Adds every src[b, s] to out's row index[s, b]; a row's repeats are summed in order of b (a
// row belongs to one feature's table), as index_add_ over the (batch, features) order sums
// them. Returns -1, or the first position s * batch + b whose index is outside [0, rows)
// (nothing written then).
int64_t add_rows(const AddRowsArgs& a);

}  // namespace streamrec::trainer
