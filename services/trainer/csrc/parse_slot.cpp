// The slot text parser (see ops.h): one pass over the chunk, token by token, each byte looked
// up once in a class table. A token's name is hashed while it is read (the keyhash string
// hash) and found in a small open-addressing table of the schema's names; its value is then
// read as the feature's kind asks. Sparse keys go to one growing vector a feature; a line
// found malformed is skipped to its newline and its keys taken back.
#include <cstring>
#include <stdexcept>
#include <string>
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

// 10**k, exact (what numpy's np.power(10.0, k) gives, as in parse_lines.cpp).
constexpr double kPow10[19] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8, 1e9,
                               1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18};
constexpr ptrdiff_t kMaxDecimal = 19;  // parse_columns' longest field, in bytes
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

// A label or dense value [p, q), non-empty: an optional '-', then digits with at most one
// '.', not "." alone, at most kMaxDecimal bytes after the sign. The value is numpy's (all
// digits as an integer in float64, divided by 10**(digits after the dot), negated after).
inline bool read_number(const uint8_t* p, const uint8_t* q, double& value) {
  const bool neg = *p == '-';
  p += neg;
  const ptrdiff_t len = q - p;
  if (len == 0 || len > kMaxDecimal) return false;
  uint64_t acc = 0;
  const uint8_t* dot = nullptr;
  for (const uint8_t* s = p; s < q; ++s) {
    const unsigned d = static_cast<unsigned>(*s) - '0';
    if (d < 10) {
      acc = acc * 10 + d;
    } else if (*s == '.' && dot == nullptr) {
      dot = s;
    } else {
      return false;
    }
  }
  if (dot != nullptr && len == 1) return false;
  value = static_cast<double>(acc) / kPow10[dot == nullptr ? 0 : q - dot - 1];
  if (neg) value = -value;
  return true;
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
  SlotParser(const std::vector<std::string>& names, int64_t num_dense, SlotColumns& out)
      : names_(names),
        nd_(num_dense),
        ns_(static_cast<int64_t>(names.size()) - 1 - num_dense),
        out_(out),
        stride_(out.capacity + 1),
        seen_(static_cast<size_t>(num_dense + 1), -1) {
    out_.keys.assign(static_cast<size_t>(ns_), {});
    for (int64_t k = 0; k < ns_; ++k) out_.offsets[k * stride_] = 0;
  }

  // Parses the lines of [p, end), whose last byte is '\n'.
  void region(const uint8_t* p, const uint8_t* end) {
    end_ = end;
    while (p < end) {
      const uint8_t c = kClass.of[*p];
      if (c == kNewline) {
        end_line();
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
    if (*p != ':' || p == name) return skip_line(p);  // no name, or no ':'
    const int64_t name_len = p - name;
    const uint8_t* value = ++p;
    while (kClass.of[*p] <= kColon) ++p;
    if (p == value) return skip_line(p);  // no value
    const int64_t fid = names_.find(mix64(h), name_len);
    if (fid < 0) return p;  // a name the schema lacks
    if (fid > nd_) {
      auto& keys = out_.keys[static_cast<size_t>(fid - nd_ - 1)];
      keys.push_back(sparse_key(value, p));
      pushed_ = true;
      return p;
    }
    double v;
    if (seen_[static_cast<size_t>(fid)] == counts_.line || !read_number(value, p, v)) {
      return skip_line(p);  // a label or dense twice, or not a number
    }
    seen_[static_cast<size_t>(fid)] = counts_.line;
    ++required_;
    const int64_t r = counts_.rows;
    if (fid == 0) {
      out_.labels[r] = v > 0 ? 1.0F : 0.0F;
    } else {
      out_.dense[r * nd_ + fid - 1] = static_cast<float>(v);
    }
    return p;
  }

  // The line is malformed: the scan goes on at its newline (the region ends in one).
  const uint8_t* skip_line(const uint8_t* p) {
    bad_ = true;
    return static_cast<const uint8_t*>(std::memchr(p, '\n', static_cast<size_t>(end_ - p)));
  }

  void end_line() {
    if (tokens_) {
      ++counts_.lines;
      if (!bad_ && required_ == nd_ + 1) {
        ++counts_.rows;
        int64_t* ends = out_.offsets + counts_.rows;
        for (int64_t k = 0; k < ns_; ++k) {
          ends[k * stride_] = static_cast<int64_t>(out_.keys[k].size());
        }
      } else {
        ++counts_.malformed;
        if (counts_.first_bad < 0) counts_.first_bad = counts_.line;
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
  }

  const NameTable names_;
  const int64_t nd_, ns_;
  SlotColumns& out_;
  const int64_t stride_;  // out_.offsets' row stride
  const uint8_t* end_ = nullptr;  // the region's end (its last byte a '\n')
  std::vector<int64_t> seen_;  // (D + 1,) the line where each label/dense was last seen
  SlotCounts counts_;
  bool tokens_ = false;   // this line has a token (else it is blank)
  bool bad_ = false;      // this line is malformed
  bool pushed_ = false;   // this line added a sparse key
  int64_t required_ = 0;  // label and dense features seen on this line
};

}  // namespace

SlotCounts parse_slot(const uint8_t* data, int64_t nbytes, const std::vector<std::string>& names,
                      int64_t num_dense, SlotColumns& out) {
  if (nbytes < 0) throw std::invalid_argument("nbytes must be >= 0, got " + std::to_string(nbytes));
  const auto num_names = static_cast<int64_t>(names.size());
  if (num_dense < 0 || num_dense > num_names - 1) {
    throw std::invalid_argument("num_dense must be in [0, len(names) - 1] = [0, " +
                                std::to_string(num_names - 1) + "], got " +
                                std::to_string(num_dense));
  }
  SlotParser parser(names, num_dense, out);
  const uint8_t* end = data + nbytes;
  const auto* last_nl =
      nbytes ? static_cast<const uint8_t*>(memrchr(data, '\n', static_cast<size_t>(nbytes)))
             : nullptr;
  const uint8_t* body = last_nl == nullptr ? data : last_nl + 1;
  parser.region(data, body);
  if (body != end) {  // the last line, without its newline: parsed from a copy ending in one
    std::vector<uint8_t> tail(body, end);
    tail.push_back('\n');
    parser.region(tail.data(), tail.data() + tail.size());
  }
  return parser.counts();
}

}  // namespace streamrec::trainer
