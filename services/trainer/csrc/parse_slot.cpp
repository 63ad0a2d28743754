// The slot text parser (see ops.h): one pass over the chunk, token by token, each byte looked
// up once in a class table. A token's name is hashed while it is read (the keyhash string
// hash) and found in a small open-addressing table of the schema's names; its value is then
// read as the feature's kind asks. Sparse keys go to one growing vector a feature; a line
// found malformed is skipped to its newline and its keys taken back, and for the first one of
// the chunk why is kept (SlotCounts: the reason, the feature, the bytes that show it).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "ops.h"

namespace streamrec::trainer {
namespace {

// Byte classes: a word byte, the ':' that ends a name, a separator, the line's end. A
// value runs to the next separator or newline (a ':' in it is part of it).
enum : uint8_t { kWordByte = 0, kColon = 1, kSep = 2, kNewline = 3 };

struct ClassTable {
  uint8_t of[256]{};
  constexpr ClassTable() {
    of[' '] = of['\t'] = of['\r'] = kSep;
    of['\n'] = kNewline;
    of[':'] = kColon;
  }
};
constexpr ClassTable kClass;

constexpr ptrdiff_t kMaxDecimal = 19;  // a sparse key's longest decimal, in bytes
constexpr uint64_t kFnvOffset = 0xCBF29CE484222325ULL;
constexpr uint64_t kFnvPrime = 0x100000001B3ULL;

// The finalizer of streamrec.keyhash (SplitMix64's, MurmurHash3's fmix64).
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// keyhash.string_keys of the bytes [p, q): FNV-1a 64, then mix64.
inline int64_t string_key(const uint8_t* p, const uint8_t* q) {
  uint64_t h = kFnvOffset;
  for (; p < q; ++p) h = (h ^ *p) * kFnvPrime;
  return static_cast<int64_t>(mix64(h));
}

// What a label or dense value reads as.
enum class Number : uint8_t {
  kFinite,    // a number whose float64 is finite
  kMissing,   // nan (any case, any sign): NaN
  kInfinite,  // inf or infinity (any case), or a number beyond float64's range
  kBad,       // not a number
};

// Whether [p, q) is `word` (lowercase ASCII) in any case.
inline bool is_word(const uint8_t* p, const uint8_t* q, const char* word) {
  const size_t n = std::strlen(word);
  if (static_cast<size_t>(q - p) != n) return false;
  for (size_t i = 0; i < n; ++i) {
    if ((p[i] | 0x20) != static_cast<uint8_t>(word[i])) return false;
  }
  return true;
}

// Whether the number [p, q) (digits, '.', an exponent: no sign), which from_chars found
// beyond float64's range, is too large (true) or too small (false): the decimal exponent of
// its first non-zero digit plus its exponent, positive or not (out of range means about
// 1e308 or 1e-324, far from 0).
inline bool too_large(const uint8_t* p, const uint8_t* q) {
  int64_t int_digits = 0;  // digits before the '.' from the first non-zero one
  int64_t lead_zeros = 0;  // zeros after the '.' before the first non-zero digit
  bool nonzero = false, after_dot = false;
  for (; p < q && *p != 'e' && *p != 'E'; ++p) {
    if (*p == '.') {
      after_dot = true;
    } else if (!after_dot) {
      nonzero |= *p != '0';
      int_digits += nonzero;
    } else if (!nonzero) {
      nonzero = *p != '0';
      lead_zeros += !nonzero;
    }
  }
  int64_t exp = 0;
  if (p < q) {  // the exponent: [+-]digits, saturated far beyond any double's
    ++p;
    const bool neg = *p == '-';
    p += *p == '-' || *p == '+';
    for (; p < q; ++p) exp = std::min<int64_t>(exp * 10 + (*p - '0'), int64_t{1} << 40);
    exp = neg ? -exp : exp;
  }
  const int64_t first = int_digits > 0 ? int_digits - 1 : -(lead_zeros + 1);
  return first + exp > 0;
}

// A label or dense value [p, q), non-empty, at most kMaxNumber bytes: an optional sign, then
// digits with at most one '.' (one digit at least) and an optional exponent ([eE][+-]?digits),
// the correctly rounded float64 (std::from_chars: what numpy's astype(float64) of the text
// gives, an overflow inf and an underflow 0); or nan, inf, infinity in any case.
inline Number read_number(const uint8_t* p, const uint8_t* q, double& value) {
  if (q - p > kMaxNumber) return Number::kBad;
  const bool neg = *p == '-';
  p += *p == '-' || *p == '+';
  if (p == q) return Number::kBad;
  if (static_cast<unsigned>(*p) - '0' < 10 || *p == '.') {  // not a sign: no "+-1"
    double v = 0.0;
    const auto* first = reinterpret_cast<const char*>(p);
    const auto* last = reinterpret_cast<const char*>(q);
    const auto [end, ec] = std::from_chars(first, last, v, std::chars_format::general);
    if (end != last) return Number::kBad;
    if (ec == std::errc::result_out_of_range) {
      v = too_large(p, q) ? std::numeric_limits<double>::infinity() : 0.0;
    } else if (ec != std::errc()) {
      return Number::kBad;
    }
    value = neg ? -v : v;
    return std::isinf(v) ? Number::kInfinite : Number::kFinite;
  }
  if (is_word(p, q, "nan")) {
    value = std::numeric_limits<double>::quiet_NaN();
    return Number::kMissing;
  }
  if (is_word(p, q, "inf") || is_word(p, q, "infinity")) {
    const double inf = std::numeric_limits<double>::infinity();
    value = neg ? -inf : inf;
    return Number::kInfinite;
  }
  return Number::kBad;
}

// A sparse value [p, q), non-empty: a decimal int64 (an optional '-', at most kMaxDecimal
// bytes with it, <= 2**63-1 before the sign), else a string id hashed as keyhash hashes one.
inline int64_t sparse_key(const uint8_t* p, const uint8_t* q) {
  const bool neg = *p == '-';
  if (q - p <= kMaxDecimal && q - p > neg) {
    uint64_t acc = 0;
    const uint8_t* s = p + neg;
    for (unsigned d; s < q && (d = static_cast<unsigned>(*s) - '0') < 10; ++s) acc = acc * 10 + d;
    if (s == q && acc <= static_cast<uint64_t>(INT64_MAX)) {
      return neg ? static_cast<int64_t>(0 - acc) : static_cast<int64_t>(acc);
    }
  }
  return string_key(p, q);
}

// The schema's names by their keyhash key: a power-of-two open-addressing table. A token's
// name is the feature whose key and byte length it has, as the numpy reference matches them
// (two names with one 64-bit key: ~n^2 / 2^64).
class NameTable {
 public:
  explicit NameTable(const std::vector<std::string>& names) {
    size_t size = 8;
    while (size < 2 * names.size()) size *= 2;
    mask_ = size - 1;
    slots_.assign(size, Slot{});
    for (size_t i = 0; i < names.size(); ++i) {
      const auto* b = reinterpret_cast<const uint8_t*>(names[i].data());
      const auto key = static_cast<uint64_t>(string_key(b, b + names[i].size()));
      size_t at = key & mask_;
      while (slots_[at].fid >= 0) at = (at + 1) & mask_;
      slots_[at] = Slot{key, static_cast<int64_t>(names[i].size()), static_cast<int64_t>(i)};
    }
  }
  // The feature id of a name: its key (mix64 of its FNV hash) and length; -1: none.
  int64_t find(uint64_t key, int64_t len) const {
    for (size_t at = key & mask_;; at = (at + 1) & mask_) {
      const Slot& s = slots_[at];
      if (s.fid < 0) return -1;
      if (s.key == key && s.len == len) return s.fid;
    }
  }

