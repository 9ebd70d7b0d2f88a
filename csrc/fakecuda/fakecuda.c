/*
 * fakecuda: a stand-in libcuda.so.1 for machines without GPUs (test support only).
 *
 * It serves the GPUs of the vgpud GPU profile that the fake NVML serves, and records what processes
 * do with them in the state both fakes share (csrc/fakestate), so NVML reports per pid what this
 * library allocated and launched:
 *
 *   FAKE_NVML_PROFILE=/path/profile.yaml  the GPUs (env mode; unset: kernel mode, below)
 *   FAKE_GPU_STATE=/path                  the shared state file (unset: private to the process)
 *   FAKE_GPU_NS_PER_BLOCK=N               simulated kernel time per grid block, ns (default 1000)
 *   CUDA_VISIBLE_DEVICES                  ordinals by CUDA index or (a unique prefix of) a GPU UUID,
 *                                         read at cuInit like the real driver's; enumeration is by
 *                                         PCI bus id, as the real one for identical GPUs
 *   FAKE_CUDA_TRACE=1                     one stderr line per cuGetExportTable call and per
 *                                         cuGetProcAddress lookup (what it returned)
 *
 * Kernel mode (csrc/fakestate/driver.h): without FAKE_NVML_PROFILE, a libcuda.so.1 in a driver root's
 * library directory gets the profile, the state and its caller's host pid from the fake kernel
 * (csrc/fakekernel) of that root, and sees only the GPUs whose device nodes the root has.
 *
 * This file: init, errors, devices, contexts, entry points. fakemem.c: memory; fakecopy.c: copies;
 * fakeexec.c: streams, events, modules, launches; fakelibrary.c: libraries, kernels and their
 * attributes; fakegraph.c: graphs; fakeprocs.c: the versioned entry point table.
 */
#include "fakecuda.h"
#include "driver.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

fake_profile fc_profile;
uint64_t fc_ns_per_block = 1000;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_rc;
static char load_why[640];

static pthread_mutex_t init_mutex = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static int forked_after_init; /* a fork child of an initialized process: the driver refuses it */
static int visible[FAKE_MAX_GPUS]; /* ordinal -> NVML index */
static int visible_count;

static struct CUctx_st primary[FAKE_MAX_GPUS];
static pthread_mutex_t ctx_mutex = PTHREAD_MUTEX_INITIALIZER;
static int contexts_on[FAKE_MAX_GPUS]; /* live contexts per ordinal, for NVML's process list */

#define CTX_STACK 16
static __thread CUcontext ctx_stack[CTX_STACK];
static __thread int ctx_depth;

static int tracing(void) {
    const char *t = getenv("FAKE_CUDA_TRACE");
    return t && strcmp(t, "1") == 0;
}

/* CUDA initialized before fork() is undefined behaviour in the child until it execs (NVIDIA's CUDA
 * C++ guidelines, 1.6), which real drivers typically fail; the fake fails it: every call there,
 * cuInit included, returns CUDA_ERROR_NOT_INITIALIZED. */
static void after_fork_child(void) {
    if (initialized) {
        initialized = 0;
        forked_after_init = 1;
    }
}

static void load(void) {
    pthread_atfork(NULL, NULL, after_fork_child);
    if (fs_driver_open(&fc_profile, load_why, sizeof load_why) < 0) {
        load_rc = -1;
        return;
    }
    const char *ns = getenv("FAKE_GPU_NS_PER_BLOCK");
    if (ns && ns[0] != '\0') {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(ns, &end, 10);
        if (errno || *end != '\0' || ns[0] < '0' || ns[0] > '9' || v > 1000000000ull) {
            snprintf(load_why, sizeof load_why, "FAKE_GPU_NS_PER_BLOCK=%.40s: not an integer 0..1000000000", ns);
            load_rc = -1;
            return;
        }
        fc_ns_per_block = v;
    }
}

