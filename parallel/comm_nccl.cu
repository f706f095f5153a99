// parallel/comm_nccl.cu: the device-memory collectives of parallel/comm.h over NCCL. The unique id goes
// from rank 0 to the others over the TCP connection that comm_init already opened.
//
// Streams: every NCCL call runs on a stream of its own (non-blocking, high priority), ordered after
// the work queued so far on cuda_stream() by an event, so gradient reductions run while the
// backward goes on (parallel/zero.c). comm_nccl_wait makes cuda_stream() wait for it again.
//
// Shards follow comm_shard_range (contiguous, the last rank takes the n % world tail). A reduction
// of a range is one ncclReduce per intersection with a shard, rooted at its owner, all in one
// group; the all-gather is one ncclBroadcast per shard, rooted at its owner. Large pieces are cut
// into ops of at most 2^28 elements. BF16 reductions round the range into a fixed scratch buffer
// (round to nearest even), reduce it there (NCCL sums BF16 in BF16; it has no fp32 accumulation
// for BF16 inputs) and widen the owner's piece back into the fp32 gradients.
//
// libnccl is opened with dlopen at comm_init time rather than linked, and the few types and
// constants used are declared here (their values are NCCL's stable ABI), so the build needs
// neither the library nor nccl.h, and a one-process run never loads it. TRAIN_NCCL_LIB names
// another file than libnccl.so.2.
//
// Failures: a dead peer makes an NCCL kernel wait forever. A watchdog thread looks, every 50 ms
// while anything is queued on the NCCL stream, at ncclCommGetAsyncError, at the TCP connections (a
// killed peer's close shows at once) and at how long the stream has been busy; on an error, on a
// peer gone for 2 s, or past parallel.timeout_s, it prints what happened, aborts the communicator
// and exits the process with status 1 (SIGALRM ends it if the abort itself hangs). So no host call
// that might block on the device (a wait, a cudaFree) can hang the rank.
#include <cuda_bf16.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "parallel/comm.h"
#include "common/cuda_common.h"

// ---- the NCCL ABI subset used (nccl.h, stable since NCCL 2.0) ----------------------------------
typedef struct ncclComm *ncclComm_t;
typedef struct {
  char internal[128];  // NCCL_UNIQUE_ID_BYTES
} ncclUniqueId;
typedef int ncclResult_t;  // ncclSuccess = 0
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
enum { ncclSuccess = 0, ncclFloat = 7, ncclBfloat16 = 9, ncclSum = 0 };

