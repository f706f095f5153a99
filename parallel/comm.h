// parallel/comm.h: the collectives that data parallelism needs, over one of two transports.
//
// - TCP (parallel/comm_tcp.c): host memory, for the CPU backend. Every rank holds one socket to rank
//   0, which does every reduction itself, adding the ranks' values in rank order: the result does
//   not depend on timing, so runs repeat bit for bit. Bandwidth is that of rank 0's link; it is
//   meant for tests and small models, and as the bootstrap of NCCL.
// - NCCL (parallel/comm_nccl.cu, HAVE_CUDA): device memory, for the CUDA backend. The unique id
//   travels over the TCP connection; the float collectives then run on a stream of their own,
//   ordered after the work queued on cuda_stream() by events.
//
// Rendezvous without MPI, from the environment (torchrun style):
//   RANK, WORLD_SIZE, LOCAL_RANK            (or SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID)
//   MASTER_ADDR, MASTER_PORT                rank 0 listens there, the others connect
// or, with parallel.rendezvous = "file:/shared/path", rank 0 listens on a free port and writes
// "host port" into that file (atomically, by rename); the others poll it. Without RANK /
// SLURM_PROCID the process is alone (world 1) and no socket is opened.
//
// Shards: a buffer of n floats is cut into world contiguous pieces; rank r owns
// [r*q, (r+1)*q) with q = n / world, and the last rank also owns the n % world tail elements.
//
// Gradient reductions go range by range (comm_reduce_ranges), so that parallel/zero.c can start them
// while the backward still runs. A range may span shard boundaries: each piece goes to its owner.
// On the wire a gradient is fp32 or, with COMM_BF16, rounded to BF16 (round to nearest even) and
// summed in BF16 arithmetic (each add rounds to BF16, as NCCL's BF16 sum does; the TCP transport
// does exactly the same on the host, in rank order), then widened back to fp32 in the owner's
// shard. BF16 halves the bytes and costs about 3 significant digits of each summand.
//
// Failures: every blocking step waits at most parallel.timeout_s seconds. A closed socket, a
// timeout, or an NCCL asynchronous error makes the process die with a message naming the ranks
// and the collective, so the other ranks stop too instead of hanging. On NCCL a watchdog thread
// also checks while a collective is queued: a peer's TCP connection that closes (the peer died) or
// a collective that has not finished after parallel.timeout_s aborts the communicator and exits.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct Comm Comm;

// The process's place in the job, as the environment says (see above).
typedef struct {
  int rank, world, local_rank;
  char master_addr[256];
  int master_port;
} CommEnv;

// Reads RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT, else the SLURM_* variables (MASTER_ADDR
// must then be exported, e.g. by the sbatch script; MASTER_PORT defaults to 29500). Returns 0, or
// -1 with a message naming the variable in err.
int comm_env(CommEnv *e, char *err, size_t errlen);

// Joins the job. rendezvous: "" or "env" (MASTER_ADDR/MASTER_PORT) or "file:/path". device: 0
// collectives on host memory (TCP), 1 on device memory (NCCL; dies if this build lacks CUDA).
// Dies with a clear message when the rendezvous fails within timeout_s.
Comm *comm_init(const CommEnv *e, const char *rendezvous, double timeout_s, int device);
void comm_free(Comm *c);
int comm_rank(const Comm *c);
int comm_world(const Comm *c);
int comm_local_rank(const Comm *c);

// The shard of a buffer of n elements that rank owns: [*lo, *hi).
void comm_shard_range(size_t n, int world, int rank, size_t *lo, size_t *hi);
// The rank whose shard holds element i (< n).
int comm_shard_owner(size_t n, int world, size_t i);
// The piece of [a, end) that starts at a and lies in one shard: returns its end, *owner its rank.
size_t comm_shard_piece(size_t n, int world, size_t a, size_t end, int *owner);

// Host doubles: x[0..n) becomes the sum over ranks (rank order), identical on every rank.
void comm_allreduce_sum_f64(Comm *c, double *x, int n);
// Host bit sets: x[0..n) becomes the OR over ranks, identical on every rank (over TCP).
void comm_allreduce_or_u64(Comm *c, uint64_t *x, size_t n);

// The wire type of a gradient reduction (parallel.grad_reduce).
typedef enum { COMM_FP32 = 0, COMM_BF16 = 1 } CommDtype;
typedef struct {
  size_t off, len;  // floats
} CommRange;
// buf holds n floats (host or device per comm_init); ranges lie in [0, n). Afterwards, once
// comm_reduce_wait returned, every element of the ranges inside this rank's shard holds the sum
// over ranks; the rest of the ranges is undefined, the rest of buf untouched. Every rank must make
// the same calls with the same ranges. NCCL: queued on the transport's own stream after the work
// queued so far on cuda_stream(), returns at once. TCP: done when it returns.
void comm_reduce_ranges(Comm *c, float *buf, size_t n, const CommRange *r, int nr, CommDtype t);
// The sum over ranks of the rows rows[0..nrows) (ascending) of a [V, row_len] table at buf + base
// (buf holds n floats), each row into its owner's shard, queued like comm_reduce_ranges: the rows a
// sparse gradient touched (the embedding's, parallel/zero.c). NCCL packs each owner's rows into one
// contiguous buffer, reduces it with one call and unpacks it on the owner (a range per row would be
// thousands of tiny reductions); TCP reduces them as ranges. The same sums, bit for bit.
void comm_reduce_rows(Comm *c, float *buf, size_t n, size_t base, size_t row_len, const uint32_t *rows, int nrows,
                      CommDtype t);
