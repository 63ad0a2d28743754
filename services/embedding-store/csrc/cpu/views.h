// Plain views of the arrays the ops take. The binding files (bind.h) check each tensor (dtype,
// shape, contiguity, alignment) and hand the ops its pointer and sizes; nothing here owns memory.
#pragma once

#include <cstdint>

namespace streamrec {

// n contiguous elements of T.
template <class T>
struct Span {
  T* data = nullptr;
  int64_t n = 0;
};

// A contiguous row-major matrix: rows x cols elements of T (the index: (capacity, 2); a
// table's rows: (R, width)).
template <class T>
struct Matrix {
  T* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

}  // namespace streamrec
