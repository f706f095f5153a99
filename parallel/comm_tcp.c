// parallel/comm_tcp.c: rendezvous and the host-memory collectives over TCP (see parallel/comm.h).
// A star: rank 0 holds one socket per peer and computes every reduction, adding contributions in
// rank order, so the bits never depend on which peer was faster.
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <stdint.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "parallel/comm.h"

struct Comm {
  int rank, world, local_rank;
  double timeout_s;
  int *fd;         // rank 0: fd[r] is the socket to rank r (r >= 1); other ranks: fd[0], to rank 0
  float *scratch;  // rank 0: one chunk of a peer's contribution
  uint16_t *wire;  // one chunk of BF16 values on their way out (parallel.grad_reduce: bf16)
#ifdef HAVE_CUDA
  CommNccl *nccl;  // device collectives, when comm_init was asked for them
#endif
};

enum { HELLO_MAGIC = 0x4c6c4450, CHUNK = 1 << 18 };  // floats per reduce-scatter chunk (1 MiB)

static int env_int(const char *name, int *out) {
  const char *s = getenv(name);
  if (!s || !*s) return 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (*end || v < 0 || v > 1 << 24) return -1;
  *out = (int)v;
  return 1;
}

int comm_env(CommEnv *e, char *err, size_t errlen) {
  *e = (CommEnv){0, 1, 0, "127.0.0.1", 29500};
  const char *rank_var = "RANK", *world_var = "WORLD_SIZE", *local_var = "LOCAL_RANK";
  if (!getenv("RANK") && getenv("SLURM_PROCID"))
    rank_var = "SLURM_PROCID", world_var = "SLURM_NTASKS", local_var = "SLURM_LOCALID";
  int has_rank = env_int(rank_var, &e->rank), has_world = env_int(world_var, &e->world);
  if (has_rank < 0) return set_err(err, errlen, "%s: expected a rank number, got '%s'", rank_var, getenv(rank_var));
  if (has_world < 0 || e->world < 1)
    return set_err(err, errlen, "%s: expected a positive number, got '%s'", world_var, getenv(world_var));
  if (has_rank && !has_world) return set_err(err, errlen, "%s is set but %s is not", rank_var, world_var);
  if (e->rank >= e->world)
    return set_err(err, errlen, "%s=%d is not below %s=%d", rank_var, e->rank, world_var, e->world);
  if (env_int(local_var, &e->local_rank) < 0)
    return set_err(err, errlen, "%s: expected a number, got '%s'", local_var, getenv(local_var));
  const char *addr = getenv("MASTER_ADDR");
  if (addr && *addr) snprintf(e->master_addr, sizeof e->master_addr, "%s", addr);
  if (env_int("MASTER_PORT", &e->master_port) < 0 || e->master_port > 65535)
    return set_err(err, errlen, "MASTER_PORT: expected a port number, got '%s'", getenv("MASTER_PORT"));
  return 0;
}

void comm_shard_range(size_t n, int world, int rank, size_t *lo, size_t *hi) {
  size_t q = n / (size_t)world;
  *lo = q * (size_t)rank;
  *hi = rank == world - 1 ? n : *lo + q;
}

int comm_shard_owner(size_t n, int world, size_t i) {
  size_t q = n / (size_t)world;
  if (q == 0) return world - 1;
  size_t r = i / q;
  return r >= (size_t)world ? world - 1 : (int)r;
}

size_t comm_shard_piece(size_t n, int world, size_t a, size_t end, int *owner) {
  size_t lo, hi;
  *owner = comm_shard_owner(n, world, a);
  comm_shard_range(n, world, *owner, &lo, &hi);
  return hi < end ? hi : end;
}

int comm_rank(const Comm *c) { return c->rank; }
int comm_world(const Comm *c) { return c->world; }
int comm_local_rank(const Comm *c) { return c->local_rank; }

// ---- sockets with deadlines -----------------------------------------------------------------

// Waits until fd is ready for events; dies after timeout_s without progress.
static void wait_fd(const Comm *c, int fd, short events, int peer, const char *what) {
  struct pollfd p = {fd, events, 0};
  int ms = c->timeout_s * 1000 > 2e9 ? 2000000000 : (int)(c->timeout_s * 1000);
  for (;;) {
    int r = poll(&p, 1, ms);
    if (r > 0) return;
    if (r == 0 && peer < 0)
      die("comm: rank %d: not every rank connected within %g s during %s (parallel.timeout_s)", c->rank, c->timeout_s,
          what);
    if (r == 0)
      die("comm: rank %d: no progress from rank %d for %g s during %s (parallel.timeout_s): is it alive?", c->rank,
          peer, c->timeout_s, what);
    if (errno != EINTR)
      die("comm: rank %d: poll on rank %d failed during %s: %s", c->rank, peer, what, strerror(errno));
  }
}