// The entry points used, resolved from the library by nccl_load().
static struct {
  ncclResult_t (*GetUniqueId)(ncclUniqueId *);
  ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
  const char *(*GetErrorString)(ncclResult_t);
  ncclResult_t (*GetVersion)(int *);
  ncclResult_t (*GroupStart)(void);
  ncclResult_t (*GroupEnd)(void);
  ncclResult_t (*Reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*Broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
} nccl;

static void nccl_load(void) {
  if (nccl.GetUniqueId) return;
  const char *lib = getenv("TRAIN_NCCL_LIB");
  if (!lib || !*lib) lib = "libnccl.so.2";
  void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
  if (!h)
    die("comm: cannot load NCCL (%s): %s; add its directory to LD_LIBRARY_PATH or set "
        "TRAIN_NCCL_LIB=/path/libnccl.so.2",
        lib, dlerror());
#define SYM(field, name)                                                                                        \
  do {                                                                                                          \
    if (!(*(void **)&nccl.field = dlsym(h, name))) die("comm: %s has no symbol %s (NCCL too old?)", lib, name); \
  } while (0)
  SYM(GetUniqueId, "ncclGetUniqueId");
  SYM(CommInitRank, "ncclCommInitRank");
  SYM(CommDestroy, "ncclCommDestroy");
  SYM(CommAbort, "ncclCommAbort");
  SYM(CommGetAsyncError, "ncclCommGetAsyncError");
  SYM(GetErrorString, "ncclGetErrorString");
  SYM(GetVersion, "ncclGetVersion");
  SYM(GroupStart, "ncclGroupStart");
  SYM(GroupEnd, "ncclGroupEnd");
  SYM(Reduce, "ncclReduce");
  SYM(Broadcast, "ncclBroadcast");
#undef SYM
}

enum {
  MAX_OP = 1 << 28,    // elements per NCCL op (1 GiB of fp32)
  SCRATCH = 1 << 25,   // BF16 elements of reduction scratch (64 MiB)
  MAX_PIECES = 256,    // pieces per BF16 group
  PEER_GRACE_S = 2,    // a closed peer connection with a collective still queued: dead after this
  ABORT_GRACE_S = 20,  // ncclCommAbort gets this long before SIGALRM ends the process
};

struct CommNccl {
  ncclComm_t comm;
  Comm *tcp;  // to see peers die
  int rank, world, device;
  double timeout_s;
  cudaStream_t stream;      // every NCCL call
  cudaEvent_t ready, done;  // compute -> NCCL stream, NCCL -> compute stream
  cudaEvent_t *stage;       // comm_nccl_stage_done: one per stage of a staged all-gather
  int nstage, capstage;
  void *rows_scr, *rows_idx;  // comm_nccl_reduce_rows: packed rows and their indices (grow-only)
  size_t rows_scr_cap, rows_idx_cap;
  uint32_t *rows_host;  // the indices on the host, while their uploads are queued
  size_t rows_host_cap;
  __nv_bfloat16 *scratch;  // BF16 reductions (allocated at the first)
  int initializing;        // inside ncclCommInitRank, which waits for every rank (atomic)
  int queued;              // work is queued on stream since the last completed wait (atomic)
  int failed;              // a failure is being reported (atomic)
  int stop;                // the watchdog should exit (atomic)
  pthread_t watchdog;
  const char *what;  // the collective waited for, for messages
};

// Reports, aborts the communicator and exits; one thread gets to do it, the other sleeps.
static void nccl_fail(CommNccl *n, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void nccl_fail(CommNccl *n, const char *fmt, ...) {
  if (__atomic_exchange_n(&n->failed, 1, __ATOMIC_SEQ_CST))
    for (;;) pause();
  fflush(stdout);
  fprintf(stderr, "error (parallel/comm_nccl.cu): comm: rank %d: ", n->rank);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
  alarm(ABORT_GRACE_S);  // the default SIGALRM action ends the process if the abort hangs
  if (!__atomic_load_n(&n->initializing, __ATOMIC_SEQ_CST) && n->comm) nccl.CommAbort(n->comm);
  _exit(1);
}

#define NCCL_CHECK(n, call)                                                                    \
  do {                                                                                         \
    ncclResult_t r_ = (call);                                                                  \
    if (r_ != ncclSuccess) nccl_fail(n, "NCCL error: %s: %s", #call, nccl.GetErrorString(r_)); \
  } while (0)

#define CUDA_OK(n, call)                                                                      \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) nccl_fail(n, "CUDA error: %s: %s", #call, cudaGetErrorString(e_)); \
  } while (0)

// Every 50 ms while work is queued on the NCCL stream: asynchronous NCCL errors, dead peers and
// the deadline (see the top of the file). Idle, it only sleeps.
static void *watchdog_main(void *arg) {
  CommNccl *n = (CommNccl *)arg;
  cudaSetDevice(n->device);  // the stream queries below need this thread on the rank's device
  double busy_since = 0, peer_lost_since = 0;
  while (!__atomic_load_n(&n->stop, __ATOMIC_SEQ_CST)) {
    usleep(50 * 1000);
    int init = __atomic_load_n(&n->initializing, __ATOMIC_SEQ_CST);
    int busy =
        init || (__atomic_load_n(&n->queued, __ATOMIC_SEQ_CST) && cudaStreamQuery(n->stream) == cudaErrorNotReady);
    if (!busy) {
      busy_since = peer_lost_since = 0;
      continue;
    }
    double now = now_seconds();
    if (!busy_since) busy_since = now;
    ncclResult_t async = ncclSuccess;
    if (!init && nccl.CommGetAsyncError(n->comm, &async) == ncclSuccess && async != ncclSuccess)
      nccl_fail(n, "NCCL failed during %s: %s (a peer rank died or its link failed)", n->what,
                nccl.GetErrorString(async));
    int peer = comm_tcp_dead_peer(n->tcp);
    if (peer < 0) peer_lost_since = 0;
    else if (!peer_lost_since) peer_lost_since = now;
    else if (now - peer_lost_since > PEER_GRACE_S)
      nccl_fail(n, "rank %d closed its connection during %s (it exited or was killed): stopping", peer, n->what);
    if (now - busy_since > n->timeout_s)
      nccl_fail(n, "%s did not finish within %g s (parallel.timeout_s): is every rank alive?", n->what, n->timeout_s);
  }
  return NULL;
}

// NVLink SHARP (multicast) stays off: not every machine this runs on supports it, and a
// communicator that tries it can fail or hang at creation. NCCL reads the variable at init.
static void nvls_off(void) {
  const char *v = getenv("NCCL_NVLS_ENABLE");
  if (v && strcmp(v, "0"))
    fprintf(stderr, "warning: NCCL_NVLS_ENABLE=%s ignored: NVLink multicast stays off (parallel/comm_nccl.cu)\n", v);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
}

extern "C" CommNccl *comm_nccl_init(Comm *tcp, int rank, int world, double timeout_s) {
  nvls_off();
  nccl_load();
  CommNccl *n = (CommNccl *)xcalloc(1, sizeof *n);
  n->tcp = tcp, n->rank = rank, n->world = world, n->timeout_s = timeout_s, n->what = "NCCL setup";
  CUDA_OK(n, cudaGetDevice(&n->device));  // train.c selected LOCAL_RANK's device before any allocation
  int lo, hi;  // NCCL's work then preempts the backward's kernels as soon as its inputs are ready
  CUDA_OK(n, cudaDeviceGetStreamPriorityRange(&lo, &hi));
  CUDA_OK(n, cudaStreamCreateWithPriority(&n->stream, cudaStreamNonBlocking, hi));
  CUDA_OK(n, cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming));
  CUDA_OK(n, cudaEventCreateWithFlags(&n->done, cudaEventDisableTiming));
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (rank == 0) NCCL_CHECK(n, nccl.GetUniqueId(&id));
  comm_broadcast_bytes(tcp, &id, sizeof id);
  // The watchdog also bounds the communicator's creation, which waits for every rank.
  n->initializing = 1;
  if (pthread_create(&n->watchdog, NULL, watchdog_main, n)) die("comm: rank %d: cannot start the NCCL watchdog", rank);
  NCCL_CHECK(n, nccl.CommInitRank(&n->comm, world, id, rank));
  __atomic_store_n(&n->initializing, 0, __ATOMIC_SEQ_CST);
  comm_barrier(tcp);  // every rank has its communicator before the first collective
  int version = 0;
  nccl.GetVersion(&version);
  if (rank == 0)
    printf("comm: NCCL %d.%d.%d on %d ranks (NCCL_NVLS_ENABLE=0)\n", version / 10000, version / 100 % 100,
           version % 100, world);
  return n;
}

extern "C" void comm_nccl_free(CommNccl *n) {
  if (!n) return;
  __atomic_store_n(&n->stop, 1, __ATOMIC_SEQ_CST);
  pthread_join(n->watchdog, NULL);
  cudaStreamSynchronize(n->stream);
  nccl.CommDestroy(n->comm);
  if (n->scratch) cudaFree(n->scratch);
  free(n->rows_host);
  if (n->rows_scr) cudaFree(n->rows_scr);
  if (n->rows_idx) cudaFree(n->rows_idx);
  for (int i = 0; i < n->nstage; i++) cudaEventDestroy(n->stage[i]);
  free(n->stage);
  cudaEventDestroy(n->ready);
  cudaEventDestroy(n->done);
  cudaStreamDestroy(n->stream);
  free(n);
}

// Orders the NCCL stream after everything queued on the compute stream so far.
static void after_compute(CommNccl *n, const char *what) {
  n->what = what;
  CUDA_OK(n, cudaEventRecord(n->ready, cuda_stream()));
  CUDA_OK(n, cudaStreamWaitEvent(n->stream, n->ready, 0));
  __atomic_store_n(&n->queued, 1, __ATOMIC_SEQ_CST);
}

extern "C" void comm_nccl_wait(CommNccl *n, const char *what) {
  if (!__atomic_load_n(&n->queued, __ATOMIC_SEQ_CST)) return;
  n->what = what;
  for (;;) {  // the watchdog ends the process if this never finishes
    cudaError_t e = cudaStreamQuery(n->stream);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) nccl_fail(n, "CUDA error during %s: %s", what, cudaGetErrorString(e));
    usleep(50);
  }
  __atomic_store_n(&n->queued, 0, __ATOMIC_SEQ_CST);
  CUDA_OK(n, cudaEventRecord(n->done, n->stream));
  CUDA_OK(n, cudaStreamWaitEvent(cuda_stream(), n->done, 0));
}

