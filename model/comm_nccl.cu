// model/comm_nccl.cu: the device-memory collectives of model/comm.h over NCCL. The unique id goes
// from rank 0 to the others over the TCP connection that comm_init already opened; the float
// collectives run on cuda_stream(). Shards follow comm_shard_range: world equal pieces of
// q = n / world floats (NCCL's in-place reduce-scatter / all-gather), plus a tail of n % world
// floats owned by the last rank (a reduce to it, then a broadcast from it).
//
// libnccl is opened with dlopen at comm_init time rather than linked: the build needs only nccl.h,
// and a one-process run never needs the library at all.
//
// A dead peer makes an NCCL kernel wait forever, so after queuing a collective the host polls the
// stream and ncclCommGetAsyncError until it finishes; past parallel.timeout_s it aborts the
// communicator and dies naming the collective. That wait is a host sync, twice per optimizer step.
#include <dlfcn.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "model/comm.h"
#include "model/cuda_common.h"

// The entry points used, resolved from libnccl.so.2 by nccl_load().
static struct {
  decltype(&ncclGetUniqueId) GetUniqueId;
  decltype(&ncclCommInitRank) CommInitRank;
  decltype(&ncclCommDestroy) CommDestroy;
  decltype(&ncclCommAbort) CommAbort;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError;
  decltype(&ncclGetErrorString) GetErrorString;
  decltype(&ncclGroupStart) GroupStart;
  decltype(&ncclGroupEnd) GroupEnd;
  decltype(&ncclReduceScatter) ReduceScatter;
  decltype(&ncclReduce) Reduce;
  decltype(&ncclAllGather) AllGather;
  decltype(&ncclBroadcast) Broadcast;
} nccl;

static void nccl_load(void) {
  if (nccl.GetUniqueId) return;
  void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
  if (!h) die("comm: cannot load NCCL (libnccl.so.2): %s; add its directory to LD_LIBRARY_PATH", dlerror());
#define SYM(field, name)                                                                          \
  if (!(*(void **)&nccl.field = dlsym(h, name))) die("comm: libnccl.so.2 has no symbol %s (NCCL too old?)", name);
  SYM(GetUniqueId, "ncclGetUniqueId") SYM(CommInitRank, "ncclCommInitRank") SYM(CommDestroy, "ncclCommDestroy")
  SYM(CommAbort, "ncclCommAbort") SYM(CommGetAsyncError, "ncclCommGetAsyncError")
  SYM(GetErrorString, "ncclGetErrorString") SYM(GroupStart, "ncclGroupStart") SYM(GroupEnd, "ncclGroupEnd")
  SYM(ReduceScatter, "ncclReduceScatter") SYM(Reduce, "ncclReduce") SYM(AllGather, "ncclAllGather")
  SYM(Broadcast, "ncclBroadcast")
#undef SYM
}

#define NCCL_CHECK(call)                                                                         \
  do {                                                                                           \
    ncclResult_t r_ = (call);                                                                    \
    if (r_ != ncclSuccess) die("NCCL error: %s: %s", #call, nccl.GetErrorString(r_));           \
  } while (0)

struct CommNccl {
  ncclComm_t comm;
  int rank, world;
  double timeout_s;
};

extern "C" CommNccl *comm_nccl_init(Comm *tcp, int rank, int world, double timeout_s) {
  // NVLink SHARP (multicast) is not available on every machine this runs on: keep it off unless
  // the user decided otherwise. NCCL reads the variable at communicator creation.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  nccl_load();
  ncclUniqueId id;
  if (rank == 0) NCCL_CHECK(nccl.GetUniqueId(&id));
  comm_broadcast_bytes(tcp, &id, sizeof id);
  CommNccl *n = (CommNccl *)xcalloc(1, sizeof *n);
  n->rank = rank, n->world = world, n->timeout_s = timeout_s;
  NCCL_CHECK(nccl.CommInitRank(&n->comm, world, id, rank));
  comm_barrier(tcp);  // every rank has its communicator before the first collective
  return n;
}

extern "C" void comm_nccl_free(CommNccl *n) {
  if (!n) return;
  nccl.CommDestroy(n->comm);
  free(n);
}

// Waits for the queued collective, watching for peer failures and the deadline.
static void wait_collective(CommNccl *n, const char *what) {
  double deadline = now_seconds() + n->timeout_s;
  for (;;) {
    cudaError_t e = cudaStreamQuery(cuda_stream());
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) die("comm: rank %d: CUDA error during %s: %s", n->rank, what, cudaGetErrorString(e));
    ncclResult_t async;
    NCCL_CHECK(nccl.CommGetAsyncError(n->comm, &async));
    if (async != ncclSuccess) {
      nccl.CommAbort(n->comm);
      die("comm: rank %d: NCCL failed during %s: %s (a peer rank died or its network failed)", n->rank, what,
          nccl.GetErrorString(async));
    }
    if (now_seconds() > deadline) {
      nccl.CommAbort(n->comm);
      die("comm: rank %d: %s did not finish within %g s (parallel.timeout_s): is every rank alive?", n->rank, what,
          n->timeout_s);
    }
    usleep(100);
  }
}

extern "C" void comm_nccl_reduce_scatter_sum(CommNccl *n, float *buf, size_t count) {
  size_t q = count / n->world, tail = count - q * n->world;
  cudaStream_t s = cuda_stream();
  NCCL_CHECK(nccl.GroupStart());
  if (q) NCCL_CHECK(nccl.ReduceScatter(buf, buf + n->rank * q, q, ncclFloat, ncclSum, n->comm, s));
  if (tail) NCCL_CHECK(nccl.Reduce(buf + q * n->world, buf + q * n->world, tail, ncclFloat, ncclSum, n->world - 1, n->comm, s));
  NCCL_CHECK(nccl.GroupEnd());
  wait_collective(n, "reduce-scatter of the gradients");
}

extern "C" void comm_nccl_all_gather(CommNccl *n, float *buf, size_t count) {
  size_t q = count / n->world, tail = count - q * n->world;
  cudaStream_t s = cuda_stream();
  NCCL_CHECK(nccl.GroupStart());
  if (q) NCCL_CHECK(nccl.AllGather(buf + n->rank * q, buf, q, ncclFloat, n->comm, s));
  if (tail) NCCL_CHECK(nccl.Broadcast(buf + q * n->world, buf + q * n->world, tail, ncclFloat, n->world - 1, n->comm, s));
  NCCL_CHECK(nccl.GroupEnd());
  wait_collective(n, "all-gather of the parameters");
}
