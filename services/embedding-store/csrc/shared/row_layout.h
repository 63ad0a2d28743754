// The row layout, rule and initializer kinds, the key mix and the hash index's probe rules:
// one definition for the CPU core (csrc/cpu) and the kernels (csrc/cuda), host and device.
//
// A table's rows live in one float32 matrix `data` (rows_capacity, width); row r is
//
//   [show, click, unseen_days, flags, embed_w (1), embedx_w (dim-1), embed_state, embedx_state]
//    0     1      2            3      4           5 ..                ...
//
// so the weights a pull returns are the columns [kEmbedW, kEmbedW + dim).
// flags (a small integer held in a float): bit 0 = embedx expanded, bit 1 = changed since the
// last base/delta save. The optimizer state width depends on the rule (see state_width).
// A separate (rows_capacity,) int64 array `row_keys` holds each row's key.
//
// Compact rows (a table's dtype, RowDtype): the four header words stay float32; the payload
// after them (the dim weights, then the optimizer state) is held as 16-bit values of the
// dtype (fp16 or bf16), two per 32-bit word, element e of the payload in the low half of word
// kEmbedW + e / 2 when e is even, the high half when odd (little-endian: byte 4 kEmbedW + 2 e
// of the row). A row is then kEmbedW + ceil(payload / 2) words (row_width), about half the
// bytes; the column numbers (kEmbedW, embed_state, embedx_state) keep their fp32 meaning as
// the payload element's number plus kEmbedW. The state is kept in the dtype too; a rule step
// decodes to float32, computes as for an fp32 row and encodes with stochastic rounding (see
// row_codec.h); a new row's values and imported weights are encoded round-to-nearest.
#pragma once

#include <cstdint>

#include "hd.h"

namespace streamrec {

constexpr int64_t kShow = 0;
constexpr int64_t kClick = 1;
constexpr int64_t kUnseen = 2;
constexpr int64_t kFlags = 3;
constexpr int64_t kEmbedW = 4;
constexpr int kFlagExpanded = 1;
constexpr int kFlagDirty = 2;

// Sparse optimizer rules of PaddleRec's CtrCommonAccessor.
enum RuleKind : int64_t { kNaive = 0, kAdaGrad = 1, kStdAdaGrad = 2, kAdam = 3, kTorchAdaGrad = 4 };

// Storage types of a row's payload (TableOptions.dtype): fp32 is the layout above word for
// word; fp16 and bf16 pack two payload values per word.
enum RowDtype : int64_t { kFp32 = 0, kFp16 = 1, kBf16 = 2 };

// Initializers: zeros, uniform [a, b), normal (mean a, std b).
enum InitKind : int64_t { kZeros = 0, kUniform = 1, kNormal = 2 };

// Floats of optimizer state for `dim` weights under `kind`; -1 for an unknown kind.
STREAMREC_HD inline int64_t state_width(int64_t kind, int64_t dim) {
  switch (kind) {
    case kNaive: return 0;
    case kAdaGrad: return dim > 0 ? 1 : 0;        // one g2sum shared by the part
    case kStdAdaGrad: return dim;                  // one g2sum per weight
    case kAdam: return dim > 0 ? 2 * dim + 2 : 0;  // gsum, g2sum, beta1_pow, beta2_pow
    case kTorchAdaGrad: return dim;                // one g2sum per weight
    default: return -1;
  }
}

// Words of a row whose payload (weights and optimizer state) is `payload` values of dtype;
// -1 for an unknown dtype.
STREAMREC_HD inline int64_t row_width(int64_t dtype, int64_t payload) {
  switch (dtype) {
    case kFp32: return kEmbedW + payload;
    case kFp16:
    case kBf16: return kEmbedW + (payload + 1) / 2;
    default: return -1;
  }
}

// A row's score (PaddleRec's show_click_score). P: TableParams or StreamrecTableParams.
template <class P>
STREAMREC_HD inline double score(const P& p, double show, double click) {
  return p.nonclk_coeff * (show - click) + p.click_coeff * click;
}

// Whether a new row expands at once (its score at creation already reaches the threshold).
template <class P>
STREAMREC_HD inline bool expand_at_creation(const P& p) {
  return score(p, 0.0, 0.0) >= p.embedx_threshold;
}

// SplitMix64 finalizer (the same as streamrec.keyhash.mix64).
STREAMREC_HD inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// ---- the hash index: (capacity, 2) int64 [key, row] slots, capacity a power of two ----
// Every int64 is a key, so a slot's state is its row word: >= 0 a row id, or one of these.
constexpr int64_t kEmptyRow = -1;  // never used: ends a probe
constexpr int64_t kBusyRow = -2;   // claimed by an insert that is writing the key
constexpr int64_t kTombRow = -3;   // erased: probes walk past it, inserts may reuse it

// A key's probe starts here and walks forward (linear probing).
STREAMREC_HD inline uint64_t home(int64_t key, uint64_t mask) {
  return mix64(static_cast<uint64_t>(key)) & mask;
}

// Whether a slot with row word `row` and key `slot_key` holds `key`: only a live row does (a
// tombstone keeps its old key and must never be returned as a row).
STREAMREC_HD inline bool holds(int64_t row, int64_t slot_key, int64_t key) {
  return row >= 0 && slot_key == key;
}

}  // namespace streamrec