// ---- reductions ---------------------------------------------------------------------------------

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void bf16_to_f32_kernel(float *dst, const __nv_bfloat16 *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = __bfloat162float(src[i]);
}

// A piece of a range: buf[off, off + len) owned by one rank; at scr in the BF16 scratch.
typedef struct {
  size_t off, len, scr;
  int owner;
} Piece;

// Calls fn on every piece of the ranges, cut at shard boundaries and at `cap` elements.
template <typename F>
static void for_each_piece(size_t n, int world, const CommRange *r, int nr, size_t cap, F fn) {
  for (int i = 0; i < nr; i++) {
    size_t a = r[i].off, end = r[i].off + r[i].len;
    while (a < end) {
      int owner;
      size_t b = comm_shard_piece(n, world, a, end, &owner);
      if (b - a > cap) b = a + cap;
      fn(a, b - a, owner);
      a = b;
    }
  }
}

// BF16: round the pieces into the scratch, reduce each to its owner there, widen the owner's back.
static void bf16_group(CommNccl *n, float *buf, const Piece *p, int np) {
  for (int i = 0; i < np; i++) {
    f32_to_bf16_kernel<<<cuda_grid(p[i].len, 256), 256, 0, n->stream>>>(n->scratch + p[i].scr, buf + p[i].off,
                                                                        p[i].len);
    CUDA_OK(n, cudaGetLastError());
  }
  NCCL_CHECK(n, nccl.GroupStart());
  for (int i = 0; i < np; i++)
    NCCL_CHECK(n, nccl.Reduce(n->scratch + p[i].scr, n->scratch + p[i].scr, p[i].len, ncclBfloat16, ncclSum, p[i].owner,
                              n->comm, n->stream));
  NCCL_CHECK(n, nccl.GroupEnd());
  for (int i = 0; i < np; i++)
    if (p[i].owner == n->rank) {
      bf16_to_f32_kernel<<<cuda_grid(p[i].len, 256), 256, 0, n->stream>>>(buf + p[i].off, n->scratch + p[i].scr,
                                                                          p[i].len);
      CUDA_OK(n, cudaGetLastError());
    }
}