// The socket to peer: rank 0 has one per peer, the others only the one to rank 0.
static int fd_of(const Comm *c, int peer) { return c->fd[c->rank == 0 ? peer : 0]; }

static void send_fd(const Comm *c, int fd, int peer, const void *buf, size_t len, const char *what) {
  const char *p = buf;
  while (len > 0) {
    wait_fd(c, fd, POLLOUT, peer, what);
    ssize_t k = send(fd, p, len, MSG_NOSIGNAL);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0)
      die("comm: rank %d: lost the connection to rank %d during %s: %s (did it exit?)", c->rank, peer, what,
          strerror(errno));
    p += k, len -= (size_t)k;
  }
}

static void recv_fd(const Comm *c, int fd, int peer, void *buf, size_t len, const char *what) {
  char *p = buf;
  while (len > 0) {
    wait_fd(c, fd, POLLIN, peer, what);
    ssize_t k = recv(fd, p, len, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k == 0 && peer < 0) die("comm: rank %d: a connecting process hung up during %s", c->rank, what);
    if (k == 0)
      die("comm: rank %d: rank %d closed the connection during %s (it exited or was killed)", c->rank, peer, what);
    if (k < 0) die("comm: rank %d: lost the connection to rank %d during %s: %s", c->rank, peer, what, strerror(errno));
    p += k, len -= (size_t)k;
  }
}

static void send_all(const Comm *c, int peer, const void *buf, size_t len, const char *what) {
  send_fd(c, fd_of(c, peer), peer, buf, len, what);
}

static void recv_all(const Comm *c, int peer, void *buf, size_t len, const char *what) {
  recv_fd(c, fd_of(c, peer), peer, buf, len, what);
}

static void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int comm_tcp_dead_peer(const Comm *c) {
  if (c->world == 1) return -1;
  for (int r = 0; r < c->world; r++) {
    int fd = c->fd[r], peer = c->rank == 0 ? r : 0;
    if (fd < 0) continue;
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) continue;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return peer;
    char b;  // readable: data (a peer ahead of us; left in place) or the end of the stream
    ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return peer;
  }
  return -1;
}

// ---- rendezvous -----------------------------------------------------------------------------

typedef struct {
  int32_t magic, rank, world;
} Hello;

// This machine's name for the other ranks: its host name when that resolves here (a machine whose
// /etc/hosts and DNS do not know it would publish a name nobody can reach), else the first IPv4
// address of an interface that is up and not loopback, else 127.0.0.1 (one machine).
static void own_address(char *host, size_t len) {
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
  if (!gethostname(host, len)) {
    host[len - 1] = 0;
    if (!getaddrinfo(host, NULL, &hints, &res)) {
      freeaddrinfo(res);
      return;
    }
  }
  snprintf(host, len, "127.0.0.1");
  struct ifaddrs *ifs;
  if (getifaddrs(&ifs)) return;
  for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK)) {
      inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, host, (socklen_t)len);
      break;
    }
  freeifaddrs(ifs);
}

// file:PATH: rank 0's "host port", written to a temp file and renamed so readers never see half.
static void publish_address(const char *path, int port) {
  char host[256], tmp[4096];
  own_address(host, sizeof host);
  const char *addr = getenv("MASTER_ADDR");  // an explicit address wins over the host name
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) die("parallel.rendezvous: cannot write '%s': %s", tmp, strerror(errno));
  fprintf(f, "%s %d\n", addr && *addr ? addr : host, port);
  if (fclose(f) || rename(tmp, path)) die("parallel.rendezvous: cannot publish '%s': %s", path, strerror(errno));
}

static int read_address(const char *path, char *host, size_t hostlen, int *port) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[512];
  int ok = fgets(line, sizeof line, f) != NULL;
  fclose(f);
  char h[256];
  if (!ok || sscanf(line, "%255s %d", h, port) != 2) return -1;
  snprintf(host, hostlen, "%s", h);
  return 0;
}