 private:
  struct Slot {
    uint64_t key = 0;
    int64_t len = 0;
    int64_t fid = -1;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

class SlotParser {
 public:
  SlotParser(const std::vector<std::string>& names, int64_t num_dense, int64_t max_line_bytes,
             SlotColumns& out)
      : names_(names),
        nd_(num_dense),
        ns_(static_cast<int64_t>(names.size()) - 1 - num_dense),
        max_line_bytes_(max_line_bytes),
        out_(out),
        stride_(out.capacity + 1),
        seen_(static_cast<size_t>(num_dense + 1), -1) {
    out_.keys.assign(static_cast<size_t>(ns_), {});
    for (int64_t k = 0; k < ns_; ++k) out_.offsets[k * stride_] = 0;
  }

  // Parses the lines of [p, end), whose last byte is '\n', byte p being byte `origin` of
  // the caller's data (where the first malformed line's bytes are named).
  void region(const uint8_t* p, const uint8_t* end, int64_t origin) {
    end_ = end;
    region_ = p;
    origin_ = origin;
    line_start_ = p;
    while (p < end) {
      const uint8_t c = kClass.of[*p];
      if (c == kNewline) {
        end_line(p);
        ++p;
      } else if (c == kSep) {
        ++p;
      } else {
        p = token(p);
      }
    }
  }

