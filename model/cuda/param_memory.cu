// model/cuda/param_memory.cu: the fp32 parameter buffer of the CUDA backend as a reserved virtual address
// range backed by fixed-size physical chunks (see ops_cuda.h, param_memory_*). It starts fully
// mapped, like a cudaMalloc; ZeRO-1 master-weight sharding then unmaps every chunk that holds no
// float a rank keeps (its shard and the RMSNorm weights). Every pointer into the buffer keeps its
// address, so the graph's pointer arithmetic (tensor offsets, the BF16 shadow's index) is unchanged,
// while a stray read of a released float faults instead of reading stale values.
//
// The driver's virtual-memory calls come through cudaGetDriverEntryPointByVersion, so the build
// needs no libcuda at link time (the runtime finds the driver, as for everything else).
#include <cuda.h>
#include <string.h>

#include "common/common.h"
#include "model/cuda/ops_cuda.h"

typedef CUresult (*PFN_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*PFN_afree)(CUdeviceptr, size_t);
typedef CUresult (*PFN_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*PFN_release)(CUmemGenericAllocationHandle);
typedef CUresult (*PFN_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*PFN_unmap)(CUdeviceptr, size_t);
typedef CUresult (*PFN_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*PFN_gran)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);

static struct {
  PFN_reserve reserve;
  PFN_afree afree;
  PFN_create create;
  PFN_release release;
  PFN_map map;
  PFN_unmap unmap;
  PFN_access access;
  PFN_gran gran;
} drv;

static void *entry(const char *name) {
  void *fn = NULL;
  cudaDriverEntryPointQueryResult q;
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn)
    die("param memory: the CUDA driver has no %s (%s): the sharded parameter buffer needs the driver's virtual "
        "memory API (CUDA 11.2+ drivers)",
        name, cudaGetErrorString(e));
  return fn;
}

static void load_driver(void) {
  if (drv.reserve) return;
  drv.reserve = (PFN_reserve)entry("cuMemAddressReserve");
  drv.afree = (PFN_afree)entry("cuMemAddressFree");
  drv.create = (PFN_create)entry("cuMemCreate");
  drv.release = (PFN_release)entry("cuMemRelease");
  drv.map = (PFN_map)entry("cuMemMap");
  drv.unmap = (PFN_unmap)entry("cuMemUnmap");
  drv.access = (PFN_access)entry("cuMemSetAccess");
  drv.gran = (PFN_gran)entry("cuMemGetAllocationGranularity");
}

#define CU_CHECK(call)                                                                                \
  do {                                                                                                \
    CUresult r_ = (call);                                                                             \
    if (r_ != CUDA_SUCCESS) die("%s:%d: %s failed: CUresult %d", __FILE__, __LINE__, #call, (int)r_); \
  } while (0)

// One buffer: [base, base + nchunk * chunk) reserved, chunk i backed by handle[i] (0: released).
typedef struct {
  CUdeviceptr base;
  size_t bytes, chunk, nchunk, mapped;
  CUmemGenericAllocationHandle *handle;
} ParamMem;

// The buffers of one backend instance.
struct ParamMemory {
  ParamMem *v;
  int n, cap;
};

ParamMemory *param_memory_create(void) { return (ParamMemory *)xcalloc(1, sizeof(ParamMemory)); }

static CUmemAllocationProp chunk_prop(void) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  return prop;
}

static ParamMem *find(const ParamMemory *pm, const void *p) {
  for (int i = 0; i < pm->n; i++)
    if ((CUdeviceptr)p == pm->v[i].base) return &pm->v[i];
  return NULL;
}

void *param_memory_alloc(ParamMemory *pm, size_t bytes, size_t *mapped_out) {
  load_driver();
  CUmemAllocationProp prop = chunk_prop();
  size_t gran = 0;
  CU_CHECK(drv.gran(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  // 32 MiB chunks (the granularity for small buffers): a few hundred handles for an 8B model, and
  // at most a chunk of slack on each side of a rank's shard.
  size_t chunk = (size_t)32 << 20;
  if (bytes < chunk) chunk = (bytes + gran - 1) / gran * gran;
  if (chunk < gran) chunk = gran;
  chunk = (chunk + gran - 1) / gran * gran;
  ParamMem m = {0, bytes, chunk, (bytes + chunk - 1) / chunk, 0, NULL};
  if (!m.nchunk) m.nchunk = 1;
  m.handle = (CUmemGenericAllocationHandle *)xcalloc(m.nchunk, sizeof *m.handle);
  CU_CHECK(drv.reserve(&m.base, m.nchunk * chunk, 0, 0, 0));
  CUmemAccessDesc acc;
  memset(&acc, 0, sizeof acc);
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (size_t i = 0; i < m.nchunk; i++) {
    CUresult r = drv.create(&m.handle[i], chunk, &prop, 0);
    if (r != CUDA_SUCCESS) {
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      die("param memory: cuMemCreate of chunk %zu of %zu (%zu MiB each) for the fp32 parameters failed: CUresult %d; "
          "the device has %.3f GiB free of %.3f GiB",
          i, m.nchunk, chunk >> 20, (int)r, free_b / 1073741824.0, total_b / 1073741824.0);
    }
    CU_CHECK(drv.map(m.base + i * chunk, chunk, 0, m.handle[i], 0));
    CU_CHECK(drv.access(m.base + i * chunk, chunk, &acc, 1));
  }
  m.mapped = m.nchunk * chunk;
  pm->v = (ParamMem *)grow_array(pm->v, pm->n, &pm->cap, sizeof *pm->v);
  pm->v[pm->n++] = m;
  *mapped_out = m.mapped;
  return (void *)m.base;
}

int param_memory_owns(const ParamMemory *pm, const void *p) { return find(pm, p) != NULL; }

size_t param_memory_keep(ParamMemory *pm, void *p, const size_t *off, const size_t *len, int n) {
  ParamMem *m = find(pm, p);
  if (!m) die("param_memory_keep(%p): not a parameter buffer", p);
  CUDA_CHECK(cudaDeviceSynchronize());  // nothing queued may still touch a chunk about to go
  size_t released = 0;
  for (size_t c = 0; c < m->nchunk; c++) {
    if (!m->handle[c]) continue;
    size_t a = c * m->chunk, b = a + m->chunk;
    int keep = 0;
    for (int i = 0; i < n && !keep; i++) keep = len[i] && off[i] < b && off[i] + len[i] > a;
    if (keep) continue;
    CU_CHECK(drv.unmap(m->base + a, m->chunk));
    CU_CHECK(drv.release(m->handle[c]));
    m->handle[c] = 0;
    released += m->chunk;
  }
  m->mapped -= released;
  return released;
}

size_t param_memory_free(ParamMemory *pm, void *p) {
  ParamMem *m = find(pm, p);
  if (!m) die("param_memory_free(%p): not a parameter buffer", p);
  CUDA_CHECK(cudaDeviceSynchronize());
  size_t mapped = m->mapped;
  for (size_t c = 0; c < m->nchunk; c++)
    if (m->handle[c]) {
      CU_CHECK(drv.unmap(m->base + c * m->chunk, m->chunk));
      CU_CHECK(drv.release(m->handle[c]));
    }
  CU_CHECK(drv.afree(m->base, m->nchunk * m->chunk));
  free(m->handle);
  *m = pm->v[--pm->n];
  return mapped;
}
