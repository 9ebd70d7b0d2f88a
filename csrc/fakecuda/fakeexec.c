/*
 * fakecuda execution: streams, events, modules, kernel launches (graph launches included).
 *
 * A launch runs nothing. It costs grid blocks x FAKE_GPU_NS_PER_BLOCK ns of simulated device time,
 * queued on the device after every kernel already there (all processes, via the shared state), so
 * NVML's utilization is a rate that follows the launches. A stream remembers when its last kernel
 * ends; synchronizing sleeps until then, and events record that time. Launches on a capturing
 * stream add kernel nodes to its graph instead; a graph launch costs the blocks of all its kernel
 * nodes, child graphs included.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fakecuda.h"

void fc_wait_until(uint64_t end_ns) {
    struct timespec ts = {(time_t)(end_ns / 1000000000ull), (long)(end_ns % 1000000000ull)};
    while (fs_now_ns() < end_ns && clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* ---- streams ---- */

enum { CAPTURE_NONE = 0, CAPTURE_ACTIVE = 1 };

struct CUstream_st {
    uint32_t tag;
    int ordinal;
    CUcontext ctx;
    unsigned int flags;
    int priority;
    uint64_t end_ns;
    int capturing;
    uint64_t capture_id;
    CUgraph graph;
    CUgraphNode last; /* the capture's current dependency */
};

static uint64_t legacy_end[FAKE_MAX_GPUS];         /* the legacy default stream, per device */
static __thread uint64_t per_thread_end[FAKE_MAX_GPUS]; /* the per-thread default stream */
static uint64_t process_end[FAKE_MAX_GPUS];        /* the last kernel of this process */
static pthread_mutex_t exec_mutex = PTHREAD_MUTEX_INITIALIZER;
static uint64_t capture_ids;

CUresult fc_stream(CUstream h, int ptsz, fc_stream_ref *out) {
    CUresult rc = fc_ready();
    if (rc != CUDA_SUCCESS) return rc;
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        int ordinal;
        if ((rc = fc_current_ordinal(&ordinal)) != CUDA_SUCCESS) return rc;
        int per_thread = h == CU_STREAM_PER_THREAD || (h == NULL && ptsz);
        *out = (fc_stream_ref){ordinal, per_thread ? &per_thread_end[ordinal] : &legacy_end[ordinal], NULL};
        return CUDA_SUCCESS;
    }
    if (h->tag != TAG_STREAM) return CUDA_ERROR_INVALID_HANDLE;
    *out = (fc_stream_ref){h->ordinal, &h->end_ns, h};
    return CUDA_SUCCESS;
}

static CUresult stream_create(CUstream *ph, unsigned int flags, int priority) {
    int ordinal;
    CUresult rc = fc_current_ordinal(&ordinal);
    if (rc != CUDA_SUCCESS) return rc;
    if (ph == NULL || (flags & ~1u)) return CUDA_ERROR_INVALID_VALUE; /* CU_STREAM_NON_BLOCKING = 1 */
    CUstream s = calloc(1, sizeof *s);
    if (s == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *s = (struct CUstream_st){
        .tag = TAG_STREAM, .ordinal = ordinal, .ctx = fc_current(), .flags = flags, .priority = priority};
    *ph = s;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) { return stream_create(phStream, Flags, 0); }
EXPORT CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
    return stream_create(phStream, flags, priority);
}

EXPORT CUresult cuStreamDestroy_v2(CUstream h) {
    CUresult rc = fc_ready();
    if (rc != CUDA_SUCCESS) return rc;
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD || h->tag != TAG_STREAM)
        return CUDA_ERROR_INVALID_HANDLE;
    h->tag = 0;
    free(h);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamDestroy(CUstream h) { return cuStreamDestroy_v2(h); }

static void note_end(fc_stream_ref *s, uint64_t end) {
    pthread_mutex_lock(&exec_mutex);
    if (end > *s->end_ns) *s->end_ns = end;
    if (end > process_end[s->ordinal]) process_end[s->ordinal] = end;
    if (end > legacy_end[s->ordinal] && s->created == NULL) legacy_end[s->ordinal] = end;
    pthread_mutex_unlock(&exec_mutex);
}

int fc_stream_capturing(const fc_stream_ref *s) { return s->created && s->created->capturing; }