static int connect_once(const char *host, int port) {
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
  if (getaddrinfo(host, ps, &hints, &res)) return -1;
  int fd = socket(res->ai_family, res->ai_socktype, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen)) close(fd), fd = -1;
  freeaddrinfo(res);
  return fd;
}

static void rendezvous_root(Comm *c, const CommEnv *e, const char *file) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  if (lfd < 0) die("comm: rank 0: socket: %s", strerror(errno));
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {
      .sin_family = AF_INET, .sin_port = htons(file ? 0 : e->master_port), .sin_addr.s_addr = INADDR_ANY};
  if (bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, c->world))
    die("comm: rank 0 cannot listen on port %d (MASTER_PORT): %s", e->master_port, strerror(errno));
  if (file) {
    socklen_t len = sizeof a;
    getsockname(lfd, (struct sockaddr *)&a, &len);
    publish_address(file, ntohs(a.sin_port));
  }
  for (int joined = 1; joined < c->world; joined++) {
    wait_fd(c, lfd, POLLIN, -1, "rendezvous");
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0) die("comm: rank 0: accept: %s", strerror(errno));
    set_nodelay(fd);
    Hello h;
    recv_fd(c, fd, -1, &h, sizeof h, "rendezvous handshake");
    if (h.magic != HELLO_MAGIC) die("comm: rank 0: a connection on port %d is not a rank of this job", e->master_port);
    if (h.world != c->world) die("comm: rank 0: rank %d has WORLD_SIZE=%d, rank 0 has %d", h.rank, h.world, c->world);
    if (h.rank < 1 || h.rank >= c->world || c->fd[h.rank] >= 0)
      die("comm: rank 0: two processes claim rank %d", h.rank);
    c->fd[h.rank] = fd;
  }
  close(lfd);
  Hello ack = {HELLO_MAGIC, 0, c->world};
  for (int r = 1; r < c->world; r++) send_all(c, r, &ack, sizeof ack, "rendezvous handshake");
}

static void rendezvous_peer(Comm *c, const CommEnv *e, const char *file) {
  double deadline = now_seconds() + c->timeout_s;
  char host[256];
  int port = e->master_port, fd = -1;
  while (fd < 0) {
    snprintf(host, sizeof host, "%s", e->master_addr);
    if (!file || read_address(file, host, sizeof host, &port) == 0) fd = connect_once(host, port);
    if (fd >= 0) break;
    if (now_seconds() > deadline) {
      if (file && access(file, F_OK) == 0)
        die("comm: rank %d: could not reach rank 0 at %s:%d (published in %s) within %g s (parallel.timeout_s)",
            c->rank, host, port, file, c->timeout_s);
      die("comm: rank %d: could not reach rank 0 at %s within %g s (parallel.timeout_s)", c->rank,
          file ? file : e->master_addr, c->timeout_s);
    }
    nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
  }
  set_nodelay(fd);
  c->fd[0] = fd;
  Hello h = {HELLO_MAGIC, c->rank, c->world};
  send_all(c, 0, &h, sizeof h, "rendezvous handshake");
  recv_all(c, 0, &h, sizeof h, "rendezvous handshake (waiting for every rank to join)");
  if (h.magic != HELLO_MAGIC || h.world != c->world)
    die("comm: rank %d: rank 0 at %s:%d answered with WORLD_SIZE=%d, this rank has %d", c->rank, host, port, h.world,
        c->world);
}

Comm *comm_init(const CommEnv *e, const char *rendezvous, double timeout_s, int device) {
  Comm *c = xcalloc(1, sizeof *c);
  c->rank = e->rank, c->world = e->world, c->local_rank = e->local_rank, c->timeout_s = timeout_s;
  c->fd = xmalloc((size_t)c->world * sizeof(int));
  for (int r = 0; r < c->world; r++) c->fd[r] = -1;
  if (c->world == 1) return c;
  const char *file = NULL;
  if (rendezvous && !strncmp(rendezvous, "file:", 5)) file = rendezvous + 5;
  else if (rendezvous && *rendezvous && strcmp(rendezvous, "env"))
    die("parallel.rendezvous: expected \"env\" or \"file:/path\", got '%s'", rendezvous);
  c->wire = xmalloc(CHUNK * sizeof(uint16_t));
  if (c->rank == 0) {
    c->scratch = xmalloc(CHUNK * sizeof(float));
    rendezvous_root(c, e, file);
  } else {
    rendezvous_peer(c, e, file);
  }
  // One rank on the CPU backend and another on a GPU would pick different transports and hang.
  double on_gpu = device;
  comm_allreduce_sum_f64(c, &on_gpu, 1);
  if (on_gpu != 0 && on_gpu != c->world)
    die("comm: rank %d: %g of the %d ranks run on a GPU, the others on the CPU: every rank must use the same "
        "backend (parallel.backend; check that each rank sees its GPU, LOCAL_RANK and CUDA_VISIBLE_DEVICES)",
        c->rank, on_gpu, c->world);
  if (device) {
#ifdef HAVE_CUDA
    c->nccl = comm_nccl_init(c, c->rank, c->world, timeout_s);
#else
    die("comm: device collectives need NCCL, but this build has no CUDA");
#endif
  }
  return c;
}