static CUresult loaded(void) {
    pthread_once(&load_once, load);
    return load_rc == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult fc_ready(void) { return __atomic_load_n(&initialized, __ATOMIC_ACQUIRE) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED; }

int fc_nvml_index(CUdevice ordinal) {
    if (!initialized || ordinal < 0 || ordinal >= visible_count) return -1;
    return visible[ordinal];
}

static const fake_gpu *gpu_of(CUdevice ordinal) {
    int i = fc_nvml_index(ordinal);
    return i < 0 ? NULL : fc_profile.by_index[i];
}

/* ---- CUDA_VISIBLE_DEVICES ---- */

/* The present GPUs (all, but in kernel mode those with a device node) in PCI bus id order; then the
 * real driver stops at the first CUDA_VISIBLE_DEVICES entry it cannot use, and so does this. */
static void apply_visible_devices(void) {
    const fake_gpu *by_pci[FAKE_MAX_GPUS];
    int order[FAKE_MAX_GPUS], n = 0;
    fake_profile_pci_order(&fc_profile, by_pci);
    for (unsigned int i = 0; i < fc_profile.count; i++)
        if (fs_gpu_present(by_pci[i])) order[n++] = (int)by_pci[i]->index;
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    visible_count = 0;
    if (env == NULL) {
        for (int i = 0; i < n; i++) visible[visible_count++] = order[i];
        return;
    }
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", env);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        size_t len = strlen(tok);
        while (len > 0 && tok[len - 1] == ' ') tok[--len] = '\0';
        int found = -1;
        if (len > 0 && strspn(tok, "0123456789") == len) {
            long k = len < 4 ? strtol(tok, NULL, 10) : n;
            if (k < n) found = order[k];
        } else if (strncmp(tok, "GPU-", 4) == 0 && len > 4) {
            for (int i = 0; i < n; i++)
                if (strncmp(fc_profile.by_index[order[i]]->uuid, tok, len) == 0) {
                    if (found >= 0) return; /* ambiguous prefix */
                    found = order[i];
                }
        }
        if (found < 0) return;
        for (int i = 0; i < visible_count; i++)
            if (visible[i] == found) return; /* listed twice */
        visible[visible_count++] = found;
    }
}

/* ---- init, version, errors ---- */

EXPORT CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (forked_after_init) return CUDA_ERROR_NOT_INITIALIZED;
    if (loaded() != CUDA_SUCCESS) {
        fprintf(stderr, "fakecuda: %s\n", load_why);
        return CUDA_ERROR_UNKNOWN;
    }
    pthread_mutex_lock(&init_mutex);
    if (!initialized) {
        apply_visible_devices();
        for (int i = 0; i < visible_count; i++)
            primary[i] = (struct CUctx_st){TAG_CTX, i, 1, 0, 0};
        __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&init_mutex);
    return visible_count > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