extern "C" void comm_nccl_reduce_ranges(CommNccl *n, float *buf, size_t count, const CommRange *r, int nr,
                                        CommDtype t) {
  after_compute(n, "reduce-scatter of the gradients");
  if (t == COMM_FP32) {  // in place: the owner's piece of buf becomes the sum
    NCCL_CHECK(n, nccl.GroupStart());
    for_each_piece(count, n->world, r, nr, MAX_OP, [&](size_t off, size_t len, int owner) {
      NCCL_CHECK(n, nccl.Reduce(buf + off, buf + off, len, ncclFloat, ncclSum, owner, n->comm, n->stream));
    });
    NCCL_CHECK(n, nccl.GroupEnd());
    return;
  }
  if (!n->scratch) CUDA_OK(n, cudaMalloc((void **)&n->scratch, SCRATCH * sizeof(__nv_bfloat16)));
  // The scratch is reused group after group: the stream runs them in order, so a group's rounding
  // starts only once the previous group's sums were widened.
  Piece p[MAX_PIECES];
  int np = 0;
  size_t used = 0;
  for_each_piece(count, n->world, r, nr, SCRATCH, [&](size_t off, size_t len, int owner) {
    if (np == MAX_PIECES || used + len > SCRATCH) bf16_group(n, buf, p, np), np = 0, used = 0;
    p[np++] = Piece{off, len, used, owner};
    used += len;
  });
  if (np) bf16_group(n, buf, p, np);
}