uint64_t fc_stream_done(CUstream h, int ptsz, const fc_stream_ref *s) {
    /* the legacy stream also waits for the other streams' work */
    return s->created == NULL && !ptsz && h != CU_STREAM_PER_THREAD ? process_end[s->ordinal] : *s->end_ns;
}

CUresult fc_stream_wait(CUstream h, int ptsz) {
    fc_stream_ref s;
    CUresult rc = fc_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS) return rc;
    if (s.created && s.created->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    fc_wait_until(fc_stream_done(h, ptsz, &s));
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize(CUstream h) { return fc_stream_wait(h, 0); }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream h) { return fc_stream_wait(h, 1); }

/* Waits until every kernel of this process on the current device has run. */
EXPORT CUresult cuCtxSynchronize(void) {
    int ordinal;
    CUresult rc = fc_current_ordinal(&ordinal);
    if (rc == CUDA_SUCCESS) fc_wait_until(process_end[ordinal]);
    return rc;
}

/* The stream's context: the one current at its creation; the default streams': the current one. */
static CUresult stream_ctx(CUstream h, CUcontext *pctx, void **pgreen, int ptsz) {
    fc_stream_ref s;
    CUresult rc = fc_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS) return rc;
    if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    *pctx = s.created ? s.created->ctx : fc_current();
    if (pgreen) *pgreen = NULL; /* no green contexts here */
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamGetCtx(CUstream h, CUcontext *pctx) { return stream_ctx(h, pctx, NULL, 0); }
EXPORT CUresult cuStreamGetCtx_ptsz(CUstream h, CUcontext *pctx) { return stream_ctx(h, pctx, NULL, 1); }
EXPORT CUresult cuStreamGetCtx_v2(CUstream h, CUcontext *pctx, void **pGreenCtx) {
    return stream_ctx(h, pctx, pGreenCtx, 0);
}
EXPORT CUresult cuStreamGetCtx_v2_ptsz(CUstream h, CUcontext *pctx, void **pGreenCtx) {
    return stream_ctx(h, pctx, pGreenCtx, 1);
}

static CUresult stream_query(CUstream h, int ptsz) {
    fc_stream_ref s;
    CUresult rc = fc_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS) return rc;
    return fs_now_ns() >= *s.end_ns ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
EXPORT CUresult cuStreamQuery(CUstream h) { return stream_query(h, 0); }
EXPORT CUresult cuStreamQuery_ptsz(CUstream h) { return stream_query(h, 1); }

typedef struct CUevent_st *CUevent_t;
struct CUevent_st {
    uint32_t tag;
    unsigned int flags;
    int recorded;
    uint64_t at_ns; /* when the work before it ends */
};

static CUresult stream_wait_event(CUstream h, CUevent e, unsigned int flags, int ptsz) {
    fc_stream_ref s;
    CUresult rc = fc_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS) return rc;
    if (e == NULL || e->tag != TAG_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (e->recorded) note_end(&s, e->at_ns);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamWaitEvent(CUstream h, CUevent e, unsigned int Flags) { return stream_wait_event(h, e, Flags, 0); }
EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream h, CUevent e, unsigned int Flags) {
    return stream_wait_event(h, e, Flags, 1);
}

/* ---- events ---- */

EXPORT CUresult cuEventCreate(CUevent *ph, unsigned int Flags) {
    CUresult rc = fc_ready();
    if (rc != CUDA_SUCCESS) return rc;
    if (ph == NULL || (Flags & ~0xFu)) return CUDA_ERROR_INVALID_VALUE;
    CUevent e = calloc(1, sizeof *e);
    if (e == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *e = (struct CUevent_st){TAG_EVENT, Flags, 0, 0};
    *ph = e;
    return CUDA_SUCCESS;
}

static CUresult event_record(CUevent e, CUstream h, int ptsz) {
    fc_stream_ref s;
    CUresult rc = fc_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS) return rc;
    if (e == NULL || e->tag != TAG_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = fs_now_ns(), end = *s.end_ns;
    if (s.created == NULL && !ptsz && h != CU_STREAM_PER_THREAD) end = process_end[s.ordinal];
    e->at_ns = end > now ? end : now;
    e->recorded = 1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream h) { return event_record(e, h, 0); }
EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream h) { return event_record(e, h, 1); }

