/* Links against the installed C ABI (libsymmem_capi.so). */
#include <stdio.h>

#include <symmem/symmem_c.h>

int main(void) {
  int algo = -1;
  if (symmem_parse_algo("push", &algo) != 0 || algo < 0) {
    fprintf(stderr, "symmem C consumer: symmem_parse_algo failed\n");
    return 1;
  }
  printf("symmem C consumer: linked, push is algorithm %d\n", algo);
  return 0;
}