// ---- sparse rows: packed, one reduction per owner --------------------------------------------------

// dst[i, :] = src[rows[i], :] (T = float, or BF16 rounded to nearest even as the ranges' path does).
template <typename T>
__global__ void pack_rows_kernel(T *dst, const float *src, const uint32_t *rows, size_t k, size_t row_len) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < k * row_len; i += (size_t)gridDim.x * blockDim.x) {
    float v = src[(size_t)rows[i / row_len] * row_len + i % row_len];
    if constexpr (sizeof(T) == 4) dst[i] = v;
    else dst[i] = __float2bfloat16_rn(v);
  }
}

// dst[rows[i], :] = src[i, :], widened to fp32.
template <typename T>
__global__ void unpack_rows_kernel(float *dst, const T *src, const uint32_t *rows, size_t k, size_t row_len) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < k * row_len; i += (size_t)gridDim.x * blockDim.x) {
    float v;
    if constexpr (sizeof(T) == 4) v = src[i];
    else v = __bfloat162float(src[i]);
    dst[(size_t)rows[i / row_len] * row_len + i % row_len] = v;
  }
}

// Grow-only device buffer on the transport (the stream orders its reuse).
static void *grow(CommNccl *n, void **p, size_t *cap, size_t bytes) {
  if (bytes > *cap) {
    CUDA_OK(n, cudaStreamSynchronize(n->stream));  // queued work may still read the old one
    if (*p) cudaFree(*p);
    CUDA_OK(n, cudaMalloc(p, bytes));
    *cap = bytes;
  }
  return *p;
}

extern "C" void comm_nccl_reduce_rows(CommNccl *n, float *buf, size_t count, size_t base, size_t row_len,
                                      const uint32_t *rows, int nrows, CommDtype t) {
  // Rows that lie in one shard go packed, per owner; a row across a shard boundary (at most
  // world - 1 of them) as a plain range.
  // Host copy of the indices per owner: kept in the transport (grow-only) because the uploads below
  // are asynchronous; the step's comm_reduce_wait has finished them before the next call.
  if ((size_t)nrows > n->rows_host_cap) {
    free(n->rows_host);
    n->rows_host = (uint32_t *)xmalloc((size_t)nrows * sizeof(uint32_t));
    n->rows_host_cap = (size_t)nrows;
  }
  uint32_t *byown = n->rows_host;
  size_t idx_bytes = (size_t)(nrows ? nrows : 1) * sizeof(uint32_t);
  uint32_t *dev_idx = (uint32_t *)grow(n, &n->rows_idx, &n->rows_idx_cap, idx_bytes);
  const size_t eb = t == COMM_FP32 ? 4 : 2;
  size_t off_idx = 0;
  for (int owner = 0; owner < n->world; owner++) {
    size_t lo, hi;
    comm_shard_range(count, n->world, owner, &lo, &hi);
    uint32_t *mine = byown + off_idx;  // this owner's rows, after the previous owners' (no reuse)
    int k = 0;
    for (int i = 0; i < nrows; i++) {
      size_t a = base + (size_t)rows[i] * row_len, b = a + row_len;
      if (a >= lo && b <= hi) mine[k++] = rows[i];
      else if (owner == 0 && comm_shard_owner(count, n->world, a) != comm_shard_owner(count, n->world, b - 1)) {
        CommRange r = {a, row_len};
        comm_nccl_reduce_ranges(n, buf, count, &r, 1, t);
      }
    }
    if (!k) continue;
    after_compute(n, "reduce-scatter of the gradients");
    void *scr = grow(n, &n->rows_scr, &n->rows_scr_cap, (size_t)k * row_len * eb);
    CUDA_OK(n,
            cudaMemcpyAsync(dev_idx + off_idx, mine, (size_t)k * sizeof(uint32_t), cudaMemcpyHostToDevice, n->stream));
    const uint32_t *ix = dev_idx + off_idx;
    float *table = buf + base;
    size_t len = (size_t)k * row_len;
    if (t == COMM_FP32)
      pack_rows_kernel<float><<<cuda_grid(len, 256), 256, 0, n->stream>>>((float *)scr, table, ix, k, row_len);
    else
      pack_rows_kernel<__nv_bfloat16>
          <<<cuda_grid(len, 256), 256, 0, n->stream>>>((__nv_bfloat16 *)scr, table, ix, k, row_len);
    CUDA_OK(n, cudaGetLastError());
    for (size_t a = 0; a < len; a += MAX_OP) {
      size_t m = len - a < MAX_OP ? len - a : MAX_OP;
      NCCL_CHECK(n, nccl.Reduce((char *)scr + a * eb, (char *)scr + a * eb, m,
                                t == COMM_FP32 ? ncclFloat : ncclBfloat16, ncclSum, owner, n->comm, n->stream));
    }
    if (owner == n->rank) {
      if (t == COMM_FP32)
        unpack_rows_kernel<float>
            <<<cuda_grid(len, 256), 256, 0, n->stream>>>(table, (const float *)scr, ix, k, row_len);
      else
        unpack_rows_kernel<__nv_bfloat16>
            <<<cuda_grid(len, 256), 256, 0, n->stream>>>(table, (const __nv_bfloat16 *)scr, ix, k, row_len);
      CUDA_OK(n, cudaGetLastError());
    }
    // The next owner's rows reuse the scratch after this one's unpack (the same stream orders it);
    // their indices go after these.
    off_idx += (size_t)k;
  }
}