  SlotCounts counts() const { return counts_; }

 private:
  // The token at p (its first byte a word byte or ':'): where the scan goes on.
  const uint8_t* token(const uint8_t* p) {
    tokens_ = true;
    const uint8_t* name = p;
    uint64_t h = kFnvOffset;
    for (; kClass.of[*p] == kWordByte; ++p) h = (h ^ *p) * kFnvPrime;
    if (*p != ':' || p == name) {  // no name, or no ':'
      const uint8_t* token_end = p;
      while (kClass.of[*token_end] <= kColon) ++token_end;
      return skip_line(p, kSlotBadToken, -1, name, token_end);
    }
    const int64_t name_len = p - name;
    const uint8_t* value = ++p;
    while (kClass.of[*p] <= kColon) ++p;
    if (p == value) return skip_line(p, kSlotBadToken, -1, name, p);  // no value
    const int64_t fid = names_.find(mix64(h), name_len);
    if (fid < 0) return p;  // a name the schema lacks
    if (fid > nd_) {
      auto& keys = out_.keys[static_cast<size_t>(fid - nd_ - 1)];
      keys.push_back(sparse_key(value, p));
      pushed_ = true;
      return p;
    }
    if (seen_[static_cast<size_t>(fid)] == counts_.line) {
      return skip_line(p, kSlotRepeated, fid, value, p);  // a label or dense twice
    }
    double v = 0.0;
    const Number kind = read_number(value, p, v);
    if (kind == Number::kBad) return skip_line(p, kSlotNotNumber, fid, value, p);
    const int64_t r = counts_.rows;
    if (fid == 0) {
      if (kind != Number::kFinite) return skip_line(p, kSlotNotFinite, fid, value, p);
      out_.labels[r] = v > 0 ? 1.0F : 0.0F;
    } else {
      // nan: missing, NaN (one NaN whatever the text's sign); else float32, finite
      const float x = kind == Number::kMissing ? std::numeric_limits<float>::quiet_NaN()
                                               : static_cast<float>(v);
      if (std::isinf(x)) return skip_line(p, kSlotNotFinite, fid, value, p);
      out_.dense[r * nd_ + fid - 1] = x;
    }
    seen_[static_cast<size_t>(fid)] = counts_.line;
    ++required_;
    return p;
  }

  // The line is malformed, as `why` says of feature `fid` and the bytes [b, e): the scan goes
  // on at its newline (the region ends in one).
  const uint8_t* skip_line(const uint8_t* p, SlotBad why, int64_t fid, const uint8_t* b,
                           const uint8_t* e) {
    bad_ = true;
    why_ = Why{why, fid, at(b), at(e)};
    return static_cast<const uint8_t*>(std::memchr(p, '\n', static_cast<size_t>(end_ - p)));
  }