EXPORT CUresult cuEventQuery(CUevent e) {
    if (e == NULL || e->tag != TAG_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    return !e->recorded || fs_now_ns() >= e->at_ns ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuEventSynchronize(CUevent e) {
    if (e == NULL || e->tag != TAG_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    if (e->recorded) fc_wait_until(e->at_ns);
    return CUDA_SUCCESS;
}

/* Milliseconds between two completed events; NOT_READY while either is pending. */
EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    if (ms == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (start == NULL || end == NULL || start->tag != TAG_EVENT || end->tag != TAG_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!start->recorded || !end->recorded || (start->flags & 2) || (end->flags & 2)) /* CU_EVENT_DISABLE_TIMING */
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = fs_now_ns();
    if (now < start->at_ns || now < end->at_ns) return CUDA_ERROR_NOT_READY;
    /* the difference first: nanoseconds since 1970 are past a double's precision */
    *ms = (float)((double)(int64_t)(end->at_ns - start->at_ns) / 1e6);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent e) {
    if (e == NULL || e->tag != TAG_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    e->tag = 0;
    free(e);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy(CUevent e) { return cuEventDestroy_v2(e); }

/* ---- modules ---- */

struct CUmod_st {
    uint32_t tag;
    char *ptx; /* PTX text; NULL for a binary image, whose function names the fake cannot read */
};

struct CUfunc_st {
    uint32_t tag;
    CUmodule module;
    unsigned int block[3]; /* cuFuncSetBlockShape, for cuLaunch / cuLaunchGrid */
    char name[];
};

int fc_valid_function(CUfunction f) { return f != NULL && f->tag == TAG_FUNC; }

CUresult fc_module_load(CUmodule *module, const void *image) {
    CUresult rc = fc_ready();
    if (rc != CUDA_SUCCESS) return rc;
    if (module == NULL || image == NULL) return CUDA_ERROR_INVALID_VALUE;
    const unsigned char *b = image;
    uint32_t magic;
    memcpy(&magic, b, sizeof magic);
    int binary = memcmp(b, "\x7f" "ELF", 4) == 0 || magic == 0xBA55ED50u || magic == 0x466243B1u;
    if (!binary && !(strstr(image, ".version") && strstr(image, ".target"))) return CUDA_ERROR_INVALID_IMAGE;
    CUmodule m = calloc(1, sizeof *m);
    if (m == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    m->tag = TAG_MODULE;
    if (!binary && (m->ptx = strdup(image)) == NULL) {
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *module = m;
    return CUDA_SUCCESS;
}

/* A NUL-terminated PTX text (".version" and ".target"), an ELF cubin, or a fatbin. */
EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    CUresult rc = fc_ready();
    if (rc != CUDA_SUCCESS) return rc;
    if (fc_current() == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    return fc_module_load(module, image);
}

EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions, void *options,
                                   void **optionValues) {
    (void)numOptions, (void)options, (void)optionValues; /* JIT options: nothing to compile */
    return cuModuleLoadData(module, image);
}

EXPORT CUresult cuModuleUnload(CUmodule m) {
    if (m == NULL || m->tag != TAG_MODULE) return CUDA_ERROR_INVALID_HANDLE;
    m->tag = 0;
    free(m->ptx);
    free(m);
    return CUDA_SUCCESS;
}

/* Is `name` a kernel (".entry name") of the PTX text? */
static int ptx_has_entry(const char *ptx, const char *name) {
    size_t n = strlen(name);
    for (const char *p = strstr(ptx, ".entry"); p; p = strstr(p + 6, ".entry")) {
        const char *q = p + 6;
        while (*q == ' ' || *q == '\t') q++;
        if (strncmp(q, name, n) == 0 && (q[n] == '(' || q[n] == ' ' || q[n] == '\t' || q[n] == '\n' || q[n] == '\r'))
            return 1;
    }
    return 0;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule m, const char *name) {
    if (hfunc == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (m == NULL || m->tag != TAG_MODULE) return CUDA_ERROR_INVALID_HANDLE;
    if (m->ptx && !ptx_has_entry(m->ptx, name)) return CUDA_ERROR_NOT_FOUND;
    CUfunction f = calloc(1, sizeof *f + strlen(name) + 1);
    if (f == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    f->tag = TAG_FUNC;
    f->module = m;
    f->block[0] = f->block[1] = f->block[2] = 1;
    strcpy(f->name, name);
    *hfunc = f;
    return CUDA_SUCCESS;
}

/* ---- launches ---- */

static CUresult run(fc_stream_ref *s, uint64_t blocks) {
    uint64_t end = fs_launch((unsigned)fc_nvml_index(s->ordinal), blocks * fc_ns_per_block);
    note_end(s, end);
    return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned shared, CUstream h, void **params, void **extra, int ptsz) {
    fc_stream_ref s;
    CUresult rc = fc_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS) return rc;
    if (f == NULL || f->tag != TAG_FUNC) return CUDA_ERROR_INVALID_HANDLE;
    if (!fc_valid_dims(gx, gy, gz, bx, by, bz)) return CUDA_ERROR_INVALID_VALUE;
    if (s.created && s.created->capturing) {
        CUstream cs = s.created;
        CUDA_KERNEL_NODE_PARAMS_v2 p = {f, gx, gy, gz, bx, by, bz, shared, params, extra, NULL, NULL};
        CUgraphNode n = fc_graph_add_kernel(cs->graph, &p, cs->last);
        if (n == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        cs->last = n;
        return CUDA_SUCCESS;
    }
    return run(&s, fc_grid_blocks(gx, gy, gz));
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                               unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                               unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra) {
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                  kernelParams, extra, 0);
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                    unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                    unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                    void **kernelParams, void **extra) {
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                  kernelParams, extra, 1);
}

/* CUlaunchConfig: the grid, block, shared memory, stream and launch attributes. */
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;
_Static_assert(sizeof(CUlaunchConfig) == 56, "CUlaunchConfig layout");

static CUresult launch_ex(const CUlaunchConfig *c, CUfunction f, void **params, void **extra, int ptsz) {
    if (c == NULL || (c->numAttrs > 0 && c->attrs == NULL)) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                  c->sharedMemBytes, c->hStream, params, extra, ptsz);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    return launch_ex(config, f, kernelParams, extra, 0);
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    return launch_ex(config, f, kernelParams, extra, 1);
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                          unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                          unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                          void **kernelParams) {
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                  kernelParams, NULL, 0);
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                               unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                               unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                               void **kernelParams) {
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                  kernelParams, NULL, 1);
}

/* CUDA_LAUNCH_PARAMS, one per device. */
typedef struct {
    CUfunction function;
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void **kernelParams;
} CUDA_LAUNCH_PARAMS;
_Static_assert(sizeof(CUDA_LAUNCH_PARAMS) == 56, "CUDA_LAUNCH_PARAMS layout");

EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned int numDevices,
                                                     unsigned int flags) {
    if (list == NULL || numDevices == 0 || (flags & ~3u)) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned int i = 0; i < numDevices; i++) {
        CUDA_LAUNCH_PARAMS *p = &list[i];
        CUresult rc = launch(p->function, p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX, p->blockDimY,
                             p->blockDimZ, p->sharedMemBytes, p->hStream, p->kernelParams, NULL, 0);
        if (rc != CUDA_SUCCESS) return rc;
    }
    return CUDA_SUCCESS;
}

/* The pre-4.0 launch API: block shape set on the function, grid given at launch. */
EXPORT CUresult cuFuncSetBlockShape(CUfunction f, int x, int y, int z) {
    if (f == NULL || f->tag != TAG_FUNC) return CUDA_ERROR_INVALID_HANDLE;
    if (x <= 0 || y <= 0 || z <= 0) return CUDA_ERROR_INVALID_VALUE;
    f->block[0] = (unsigned)x, f->block[1] = (unsigned)y, f->block[2] = (unsigned)z;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream hStream) {
    if (f == NULL || f->tag != TAG_FUNC) return CUDA_ERROR_INVALID_HANDLE;
    if (grid_width <= 0 || grid_height <= 0) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, (unsigned)grid_width, (unsigned)grid_height, 1, f->block[0], f->block[1], f->block[2], 0, hStream,
                  NULL, NULL, 0);
}
EXPORT CUresult cuLaunchGrid(CUfunction f, int grid_width, int grid_height) {
    return cuLaunchGridAsync(f, grid_width, grid_height, NULL);
}
EXPORT CUresult cuLaunch(CUfunction f) { return cuLaunchGridAsync(f, 1, 1, NULL); }