// One broadcast per shard from its owner (in place), in rounds of at most MAX_OP elements each.
extern "C" void comm_nccl_gather(CommNccl *n, const void *src, void *dst, size_t count, int elem_bytes,
                                 const CommRange *r, int nr, int wait) {
  if (elem_bytes != 4 && elem_bytes != 2) die("comm_nccl_gather: elements of %d bytes (4 or 2)", elem_bytes);
  after_compute(n, "all-gather of the parameters");
  CommRange whole = {0, count};
  if (!r) r = &whole, nr = 1;
  const ncclDataType_t type = elem_bytes == 4 ? ncclFloat : ncclBfloat16;
  const char *s = (const char *)src;
  char *d = (char *)dst;
  int in_group = 0;
  NCCL_CHECK(n, nccl.GroupStart());
  for_each_piece(count, n->world, r, nr, MAX_OP, [&](size_t off, size_t len, int owner) {
    if (in_group == 64) {  // bounded groups: a few hundred norm pieces at most, 2 per shard otherwise
      NCCL_CHECK(n, nccl.GroupEnd());
      NCCL_CHECK(n, nccl.GroupStart());
      in_group = 0;
    }
    size_t o = off * (size_t)elem_bytes;
    NCCL_CHECK(n, nccl.Broadcast(s + o, d + o, len, type, owner, n->comm, n->stream));
    in_group++;
  });
  NCCL_CHECK(n, nccl.GroupEnd());
  if (wait) comm_nccl_wait(n, "all-gather of the parameters");
}

extern "C" void comm_nccl_stage_done(CommNccl *n, int stage) {
  if (stage < 0) die("comm_nccl_stage_done: stage %d", stage);
  while (n->nstage <= stage) {
    n->stage = (cudaEvent_t *)grow_array(n->stage, n->nstage, &n->capstage, sizeof *n->stage);
    CUDA_OK(n, cudaEventCreateWithFlags(&n->stage[n->nstage], cudaEventDisableTiming));
    n->nstage++;
  }
  CUDA_OK(n, cudaEventRecord(n->stage[stage], n->stream));
}

extern "C" void comm_nccl_stage_wait(CommNccl *n, int stage) {
  if (stage < 0 || stage >= n->nstage) return;  // never gathered
  CUDA_OK(n, cudaStreamWaitEvent(cuda_stream(), n->stage[stage], 0));
}