  // The line's '\n' is at nl.
  void end_line(const uint8_t* nl) {
    if (tokens_) {
      ++counts_.lines;
      if (nl - line_start_ > max_line_bytes_) {  // whatever else it holds
        bad_ = true;
        why_ = Why{kSlotOverlong, -1, at(line_start_), at(nl)};
      } else if (!bad_ && required_ != nd_ + 1) {  // a label or dense feature missing
        bad_ = true;
        int64_t fid = 0;
        while (seen_[static_cast<size_t>(fid)] == counts_.line) ++fid;
        why_ = Why{kSlotMissing, fid, -1, -1};
      }
      if (!bad_) {
        ++counts_.rows;
        int64_t* ends = out_.offsets + counts_.rows;
        for (int64_t k = 0; k < ns_; ++k) {
          ends[k * stride_] = static_cast<int64_t>(out_.keys[k].size());
        }
      } else {
        ++counts_.malformed;
        if (counts_.first_bad < 0) {
          counts_.first_bad = counts_.line;
          counts_.first_bad_why = why_.why;
          counts_.first_bad_fid = why_.fid;
          counts_.first_bad_begin = why_.begin;
          counts_.first_bad_end = why_.end;
        }
        if (pushed_) {
          const int64_t* ends = out_.offsets + counts_.rows;
          for (int64_t k = 0; k < ns_; ++k) {
            out_.keys[k].resize(static_cast<size_t>(ends[k * stride_]));
          }
        }
      }
    }
    ++counts_.line;
    tokens_ = bad_ = pushed_ = false;
    required_ = 0;
    line_start_ = nl + 1;
  }

  // Where byte p of this region is in the caller's data.
  int64_t at(const uint8_t* p) const { return (p - region_) + origin_; }

  // Why a line is malformed: a SlotBad, the feature it names, bytes [begin, end) of the data.
  struct Why {
    SlotBad why;
    int64_t fid, begin, end;
  };

  const NameTable names_;
  const int64_t nd_, ns_;
  const int64_t max_line_bytes_;
  SlotColumns& out_;
  const int64_t stride_;  // out_.offsets' row stride
  const uint8_t* end_ = nullptr;  // the region's end (its last byte a '\n')
  const uint8_t* region_ = nullptr;  // the region's first byte, byte origin_ of the data
  int64_t origin_ = 0;
  const uint8_t* line_start_ = nullptr;  // this line's first byte
  Why why_{kSlotBadToken, -1, -1, -1};  // this line's, once bad_
  std::vector<int64_t> seen_;  // (D + 1,) the line where each label/dense was last seen
  SlotCounts counts_;
  bool tokens_ = false;   // this line has a token (else it is blank)
  bool bad_ = false;      // this line is malformed
  bool pushed_ = false;   // this line added a sparse key
  int64_t required_ = 0;  // label and dense features seen on this line
};

}  // namespace

SlotCounts parse_slot(const uint8_t* data, int64_t nbytes, const std::vector<std::string>& names,
                      int64_t num_dense, int64_t max_line_bytes, SlotColumns& out) {
  if (nbytes < 0) throw std::invalid_argument("nbytes must be >= 0, got " + std::to_string(nbytes));
  if (max_line_bytes < 0) {
    throw std::invalid_argument("max_line_bytes must be >= 0, got " +
                                std::to_string(max_line_bytes));
  }
  const auto num_names = static_cast<int64_t>(names.size());
  if (num_dense < 0 || num_dense > num_names - 1) {
    throw std::invalid_argument("num_dense must be in [0, len(names) - 1] = [0, " +
                                std::to_string(num_names - 1) + "], got " +
                                std::to_string(num_dense));
  }
  SlotParser parser(names, num_dense, max_line_bytes, out);
  const uint8_t* end = data + nbytes;
  const auto* last_nl =
      nbytes ? static_cast<const uint8_t*>(memrchr(data, '\n', static_cast<size_t>(nbytes)))
             : nullptr;
  const uint8_t* body = last_nl == nullptr ? data : last_nl + 1;
  parser.region(data, body, 0);
  if (body != end) {  // the last line, without its newline: parsed from a copy ending in one
    std::vector<uint8_t> tail(body, end);
    tail.push_back('\n');
    parser.region(tail.data(), tail.data() + tail.size(), body - data);
  }
  return parser.counts();
}

}  // namespace streamrec::trainer