void comm_free(Comm *c) {
  if (!c) return;
#ifdef HAVE_CUDA
  if (c->nccl) comm_nccl_free(c->nccl);
#endif
  for (int r = 0; r < c->world; r++)
    if (c->fd[r] >= 0) close(c->fd[r]);
  free(c->fd);
  free(c->scratch);
  free(c->wire);
  free(c);
}

// ---- collectives ----------------------------------------------------------------------------

void comm_allreduce_sum_f64(Comm *c, double *x, int n) {
  if (c->world == 1) return;
  if (c->rank == 0) {
    double *in = xmalloc((size_t)n * sizeof(double));
    for (int r = 1; r < c->world; r++) {
      recv_all(c, r, in, (size_t)n * sizeof(double), "all-reduce");
      for (int i = 0; i < n; i++) x[i] += in[i];
    }
    free(in);
    for (int r = 1; r < c->world; r++) send_all(c, r, x, (size_t)n * sizeof(double), "all-reduce");
  } else {
    send_all(c, 0, x, (size_t)n * sizeof(double), "all-reduce");
    recv_all(c, 0, x, (size_t)n * sizeof(double), "all-reduce");
  }
}

void comm_allreduce_or_u64(Comm *c, uint64_t *x, size_t n) {
  if (c->world == 1) return;
  if (c->rank == 0) {
    uint64_t *in = xmalloc(n * sizeof(uint64_t));
    for (int r = 1; r < c->world; r++) {
      recv_all(c, r, in, n * sizeof(uint64_t), "all-reduce of the embedding rows");
      for (size_t i = 0; i < n; i++) x[i] |= in[i];
    }
    free(in);
    for (int r = 1; r < c->world; r++) send_all(c, r, x, n * sizeof(uint64_t), "all-reduce of the embedding rows");
  } else {
    send_all(c, 0, x, n * sizeof(uint64_t), "all-reduce of the embedding rows");
    recv_all(c, 0, x, n * sizeof(uint64_t), "all-reduce of the embedding rows");
  }
}

int comm_on_device(const Comm *c) {
#ifdef HAVE_CUDA
  return c->nccl != NULL;
#else
  (void)c;
  return 0;
#endif
}

// x[0..k) on the wire to peer: fp32, or BF16 bits (k <= CHUNK).
static void send_vals(Comm *c, int peer, const float *x, size_t k, CommDtype t, const char *what) {
  if (t == COMM_FP32) {
    send_all(c, peer, x, k * sizeof(float), what);
    return;
  }
  for (size_t i = 0; i < k; i++) c->wire[i] = comm_f32_to_bf16(x[i]);
  send_all(c, peer, c->wire, k * sizeof(uint16_t), what);
}

static void recv_vals(Comm *c, int peer, float *x, size_t k, CommDtype t, const char *what) {
  if (t == COMM_FP32) {
    recv_all(c, peer, x, k * sizeof(float), what);
    return;
  }
  recv_all(c, peer, c->wire, k * sizeof(uint16_t), what);
  for (size_t i = 0; i < k; i++) x[i] = comm_bf16_to_f32(c->wire[i]);
}

