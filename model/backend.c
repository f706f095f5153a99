// model/backend.c: parallel.backend to an operations table (see model/ops.h): the one place that
// knows which backends this build has (the CUDA one when the Makefile compiled it).
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "model/ops.h"
#ifdef HAVE_CUDA
#include "model/cuda/ops_cuda.h"
#endif

const Ops *backend_open(const char *want, const BackendOptions *o) {
  if (!strcmp(want, "cpu")) return cpu_backend_open();
#ifdef HAVE_CUDA
  char err[512];
  const Ops *cuda = cuda_backend_open(o, err, sizeof err);
  if (cuda) return cuda;
  if (!strcmp(want, "cuda")) die("parallel.backend: cuda: %s", err);
  printf("no usable GPU (%s): using the CPU backend\n", err);
#else
  (void)o;
  if (!strcmp(want, "cuda"))
    die("parallel.backend: cuda, but this binary was built without the CUDA backend (make printed why)");
#endif
  return cpu_backend_open();
}
