// A small test harness shared by the CPU and GPU suites: TEST registers a case, EXPECT* record a
// failure and stop the case, SKIP ends it as skipped. main() runs every case (or those whose
// name contains argv[1]) and closes with "N passed, N failed, N skipped". Exit code: 0 when none
// failed, 77 when every case skipped (ctest's SKIP_RETURN_CODE), 1 otherwise.
#pragma once

#include <exception>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace symmem::test {

struct Failure : std::exception {
  std::string message;
  explicit Failure(std::string m) : message(std::move(m)) {}
  const char* what() const noexcept override { return message.c_str(); }
};
struct Skipped : std::exception {
  std::string reason;
  explicit Skipped(std::string r) : reason(std::move(r)) {}
};

struct Case {
  const char* name;
  std::function<void()> body;
};
std::vector<Case>& registry();

struct Registrar {
  Registrar(const char* name, std::function<void()> body) { registry().push_back({name, std::move(body)}); }
};

// Runs the registered cases; `quiet` suppresses per-case lines (used by non-zero ranks).
int run_all(int argc, char** argv, bool quiet = false);

[[noreturn]] void fail(const char* file, int line, const std::string& what);

// The exit status of a forked child that runs `body`, then exits with `at_exit` registered last:
// at_exit runs first among the exit handlers, after glibc destroyed the child's thread-locals (what
// static destructors and atexit handlers of a program meet), and ends the child with _exit(code).
// -1 when the child did not exit normally.
int exit_status_of_child(const std::function<void()>& body, void (*at_exit)());

// Descriptors this process holds open (entries of /proc/self/fd), for leak checks.
int open_descriptors();

template <typename A, typename B>
std::string describe_pair(const A& a, const B& b) {
  std::ostringstream o;
  o << a << " vs " << b;
  return o.str();
}

}  // namespace symmem::test

#define TEST(name)                                                \
  static void name();                                             \
  static ::symmem::test::Registrar name##_registrar(#name, name); \
  static void name()

#define EXPECT(cond)                                              \
  do {                                                            \
    if (!(cond)) ::symmem::test::fail(__FILE__, __LINE__, #cond); \
  } while (0)

#define EXPECT_EQ(a, b)                                                                               \
  do {                                                                                                \
    const auto va_ = (a);                                                                             \
    const auto vb_ = (b);                                                                             \
    if (!(va_ == vb_))                                                                                \
      ::symmem::test::fail(__FILE__, __LINE__,                                                        \
                           std::string(#a " == " #b ": ") + ::symmem::test::describe_pair(va_, vb_)); \
  } while (0)

// Expects `expr` to throw symmem::Error with `expected_code` whose message contains `text`.
#define EXPECT_ERROR(expr, expected_code, text)                                                                \
  do {                                                                                                         \
    bool thrown_ = false;                                                                                      \
    try {                                                                                                      \
      expr;                                                                                                    \
    } catch (const ::symmem::Error& e_) {                                                                      \
      thrown_ = true;                                                                                          \
      if (e_.code() != (expected_code))                                                                        \
        ::symmem::test::fail(__FILE__, __LINE__, std::string("wrong code: ") + e_.what());                     \
      if (std::string(e_.what()).find(text) == std::string::npos)                                              \
        ::symmem::test::fail(__FILE__, __LINE__, std::string("message lacks '") + (text) + "': " + e_.what()); \
    }                                                                                                          \
    if (!thrown_) ::symmem::test::fail(__FILE__, __LINE__, #expr " did not throw");                            \
  } while (0)

#define SKIP(reason) throw ::symmem::test::Skipped(reason)
