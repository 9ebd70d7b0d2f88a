/*
 * fakecuda: a stand-in libcuda.so.1 for machines without GPUs (test support only). Internal header.
 *
 * The driver ABI subset here is declared from the public CUDA driver API documentation, on its own:
 * it shares nothing with csrc/libvgpu's declarations, so a mismatch between the two shows in tests.
 */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <stddef.h>
#include <stdint.h>

#include "profile.h"
#include "state.h"

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUlib_st *CUlibrary;
typedef struct CUfunc_st *CUkernel; /* a CUkernel is a CUfunction of a library's module (fakelibrary.c) */
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct {
    char bytes[16];
} CUuuid;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 904,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910,
    CUDA_ERROR_UNKNOWN = 999,
};

/* The special stream handles of cuda.h. */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

/* Object tags, so a stale or foreign handle is an error, not a crash. */
enum {
    TAG_CTX = 0x43545831,
    TAG_STREAM = 0x53545231,
    TAG_EVENT = 0x45564e31,
    TAG_MODULE = 0x4d4f4431,
    TAG_FUNC = 0x46554e31,
    TAG_GRAPH = 0x47524131,
    TAG_NODE = 0x4e4f4431,
    TAG_EXEC = 0x45584531,
    TAG_ARRAY = 0x41525231,
    TAG_MIPMAP = 0x4d495031,
    TAG_POOL = 0x504f4f31,
    TAG_LIBRARY = 0x4c494231,
};

struct CUctx_st {
    uint32_t tag;
    int ordinal;
    int primary;
    unsigned int flags;
    int refs; /* primary: retain count */
};

/* ---- fakecuda.c: init, devices, contexts ---- */

extern fake_profile fc_profile;
extern uint64_t fc_ns_per_block;

/* CUDA_SUCCESS once cuInit succeeded, else CUDA_ERROR_NOT_INITIALIZED. */
CUresult fc_ready(void);
/* NVML index of a CUDA ordinal (CUDA_VISIBLE_DEVICES applied), or -1. */
int fc_nvml_index(CUdevice ordinal);
/* The calling thread's current context, or NULL. */
CUcontext fc_current(void);
/* CUDA_SUCCESS with *ordinal the current context's device, or an error. */
CUresult fc_current_ordinal(int *ordinal);
/* Frees what the context owned (fakemem.c). */
void fc_mem_drop_context(CUcontext ctx);

/* ---- fakeexec.c: streams ---- */

/* Resolve a stream handle (NULL, LEGACY, PER_THREAD, or a created one) to its device and the time
 * its last kernel ends. ptsz: the _ptsz entry point was called (NULL means per-thread). */
typedef struct {
    int ordinal;
    uint64_t *end_ns;
    CUstream created; /* NULL for the default streams */
} fc_stream_ref;
CUresult fc_stream(CUstream h, int ptsz, fc_stream_ref *out);
/* When the work queued on stream `h` (resolved to *s) so far ends: what cuStreamSynchronize waits for. */
uint64_t fc_stream_done(CUstream h, int ptsz, const fc_stream_ref *s);
/* Sleep until the wall clock passes `end_ns`. */
void fc_wait_until(uint64_t end_ns);
/* cuStreamSynchronize of `h`: wait for its kernels (the legacy stream: all of this process's on the
 * device). CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED on a capturing stream. */
CUresult fc_stream_wait(CUstream h, int ptsz);
/* Is `h` a created stream that is capturing? */
int fc_stream_capturing(const fc_stream_ref *s);

/* ---- fakeexec.c: functions ---- */

/* Is `f` a function handle of a loaded module? */
int fc_valid_function(CUfunction f);
/* cuModuleLoadData without its current-context check (the library API loads context-free): a PTX
 * text, an ELF cubin or a fatbin; CUDA_ERROR_INVALID_IMAGE for anything else. */
CUresult fc_module_load(CUmodule *module, const void *image);

/* ---- fakemem.c ---- */

/* Is [ptr, ptr + bytes) inside one managed allocation of this process? */
int fc_mem_is_managed(CUdeviceptr ptr, size_t bytes);
/* *host: the host bytes of [ptr, ptr + bytes) inside one device, managed, host or registered
 * allocation (a device allocation's backing is mapped on first use). CUDA_ERROR_INVALID_VALUE when no
 * one allocation holds the range, CUDA_ERROR_OUT_OF_MEMORY when the backing cannot be mapped. */
CUresult fc_mem_bytes(CUdeviceptr ptr, size_t bytes, void **host);

/* ---- fakegraph.c: graphs ---- */

enum { NODE_KERNEL = 0, NODE_GRAPH = 4, NODE_EMPTY = 5 }; /* CUgraphNodeType */

/* CUDA_KERNEL_NODE_PARAMS (v1) and _v2 (adds the CUkernel and CUcontext; _v3 has its layout). */
typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void **kernelParams;
    void **extra;
} CUDA_KERNEL_NODE_PARAMS_v1;
typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void **kernelParams;
    void **extra;
    void *kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;
_Static_assert(sizeof(CUDA_KERNEL_NODE_PARAMS_v1) == 56, "CUDA_KERNEL_NODE_PARAMS layout");
_Static_assert(sizeof(CUDA_KERNEL_NODE_PARAMS_v2) == 72, "CUDA_KERNEL_NODE_PARAMS_v2 layout");

uint64_t fc_grid_blocks(unsigned int x, unsigned int y, unsigned int z);
/* Grid and block dimensions a launch accepts (block ≤ 1024 threads, z ≤ 64). */
int fc_valid_dims(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz);
CUgraph fc_graph_new(void);
/* A kernel node (params checked by the caller) after `after` (NULL: no dependency). */
CUgraphNode fc_graph_add_kernel(CUgraph g, const CUDA_KERNEL_NODE_PARAMS_v2 *p, CUgraphNode after);
/* 0 with the grid blocks one launch of `e` costs, or -1 for a bad handle. */
int fc_exec_blocks(CUgraphExec e, uint64_t *blocks);

/* ---- fakeprocs.c: the cuGetProcAddress table ---- */

typedef struct {
    const char *base;
    int version; /* the CUDA version this ABI variant appeared in */
    int ptsz;    /* 1: the per-thread default stream variant */
    const char *name;
    void *fn;
} fc_proc;
extern const fc_proc fc_procs[];

#endif