static CUresult graph_launch(CUgraphExec e, CUstream h, int ptsz) {
    fc_stream_ref s;
    CUresult rc = fc_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS) return rc;
    uint64_t blocks;
    if (fc_exec_blocks(e, &blocks) < 0) return CUDA_ERROR_INVALID_VALUE;
    if (s.created && s.created->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return run(&s, blocks);
}
EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream h) { return graph_launch(e, h, 0); }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream h) { return graph_launch(e, h, 1); }

/* ---- stream capture (created streams only) ---- */

static CUresult begin_capture(CUstream h, int mode, int ptsz) {
    fc_stream_ref s;
    CUresult rc = fc_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS) return rc;
    if (mode < 0 || mode > 2) return CUDA_ERROR_INVALID_VALUE;
    if (s.created == NULL) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (s.created->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    CUgraph g = fc_graph_new();
    if (g == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&exec_mutex);
    s.created->capture_id = ++capture_ids;
    pthread_mutex_unlock(&exec_mutex);
    s.created->graph = g;
    s.created->last = NULL;
    s.created->capturing = CAPTURE_ACTIVE;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamBeginCapture_v2(CUstream h, int mode) { return begin_capture(h, mode, 0); }
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream h, int mode) { return begin_capture(h, mode, 1); }
EXPORT CUresult cuStreamBeginCapture(CUstream h) { return begin_capture(h, 0, 0); }
EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream h) { return begin_capture(h, 0, 1); }

