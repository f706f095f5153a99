// model/comm.h: the collectives that data parallelism needs, over one of two transports.
//
// - TCP (model/comm_tcp.c): host memory, for the CPU backend. Every rank holds one socket to rank
//   0, which does every reduction itself, adding the ranks' values in rank order: the result does
//   not depend on timing, so runs repeat bit for bit. Bandwidth is that of rank 0's link; it is
//   meant for tests and small models, and as the bootstrap of NCCL.
// - NCCL (model/comm_nccl.cu, HAVE_CUDA): device memory, for the CUDA backend. The unique id
//   travels over the TCP connection; the float collectives then run on cuda_stream().
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
// Failures: every blocking step waits at most parallel.timeout_s seconds. A closed socket, a
// timeout, or an NCCL asynchronous error makes the process die with a message naming the ranks
// and the collective, so the other ranks stop too instead of hanging.
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

// Host doubles: x[0..n) becomes the sum over ranks (rank order), identical on every rank.
void comm_allreduce_sum_f64(Comm *c, double *x, int n);
// buf (n floats, host or device per comm_init): afterwards this rank's shard holds the sum over
// ranks of that shard; the rest of buf is left undefined.
void comm_reduce_scatter_sum(Comm *c, float *buf, size_t n);
// buf: every rank contributes its shard; afterwards every rank holds all n values.
void comm_all_gather(Comm *c, float *buf, size_t n);
// Host bytes: rank 0's buf[0..len) is copied to every rank.
void comm_broadcast_bytes(Comm *c, void *buf, size_t len);
void comm_barrier(Comm *c);

// ---- internal: the NCCL transport (model/comm_nccl.cu), bootstrapped through the TCP one ------
#ifdef HAVE_CUDA
typedef struct CommNccl CommNccl;
CommNccl *comm_nccl_init(Comm *tcp, int rank, int world, double timeout_s);
void comm_nccl_free(CommNccl *n);
void comm_nccl_reduce_scatter_sum(CommNccl *n, float *buf, size_t count);
void comm_nccl_all_gather(CommNccl *n, float *buf, size_t count);
#endif

#ifdef __cplusplus
}
#endif
