/* A program linked against libnccl.so.2, as torch is, that checks what answers its NCCL calls
 * (tests/nccl/test_nccl_shim_cpu.py runs it; no GPU needed):
 *   shim_probe preload   LD_PRELOAD=libsymmem_nccl.so: the calls reach the shim, which forwards
 *                        them to the real libnccl.so.2 and returns its answers unchanged;
 *   shim_probe refused   the shim itself answers to the name libnccl.so.2 and no real NCCL was
 *                        named: it must refuse to forward to itself, with a message, not recurse;
 *   shim_probe works     whatever answers to libnccl.so.2 gives a version and a unique id (prints
 *                        the version).
 * Prints what it checked; exits 0 when every check holds. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <nccl.h>
#include <cstdio>
#include <cstring>

static int failures = 0;
#define CHECK(cond, ...)                             \
  do {                                               \
    if (!(cond)) {                                   \
      fprintf(stderr, "FAILED: %s: ", #cond);        \
      fprintf(stderr, __VA_ARGS__);                  \
      fprintf(stderr, "\n");                         \
      ++failures;                                    \
    }                                                \
  } while (0)

static const char* library_of(void* symbol) {
  Dl_info info;
  return dladdr(symbol, &info) && info.dli_fname ? info.dli_fname : "?";
}

static int preload(void) {
  CHECK(strstr(library_of((void*)&ncclGetVersion), "libsymmem_nccl") != NULL, "ncclGetVersion resolves to %s",
        library_of((void*)&ncclGetVersion));
  /* The real library, as the shim found it: loaded already (this program needs it). */
  void* real = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  CHECK(real != NULL, "libnccl.so.2 is not loaded");
  if (!real) return 1;
  ncclResult_t (*real_version)(int*) = (ncclResult_t(*)(int*))dlsym(real, "ncclGetVersion");
  const char* (*real_string)(ncclResult_t) = (const char* (*)(ncclResult_t))dlsym(real, "ncclGetErrorString");
  CHECK(real_version && real_string && strstr(library_of((void*)real_version), "libsymmem_nccl") == NULL,
        "the real ncclGetVersion is %s", real_version ? library_of((void*)real_version) : "missing");
  int mine = 0, theirs = 0;
  CHECK(ncclGetVersion(&mine) == ncclSuccess, "ncclGetVersion failed: %s", ncclGetLastError(NULL));
  real_version(&theirs);
  CHECK(mine == theirs && mine > 0, "version %d through the shim, %d from the real NCCL", mine, theirs);
  int twin = 0;
  CHECK(pncclGetVersion(&twin) == ncclSuccess && twin == theirs, "pncclGetVersion gave %d", twin);
  for (int r = ncclSuccess; r < ncclNumResults; ++r)
    CHECK(strcmp(ncclGetErrorString((ncclResult_t)r), real_string((ncclResult_t)r)) == 0,
          "error string %d: '%s' vs '%s'", r, ncclGetErrorString((ncclResult_t)r), real_string((ncclResult_t)r));
  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId failed: %s", ncclGetLastError(NULL));
  int nonzero = 0;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) nonzero |= id.internal[i];
  CHECK(nonzero, "the unique id is all zeros");
  CHECK(ncclGetLastError(NULL) != NULL, "ncclGetLastError returned NULL");
  /* A call on no communicator is NCCL's to refuse, through the shim as without it. */
  int count = 0;
  CHECK(ncclCommCount(NULL, &count) != ncclSuccess, "ncclCommCount(NULL) succeeded");
  printf("preload: version %d, %d error strings, unique id: forwarded to the real NCCL\n", mine, ncclNumResults);
  return failures != 0;
}

static int refused(void) {
  CHECK(strstr(library_of((void*)&ncclGetVersion), "libsymmem_nccl") != NULL ||
            strstr(library_of((void*)&ncclGetVersion), "libnccl.so.2") != NULL,
        "ncclGetVersion resolves to %s", library_of((void*)&ncclGetVersion));
  int version = 0;
  const ncclResult_t r = ncclGetVersion(&version);
  const char* why = ncclGetLastError(NULL);
  CHECK(r == ncclSystemError, "ncclGetVersion returned %d (version %d)", (int)r, version);
  CHECK(why && strstr(why, "itself") != NULL, "the message is '%s'", why ? why : "(null)");
  printf("refused: %s\n", why ? why : "(null)");
  return failures != 0;
}

static int works(void) {
  int version = 0;
  CHECK(ncclGetVersion(&version) == ncclSuccess && version > 0, "ncclGetVersion: %s", ncclGetLastError(NULL));
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId: %s", ncclGetLastError(NULL));
  printf("%d\n", version);
  return failures != 0;
}

int main(int argc, char** argv) {
  if (argc == 2 && strcmp(argv[1], "preload") == 0) return preload();
  if (argc == 2 && strcmp(argv[1], "refused") == 0) return refused();
  if (argc == 2 && strcmp(argv[1], "works") == 0) return works();
  fprintf(stderr, "usage: %s preload|refused|works\n", argv[0]);
  return 2;
}
