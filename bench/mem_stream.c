/* A memory-bound background load for CPU benchmarks (issue 12: decode on a loaded machine): one thread copying two
 * 256 MiB buffers back and forth forever, far larger than any cache, so it competes for DRAM bandwidth (and one
 * core) the way a neighbour's job does.
 *   gcc -O2 -o /tmp/mem_stream bench/mem_stream.c && /tmp/mem_stream & ... ; kill %1 */
#include <stdlib.h>
#include <string.h>

int main(void) {
  const size_t n = (size_t)256 << 20;
  char* a = malloc(n);
  char* b = malloc(n);
  if (!a || !b) return 1;
  memset(a, 1, n);
  memset(b, 2, n);
  for (;;) {
    memcpy(b, a, n);
    memcpy(a, b, n);
  }
}