EXPORT CUresult cuDriverGetVersion(int *version) {
    if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (loaded() != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
    *version = fc_profile.cuda;
    return CUDA_SUCCESS;
}

static const struct {
    CUresult code;
    const char *name, *text;
} errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {904, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not initiated in this stream"},
    {908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempted to end capture from a thread that did not begin it"},
    {910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
     "the graph update was not performed because it included changes which violated constraints specific "
     "to instantiated graph update"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

EXPORT CUresult cuGetErrorName(CUresult error, const char **name) {
    if (name == NULL) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == error) {
            *name = errors[i].name;
            return CUDA_SUCCESS;
        }
    *name = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult error, const char **text) {
    if (text == NULL) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == error) {
            *text = errors[i].text;
            return CUDA_SUCCESS;
        }
    *text = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- entry points ---- */

enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1,
};
typedef enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;

/*
 * The ABI variant of `symbol` (a base name) for `cudaVersion`: the newest one that version knows.
 * Per-thread flag: the _ptsz variant where the function has one. Not found, or only in newer
 * versions: CUDA_ERROR_NOT_FOUND with *pfn NULL and the status saying which.
 */
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *symbolStatus) {
    if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ||
        flags == (CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    if (loaded() != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
    if (cudaVersion > fc_profile.cuda) return CUDA_ERROR_INVALID_VALUE;
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const fc_proc *best = NULL, *best_legacy = NULL;
    int known = 0;
    for (const fc_proc *p = fc_procs; p->base; p++) {
        if (strcmp(p->base, symbol) != 0) continue;
        known = 1;
        if (p->version > cudaVersion) continue;
        const fc_proc **slot = p->ptsz ? &best : &best_legacy;
        if (*slot == NULL || p->version > (*slot)->version) *slot = p;
    }
    /* the per-thread variant of the chosen version, else the legacy one */
    const fc_proc *pick = best_legacy;
    if (want_ptsz && best && (best_legacy == NULL || best->version >= best_legacy->version)) pick = best;
    if (pick == NULL) {
        *pfn = NULL;
        if (symbolStatus)
            *symbolStatus = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        if (tracing())
            fprintf(stderr, "fakecuda: cuGetProcAddress(\"%s\", %d, %llu): %s\n", symbol, cudaVersion,
                    (unsigned long long)flags, known ? "version not sufficient" : "not found");
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = pick->fn;
    if (symbolStatus) *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
    if (tracing())
        fprintf(stderr, "fakecuda: cuGetProcAddress(\"%s\", %d, %llu) = %s\n", symbol, cudaVersion,
                (unsigned long long)flags, pick->name);
    return CUDA_SUCCESS;
}

/* The CUDA 11.3 form, without the status. */
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}

/* The driver's private tables are not public: none is served. Traced, to see who asks. */
EXPORT CUresult cuGetExportTable(const void **table, const CUuuid *id) {
    if (table == NULL || id == NULL) return CUDA_ERROR_INVALID_VALUE;
    *table = NULL;
    if (tracing()) {
        const unsigned char *b = (const unsigned char *)id->bytes;
        fprintf(stderr,
                "fakecuda: cuGetExportTable(%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x)\n",
                b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    }
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- devices ---- */

#define REQUIRE_READY()                                                                            \
    do {                                                                                           \
        CUresult rc_ = fc_ready();                                                                 \
        if (rc_ != CUDA_SUCCESS) return rc_;                                                       \
    } while (0)

EXPORT CUresult cuDeviceGetCount(int *count) {
    REQUIRE_READY();
    if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
    *count = visible_count;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    REQUIRE_READY();
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= visible_count) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    REQUIRE_READY();
    const fake_gpu *g = gpu_of(dev);
    if (g == NULL) return CUDA_ERROR_INVALID_DEVICE;
    if (name == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", g->name); /* truncates, as the driver does */
    return CUDA_SUCCESS;
}

static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    REQUIRE_READY();
    const fake_gpu *g = gpu_of(dev);
    if (g == NULL) return CUDA_ERROR_INVALID_DEVICE;
    if (uuid == NULL) return CUDA_ERROR_INVALID_VALUE;
    memset(uuid, 0, sizeof *uuid);
    const char *s = g->uuid + 4; /* after "GPU-" */
    for (int k = 0; k < 16 && *s;) {
        if (*s == '-') {
            s++;
            continue;
        }
        int hi = hex(s[0]), lo = s[1] ? hex(s[1]) : -1;
        if (hi < 0 || lo < 0) break;
        uuid->bytes[k++] = (char)(hi << 4 | lo);
        s += 2;
    }
    return CUDA_SUCCESS;
}

/* The same UUID: the two differ only for MIG instances, which the fake has none of. */
EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    REQUIRE_READY();
    const fake_gpu *g = gpu_of(dev);
    if (g == NULL) return CUDA_ERROR_INVALID_DEVICE;
    if (bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
    *bytes = g->memory;
    return CUDA_SUCCESS;
}

/* The 32-bit form: saturates at 4 GiB - 1. */
EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    size_t total;
    CUresult rc = cuDeviceTotalMem_v2(bytes ? &total : NULL, dev);
    if (rc == CUDA_SUCCESS) *bytes = total > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)total;
    return rc;
}

EXPORT CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev) {
    REQUIRE_READY();
    const fake_gpu *g = gpu_of(dev);
    if (g == NULL) return CUDA_ERROR_INVALID_DEVICE;
    if (major == NULL || minor == NULL) return CUDA_ERROR_INVALID_VALUE;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetPCIBusId(char *busId, int len, CUdevice dev) {
    REQUIRE_READY();
    const fake_gpu *g = gpu_of(dev);
    if (g == NULL) return CUDA_ERROR_INVALID_DEVICE;
    if (busId == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(busId, (size_t)len, "%04x:%02x:%02x.0", g->pci.domain, g->pci.bus, g->pci.device);
    return CUDA_SUCCESS;
}

/* CUdevice_attribute values (cuda.h) that the fake answers; others in range read 0. */
enum {
    ATTR_MAX_THREADS_PER_BLOCK = 1,
    ATTR_MAX_BLOCK_DIM_X = 2,
    ATTR_MAX_BLOCK_DIM_Y = 3,
    ATTR_MAX_BLOCK_DIM_Z = 4,
    ATTR_MAX_GRID_DIM_X = 5,
    ATTR_MAX_GRID_DIM_Y = 6,
    ATTR_MAX_GRID_DIM_Z = 7,
    ATTR_MAX_SHARED_MEMORY_PER_BLOCK = 8,
    ATTR_WARP_SIZE = 10,
    ATTR_MULTIPROCESSOR_COUNT = 16,
    ATTR_CAN_MAP_HOST_MEMORY = 19,
    ATTR_PCI_BUS_ID = 33,
    ATTR_PCI_DEVICE_ID = 34,
    ATTR_MAX_THREADS_PER_MULTIPROCESSOR = 39,
    ATTR_UNIFIED_ADDRESSING = 41,
    ATTR_PCI_DOMAIN_ID = 50,
    ATTR_COMPUTE_CAPABILITY_MAJOR = 75,
    ATTR_COMPUTE_CAPABILITY_MINOR = 76,
    ATTR_MANAGED_MEMORY = 83,
    ATTR_CONCURRENT_MANAGED_ACCESS = 89,
    ATTR_COOPERATIVE_LAUNCH = 95,
    ATTR_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    ATTR_MAX_BLOCKS_PER_MULTIPROCESSOR = 106,
    ATTR_MEMORY_POOLS_SUPPORTED = 115,
    ATTR_MAX = 150, /* above every attribute of CUDA 13 */
};

EXPORT CUresult cuDeviceGetAttribute(int *value, int attrib, CUdevice dev) {
    REQUIRE_READY();
    const fake_gpu *g = gpu_of(dev);
    if (g == NULL) return CUDA_ERROR_INVALID_DEVICE;
    if (value == NULL || attrib <= 0 || attrib >= ATTR_MAX) return CUDA_ERROR_INVALID_VALUE;
    int v = 0;
    switch (attrib) {
    case ATTR_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case ATTR_MAX_BLOCK_DIM_X: case ATTR_MAX_BLOCK_DIM_Y: v = 1024; break;
    case ATTR_MAX_BLOCK_DIM_Z: v = 64; break;
    case ATTR_MAX_GRID_DIM_X: v = 0x7FFFFFFF; break;
    case ATTR_MAX_GRID_DIM_Y: case ATTR_MAX_GRID_DIM_Z: v = 65535; break;
    case ATTR_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
    case ATTR_WARP_SIZE: v = 32; break;
    case ATTR_MULTIPROCESSOR_COUNT: v = (int)fake_gpu_sm_count(g); break;
    case ATTR_MAX_THREADS_PER_MULTIPROCESSOR: v = (int)fake_gpu_threads_per_sm(g); break;
    case ATTR_PCI_BUS_ID: v = (int)g->pci.bus; break;
    case ATTR_PCI_DEVICE_ID: v = (int)g->pci.device; break;
    case ATTR_PCI_DOMAIN_ID: v = (int)g->pci.domain; break;
    case ATTR_COMPUTE_CAPABILITY_MAJOR: v = g->cc_major; break;
    case ATTR_COMPUTE_CAPABILITY_MINOR: v = g->cc_minor; break;
    case ATTR_MAX_BLOCKS_PER_MULTIPROCESSOR: v = 32; break;
    case ATTR_CAN_MAP_HOST_MEMORY: case ATTR_UNIFIED_ADDRESSING: case ATTR_MANAGED_MEMORY:
    case ATTR_CONCURRENT_MANAGED_ACCESS: case ATTR_COOPERATIVE_LAUNCH:
    case ATTR_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: case ATTR_MEMORY_POOLS_SUPPORTED: v = 1; break;
    default: v = 0;
    }
    *value = v;
    return CUDA_SUCCESS;
}

/* ---- contexts ---- */

CUcontext fc_current(void) { return ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL; }

static int valid_ctx(CUcontext c);

CUresult fc_current_ordinal(int *ordinal) {
    REQUIRE_READY();
    CUcontext c = fc_current();
    if (!valid_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT; /* none, or destroyed by another thread */
    *ordinal = c->ordinal;
    return CUDA_SUCCESS;
}

static int valid_ctx(CUcontext c) { return c != NULL && c->tag == TAG_CTX && (!c->primary || c->refs > 0); }

/* A context came or went on a device: NVML lists the pid while it has one. Under ctx_mutex. */
static void context_count(int ordinal, int delta) {
    contexts_on[ordinal] += delta;
    if (delta > 0 && contexts_on[ordinal] == 1) fs_context((unsigned)visible[ordinal], 1);
    if (delta < 0 && contexts_on[ordinal] == 0) fs_context((unsigned)visible[ordinal], 0);
}

/* Drop a destroyed context from this thread's stack (other threads keep a stale handle, which
 * valid_ctx then refuses, as the driver does with CUDA_ERROR_INVALID_CONTEXT). */
static void unstack(CUcontext c) {
    int k = 0;
    for (int i = 0; i < ctx_depth; i++)
        if (ctx_stack[i] != c) ctx_stack[k++] = ctx_stack[i];
    ctx_depth = k;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    REQUIRE_READY();
    if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (gpu_of(dev) == NULL) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&ctx_mutex);
    if (primary[dev].refs++ == 0) context_count(dev, +1);
    pthread_mutex_unlock(&ctx_mutex);
    *pctx = &primary[dev];
    return CUDA_SUCCESS;
}

/* The last release destroys the primary context and everything allocated in it. */
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    REQUIRE_READY();
    if (gpu_of(dev) == NULL) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&ctx_mutex);
    CUresult rc = CUDA_SUCCESS;
    int destroyed = 0;
    if (primary[dev].refs == 0) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--primary[dev].refs == 0) {
        fc_mem_drop_context(&primary[dev]);
        context_count(dev, -1);
        destroyed = 1;
    }
    pthread_mutex_unlock(&ctx_mutex);
    if (destroyed) unstack(&primary[dev]);
    return rc;
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    REQUIRE_READY();
    if (gpu_of(dev) == NULL) return CUDA_ERROR_INVALID_DEVICE;
    if (flags == NULL || active == NULL) return CUDA_ERROR_INVALID_VALUE;
    *flags = primary[dev].flags;
    *active = primary[dev].refs > 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
    REQUIRE_READY();
    if (gpu_of(dev) == NULL) return CUDA_ERROR_INVALID_DEVICE;
    primary[dev].flags = flags;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
    return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

/* Frees the primary context's allocations; the context stays retained. */
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    REQUIRE_READY();
    if (gpu_of(dev) == NULL) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&ctx_mutex);
    fc_mem_drop_context(&primary[dev]);
    pthread_mutex_unlock(&ctx_mutex);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