// Rank 0's part: adds the peers' values of x[0..k) into x, in rank order. BF16: x is rounded
// first, then each add is rounded to BF16, as NCCL's BF16 sum does.
static void add_peers(Comm *c, float *x, size_t k, CommDtype t, const char *what) {
  if (t == COMM_BF16)
    for (size_t i = 0; i < k; i++) x[i] = comm_bf16_to_f32(comm_f32_to_bf16(x[i]));
  for (int r = 1; r < c->world; r++) {
    recv_all(c, r, c->scratch, k * (t == COMM_BF16 ? sizeof(uint16_t) : sizeof(float)), what);
    if (t == COMM_FP32) {
      for (size_t i = 0; i < k; i++) x[i] += c->scratch[i];
    } else {
      const uint16_t *w = (const uint16_t *)c->scratch;
      for (size_t i = 0; i < k; i++) x[i] = comm_bf16_to_f32(comm_f32_to_bf16(x[i] + comm_bf16_to_f32(w[i])));
    }
  }
}

// The star: every peer sends its values of each range to rank 0 (chunk by chunk, so rank 0 needs
// one chunk of scratch and the peers' sends keep flowing), rank 0 sums them in rank order and
// sends each owner the sums that fall in its shard. The bits depend on nothing but the values.
static void tcp_reduce_ranges(Comm *c, float *buf, size_t n, const CommRange *rg, int nr, CommDtype t) {
  static const char *what = "reduce-scatter of the gradients";
  for (int i = 0; i < nr; i++)
    for (size_t a = rg[i].off, end = rg[i].off + rg[i].len; a < end; a += CHUNK) {
      size_t k = end - a < CHUNK ? end - a : CHUNK;
      if (c->rank == 0) add_peers(c, buf + a, k, t, what);
      else send_vals(c, 0, buf + a, k, t, what);
    }
  // The sums go out range by range, owner by owner; both sides walk the pieces in that order.
  for (int i = 0; i < nr; i++) {
    size_t a = rg[i].off, end = rg[i].off + rg[i].len;
    while (a < end) {
      int owner = comm_shard_owner(n, c->world, a);
      size_t lo, hi;
      comm_shard_range(n, c->world, owner, &lo, &hi);
      size_t b = hi < end ? hi : end;
      for (size_t x = a; owner != 0 && x < b; x += CHUNK) {
        size_t k = b - x < CHUNK ? b - x : CHUNK;
        if (c->rank == 0) send_vals(c, owner, buf + x, k, t, what);
        else if (c->rank == owner) recv_vals(c, 0, buf + x, k, t, what);
      }
      a = b;
    }
  }
}

void comm_reduce_ranges(Comm *c, float *buf, size_t n, const CommRange *r, int nr, CommDtype t) {
  if (c->world == 1 || nr == 0) return;
  for (int i = 0; i < nr; i++)
    if (r[i].off > n || r[i].len > n - r[i].off)
      die("comm_reduce_ranges: range [%zu, %zu) lies outside the buffer of %zu floats", r[i].off, r[i].off + r[i].len,
          n);
#ifdef HAVE_CUDA
  if (c->nccl) {
    comm_nccl_reduce_ranges(c->nccl, buf, n, r, nr, t);
    return;
  }
#endif
  tcp_reduce_ranges(c, buf, n, r, nr, t);
}

void comm_reduce_rows(Comm *c, float *buf, size_t n, size_t base, size_t row_len, const uint32_t *rows, int nrows,
                      CommDtype t) {
  if (c->world == 1 || nrows == 0) return;
#ifdef HAVE_CUDA
  if (c->nccl) {
    comm_nccl_reduce_rows(c->nccl, buf, n, base, row_len, rows, nrows, t);
    return;
  }
#endif
  CommRange *r = xmalloc((size_t)nrows * sizeof(CommRange));  // runs of consecutive rows
  int nr = 0;
  for (int i = 0; i < nrows; i++) {
    size_t off = base + (size_t)rows[i] * row_len;
    if (nr && r[nr - 1].off + r[nr - 1].len == off) r[nr - 1].len += row_len;
    else r[nr++] = (CommRange){off, row_len};
  }
  comm_reduce_ranges(c, buf, n, r, nr, t);
  free(r);
}

void comm_reduce_wait(Comm *c) {
#ifdef HAVE_CUDA
  if (c->nccl) comm_nccl_wait(c->nccl, "reduce-scatter of the gradients");
#else
  (void)c;  // TCP reductions are done when they return
#endif
}

void comm_reduce_scatter_sum(Comm *c, float *buf, size_t n, CommDtype t) {
  CommRange all = {0, n};
  comm_reduce_ranges(c, buf, n, &all, 1, t);
  comm_reduce_wait(c);
}

