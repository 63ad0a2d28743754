// What the ops raise: OpError, a std::runtime_error that Python sees as RuntimeError with the
// same message. Every op checks its arguments before it writes anything (see ops.h).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace streamrec {

struct OpError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Raises OpError with the arguments written one after another (as an ostream writes them).
// Out of line and cold: the checks on hot paths cost their compare only.
template <class... Args>
[[noreturn]] __attribute__((noinline, cold)) void fail(const Args&... args) {
  std::ostringstream msg;
  (msg << ... << args);
  throw OpError(msg.str());
}

}  // namespace streamrec

// Raises OpError(args...) unless cond holds; the message is built only when it fails.
#define STREAMREC_CHECK(cond, ...)               \
  do {                                           \
    if (__builtin_expect(!(cond), 0)) {          \
      ::streamrec::fail(__VA_ARGS__);            \
    }                                            \
  } while (0)
