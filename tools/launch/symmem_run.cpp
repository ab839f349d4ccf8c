// symmem-run -n N [--timeout S] [--no-prefix] [--expect-killed RANK]... [--simulate-nodes K] program [args...]
// Starts N local ranks of `program` (one per GPU) with RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and a fresh SYMMEM_TOKEN; see launcher.hpp.
#include <cstdio>
#include <exception>

#include "launcher.hpp"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  symmem::launch::LaunchOptions options;
  std::vector<std::string> command;
  std::string error;
  if (args.empty() || args[0] == "-h" || args[0] == "--help" ||
      !symmem::launch::parse_args(args, &options, &command, &error)) {
    if (!error.empty()) std::fprintf(stderr, "symmem-run: %s\n", error.c_str());
    std::fprintf(stderr,
                 "usage: symmem-run -n N [--timeout SECONDS] [--no-prefix] [--expect-killed RANK]... "
                 "[--simulate-nodes K] [--] program [args...]\n");
    return 2;
  }
  try {
    return symmem::launch::run(options, command);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "symmem-run: %s\n", e.what());
    return 1;
  }
}