static CUresult end_capture(CUstream h, CUgraph *phGraph, int ptsz) {
    fc_stream_ref s;
    CUresult rc = fc_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS) return rc;
    if (phGraph == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (s.created == NULL || !s.created->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    *phGraph = s.created->graph;
    s.created->graph = NULL;
    s.created->last = NULL;
    s.created->capturing = CAPTURE_NONE;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamEndCapture(CUstream h, CUgraph *phGraph) { return end_capture(h, phGraph, 0); }
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream h, CUgraph *phGraph) { return end_capture(h, phGraph, 1); }

static CUresult is_capturing(CUstream h, int *status, int ptsz) {
    fc_stream_ref s;
    CUresult rc = fc_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS) return rc;
    if (status == NULL) return CUDA_ERROR_INVALID_VALUE;
    *status = s.created && s.created->capturing ? CAPTURE_ACTIVE : CAPTURE_NONE;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamIsCapturing(CUstream h, int *status) { return is_capturing(h, status, 0); }
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream h, int *status) { return is_capturing(h, status, 1); }

/* The _v3 form; the older ones are its prefixes. Dependencies: the last captured node. */
static CUresult capture_info(CUstream h, int *status, cuuint64_t *id, CUgraph *graph, const CUgraphNode **deps,
                             const void **edges, size_t *numDeps, int ptsz) {
    fc_stream_ref s;
    CUresult rc = fc_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS) return rc;
    if (status == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUstream c = s.created && s.created->capturing ? s.created : NULL;
    *status = c ? CAPTURE_ACTIVE : CAPTURE_NONE;
    if (id && c) *id = c->capture_id;
    if (graph) *graph = c ? c->graph : NULL;
    if (deps) *deps = c && c->last ? &c->last : NULL;
    if (edges) *edges = NULL;
    if (numDeps) *numDeps = c && c->last ? 1 : 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamGetCaptureInfo(CUstream h, int *status, cuuint64_t *id) {
    return capture_info(h, status, id, NULL, NULL, NULL, NULL, 0);
}
EXPORT CUresult cuStreamGetCaptureInfo_ptsz(CUstream h, int *status, cuuint64_t *id) {
    return capture_info(h, status, id, NULL, NULL, NULL, NULL, 1);
}
EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream h, int *status, cuuint64_t *id, CUgraph *graph,
                                          const CUgraphNode **deps, size_t *numDeps) {
    return capture_info(h, status, id, graph, deps, NULL, numDeps, 0);
}
EXPORT CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream h, int *status, cuuint64_t *id, CUgraph *graph,
                                               const CUgraphNode **deps, size_t *numDeps) {
    return capture_info(h, status, id, graph, deps, NULL, numDeps, 1);
}
EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream h, int *status, cuuint64_t *id, CUgraph *graph,
                                          const CUgraphNode **deps, const void **edgeData, size_t *numDeps) {
    return capture_info(h, status, id, graph, deps, edgeData, numDeps, 0);
}
EXPORT CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream h, int *status, cuuint64_t *id, CUgraph *graph,
                                               const CUgraphNode **deps, const void **edgeData, size_t *numDeps) {
    return capture_info(h, status, id, graph, deps, edgeData, numDeps, 1);
}