// Calls fn(ctx, off, len, owner) on every piece of the ranges (all of [0, n) when r is NULL), cut at
// shard boundaries: the same pieces in the same order on every rank.
static void each_piece(size_t n, int world, const CommRange *r, int nr, void (*fn)(void *, size_t, size_t, int),
                       void *ctx) {
  CommRange whole = {0, n};
  if (!r) r = &whole, nr = 1;
  for (int i = 0; i < nr; i++) {
    size_t a = r[i].off, end = r[i].off + r[i].len;
    while (a < end) {
      int owner;
      size_t b = comm_shard_piece(n, world, a, end, &owner);
      fn(ctx, a, b - a, owner);
      a = b;
    }
  }
}

typedef struct {
  Comm *c;
  const char *src;
  char *dst;
  size_t eb;
  int phase;  // 0: owners' pieces to rank 0, 1: rank 0's result to everyone
} GatherCtx;

static void gather_piece(void *ctx, size_t off, size_t len, int owner) {
  GatherCtx *g = ctx;
  Comm *c = g->c;
  size_t o = off * g->eb, k = len * g->eb;
  if (g->phase == 0) {
    if (owner == c->rank && g->src != g->dst) memcpy(g->dst + o, g->src + o, k);
    if (c->rank == 0 && owner != 0) recv_all(c, owner, g->dst + o, k, "all-gather of the parameters");
    if (c->rank != 0 && owner == c->rank) send_all(c, 0, g->src + o, k, "all-gather of the parameters");
  } else if (c->rank == 0) {
    for (int r = 1; r < c->world; r++) send_all(c, r, g->dst + o, k, "all-gather of the parameters");
  } else {
    recv_all(c, 0, g->dst + o, k, "all-gather of the parameters");
  }
}

// The all-gathers below, on either transport: elements of eb bytes; each piece of the ranges goes
// from its owner's src to every rank's dst (src == dst: in place). On NCCL, wait 0 leaves it queued.
static void gather_ex(Comm *c, const void *src, void *dst, size_t n, size_t eb, const CommRange *r, int nr, int wait) {
  if (c->world == 1) {
    // Nothing to exchange; a copy would need to know where the buffers live (host or device).
    if (src != dst) die("comm all-gather into another buffer with one rank: the caller copies (parallel/zero.c)");
    return;
  }
#ifdef HAVE_CUDA
  if (c->nccl) {
    comm_nccl_gather(c->nccl, src, dst, n, (int)eb, r, nr, wait);
    return;
  }
#endif
  (void)wait;
  GatherCtx g = {c, src, dst, eb, 0};
  each_piece(n, c->world, r, nr, gather_piece, &g);
  g.phase = 1;
  each_piece(n, c->world, r, nr, gather_piece, &g);
}

static void gather(Comm *c, const void *src, void *dst, size_t n, size_t eb, const CommRange *r, int nr) {
  gather_ex(c, src, dst, n, eb, r, nr, 1);
}

void comm_all_gather_bf16_stage(Comm *c, void *buf, size_t n, const CommRange *r, int nr, int stage) {
  if (c->world == 1) return;
  gather_ex(c, buf, buf, n, sizeof(uint16_t), r, nr, 0);
#ifdef HAVE_CUDA
  if (c->nccl) comm_nccl_stage_done(c->nccl, stage);
#else
  (void)stage;
#endif
}

void comm_stage_wait(Comm *c, int stage) {
#ifdef HAVE_CUDA
  if (c->nccl) comm_nccl_stage_wait(c->nccl, stage);
#else
  (void)c, (void)stage;
#endif
}

void comm_all_gather(Comm *c, float *buf, size_t n) { gather(c, buf, buf, n, sizeof(float), NULL, 0); }
void comm_all_gather_to(Comm *c, const float *src, float *dst, size_t n) {
  gather(c, src, dst, n, sizeof(float), NULL, 0);
}
void comm_all_gather_ranges(Comm *c, float *buf, size_t n, const CommRange *r, int nr) {
  gather(c, buf, buf, n, sizeof(float), r, nr);
}

void comm_broadcast_bytes(Comm *c, void *buf, size_t len) {
  if (c->world == 1) return;
  if (c->rank == 0)
    for (int r = 1; r < c->world; r++) send_all(c, r, buf, len, "broadcast");
  else recv_all(c, 0, buf, len, "broadcast");
}

void comm_barrier(Comm *c) {
  double x = 0;
  comm_allreduce_sum_f64(c, &x, 1);
}
