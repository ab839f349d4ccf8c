#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "symmem/error.hpp"
#include "test.hpp"

namespace symmem::test {

std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}

void fail(const char* file, int line, const std::string& what) {
  const char* base = std::strrchr(file, '/');
  throw Failure(std::string(base ? base + 1 : file) + ":" + std::to_string(line) + ": " + what);
}

int exit_status_of_child(const std::function<void()>& body, void (*at_exit)()) {
  std::fflush(nullptr);  // (nothing buffered is printed twice)
  const pid_t child = fork();
  if (child < 0) return -1;
  if (child == 0) {
    try {
      body();
    } catch (...) {
      _exit(2);  // (never back into the runner: the child would run the other cases)
    }
    std::atexit(at_exit);
    std::exit(0);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

int open_descriptors() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (readdir(d)) ++n;
  closedir(d);
  return n;
}

int run_all(int argc, char** argv, bool quiet) {
  const char* filter = argc > 1 ? argv[1] : nullptr;
  int passed = 0, failed = 0, skipped = 0;
  for (const auto& c : registry()) {
    if (filter && !std::strstr(c.name, filter)) continue;
    if (!quiet) std::printf("[ RUN  ] %s\n", c.name);
    std::fflush(stdout);
    try {
      c.body();
      ++passed;
      if (!quiet) std::printf("[   OK ] %s\n", c.name);
    } catch (const Skipped& s) {
      ++skipped;
      if (!quiet) std::printf("[ SKIP ] %s: %s\n", c.name, s.reason.c_str());
    } catch (const Failure& f) {
      ++failed;
      std::printf("[ FAIL ] %s: %s\n", c.name, f.message.c_str());
    } catch (const std::exception& e) {
      ++failed;
      std::printf("[ FAIL ] %s: unexpected exception: %s\n", c.name, e.what());
    }
    std::fflush(stdout);
  }
  if (!quiet || failed) std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  if (failed) return 1;
  if (filter && passed + skipped == 0) {  // a mistyped filter must not pass
    std::printf("no test name holds \"%s\"\n", filter);
    return 1;
  }
  if (passed == 0 && skipped > 0) return 77;
  return 0;
}

}  // namespace symmem::test