// Waits for every comm_reduce_ranges so far (watching peers and parallel.timeout_s); work queued
// on cuda_stream() afterwards sees the sums.
void comm_reduce_wait(Comm *c);
// The whole buffer at once: comm_reduce_ranges over [0, n), then comm_reduce_wait.
void comm_reduce_scatter_sum(Comm *c, float *buf, size_t n, CommDtype t);
// buf: every rank contributes its shard; afterwards every rank holds all n values.
void comm_all_gather(Comm *c, float *buf, size_t n);
// The same from src (only the rank's own shard of it is read) into dst (all n values written).
void comm_all_gather_to(Comm *c, const float *src, float *dst, size_t n);
// The same on n BF16 values (2 bytes each, the shards of n elements as for floats): the parameters'
// BF16 copies after a sharded-master optimizer step (parallel/zero.c).
void comm_all_gather_bf16(Comm *c, void *buf, size_t n);
// Only the ranges r[0..nr) of buf [n]: each piece goes from the rank whose shard holds it to all.
void comm_all_gather_ranges(Comm *c, float *buf, size_t n, const CommRange *r, int nr);
// Staged all-gather of BF16 values (2 bytes each, sharded as n floats would be), for the updated
// parameters' BF16 copy (parallel/zero.c): gathers the pieces of the ranges r (from their owners) as
// stage `stage` without waiting, queued on the transport's stream behind the work on cuda_stream()
// so far; comm_stage_wait(c, stage) makes the work queued on cuda_stream() afterwards wait for that
// stage (a GPU-side wait: the host goes on). Every rank makes the same calls. TCP (host memory):
// done when it returns, and the wait does nothing. A stage never gathered: nothing to wait for.
void comm_all_gather_bf16_stage(Comm *c, void *buf, size_t n, const CommRange *r, int nr, int stage);
void comm_stage_wait(Comm *c, int stage);
// Host bytes: rank 0's buf[0..len) is copied to every rank.
void comm_broadcast_bytes(Comm *c, void *buf, size_t len);
void comm_barrier(Comm *c);
// 1 when the collectives run on device memory (NCCL), 0 on host memory (TCP, or world 1).
int comm_on_device(const Comm *c);

// BF16 round to nearest even (NaN stays NaN) and back, as the transports put gradients on the wire.
static inline uint16_t comm_f32_to_bf16(float f) {
  union {
    float f;
    uint32_t u;
  } x = {f};
  if ((x.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x.u >> 16) | 0x40);  // quiet NaN
  return (uint16_t)((x.u + 0x7fffu + ((x.u >> 16) & 1)) >> 16);
}
static inline float comm_bf16_to_f32(uint16_t h) {
  union {
    uint32_t u;
    float f;
  } x = {(uint32_t)h << 16};
  return x.f;
}

// ---- internal: the NCCL transport (parallel/comm_nccl.cu), bootstrapped through the TCP one ------
// The rank of a peer whose TCP connection has closed or failed (it exited or was killed), or -1.
// Does not block and reads nothing; for the NCCL watchdog.
int comm_tcp_dead_peer(const Comm *c);
#ifdef HAVE_CUDA
typedef struct CommNccl CommNccl;
CommNccl *comm_nccl_init(Comm *tcp, int rank, int world, double timeout_s);
void comm_nccl_free(CommNccl *n);
void comm_nccl_reduce_ranges(CommNccl *n, float *buf, size_t count, const CommRange *r, int nr, CommDtype t);
void comm_nccl_reduce_rows(CommNccl *n, float *buf, size_t count, size_t base, size_t row_len, const uint32_t *rows,
                           int nrows, CommDtype t);
void comm_nccl_wait(CommNccl *n, const char *what);
// Pieces of the ranges (NULL: all of [0, count)), elem_bytes 4 (fp32) or 2 (BF16), broadcast from
// the owner's src to every rank's dst; waits for the result when wait, else comm_nccl_wait does.
void comm_nccl_gather(CommNccl *n, const void *src, void *dst, size_t count, int elem_bytes, const CommRange *r, int nr,
                      int wait);
// The NCCL side of comm_all_gather_bf16_stage / comm_stage_wait (one event per stage).
void comm_nccl_stage_done(CommNccl *n, int stage);
void comm_nccl_stage_wait(CommNccl *n, int stage);
#endif

#ifdef __cplusplus
}
#endif