static CUresult create_ctx(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    REQUIRE_READY();
    if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (gpu_of(dev) == NULL) return CUDA_ERROR_INVALID_DEVICE;
    if (ctx_depth == CTX_STACK) return CUDA_ERROR_OUT_OF_MEMORY;
    CUcontext c = calloc(1, sizeof *c);
    if (c == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *c = (struct CUctx_st){TAG_CTX, dev, 0, flags, 1};
    pthread_mutex_lock(&ctx_mutex);
    context_count(dev, +1);
    pthread_mutex_unlock(&ctx_mutex);
    ctx_stack[ctx_depth++] = c; /* a new context is made current */
    *pctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    return create_ctx(pctx, flags, dev);
}

EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) { return create_ctx(pctx, flags, dev); }

/* With execution affinity parameters (CUexecAffinityParam[]), which the fake accepts and ignores. */
EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, void *paramsArray, int numParams, unsigned int flags, CUdevice dev) {
    if (numParams < 0 || (numParams > 0 && paramsArray == NULL)) return CUDA_ERROR_INVALID_VALUE;
    return create_ctx(pctx, flags, dev);
}

/* With CUctxCreateParams (affinity, CIG), which the fake accepts (NULL or not) and ignores. */
EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, void *ctxCreateParams, unsigned int flags, CUdevice dev) {
    (void)ctxCreateParams;
    return create_ctx(pctx, flags, dev);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    REQUIRE_READY();
    if (ctx == NULL || ctx->tag != TAG_CTX || ctx->primary) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&ctx_mutex);
    fc_mem_drop_context(ctx);
    context_count(ctx->ordinal, -1);
    ctx->tag = 0;
    pthread_mutex_unlock(&ctx_mutex);
    unstack(ctx);
    /* not freed: another thread may still hold the handle, and must get an error, not a crash */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
    REQUIRE_READY();
    if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    *pctx = fc_current();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    REQUIRE_READY();
    if (ctx == NULL) {
        if (ctx_depth > 0) ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 0) ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    REQUIRE_READY();
    if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == CTX_STACK) return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    REQUIRE_READY();
    if (ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = ctx_stack[--ctx_depth];
    if (pctx) *pctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent(CUcontext *pctx) { return cuCtxPopCurrent_v2(pctx); }

EXPORT CUresult cuCtxGetDevice(CUdevice *device) {
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    int ordinal;
    CUresult rc = fc_current_ordinal(&ordinal);
    if (rc == CUDA_SUCCESS) *device = ordinal;
    return rc;
}
