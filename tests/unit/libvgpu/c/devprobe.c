/* Test driver for the library's device gate: every door that names a CUDA device or NVML handle,
 * tried on every device the driver has, one `key value` line per result. Its own minimal
 * declarations of the driver API and NVML (not the library's headers).
 *
 *   devprobe CHUNK UUID...
 *
 * CUDA, per ordinal i of cuDeviceGetCount (`count`):
 *   get.DOOR.i            cuDeviceGet(&d, i) through DOOR (direct dlsym gpa gpa2 gpa2ptsz); .d: d
 *                         afterwards (preset to -7, so -7 means untouched)
 *   retain.DOOR.i         cuDevicePrimaryCtxRetain(&ctx, i) (a raw ordinal); .active: the primary
 *                         context's state right after (cuDevicePrimaryCtxGetState), .ctx: 1 when ctx
 *                         was left untouched; released again when it succeeded
 *   create.VARIANT.DOOR.i cuCtxCreate VARIANT (v1 v2 v3 v4) through DOOR (direct dlsym; gpa and gpa2 and
 *                         gpa2ptsz at the CUDA version of that variant, where the profile's driver has
 *                         it); .ctx: 1 when the context pointer was left untouched, .current: 1 when the
 *                         current context did not change; destroyed again when it succeeded
 * then on ordinal 0 (when cuDeviceGet gives it): `fill.count` / `fill.error`, cuMemAlloc_v2 of CHUNK
 * until refused in its primary context.
 * NVML: `nvml.count` (nvmlDeviceGetCount_v2); per index i `nvml.index.i`, `nvml.index_v2.i` (.h: 1 when
 * the handle was left untouched); per UUID argument k `nvml.uuid.k` and, when found, `nvml.total.k`
 * (nvmlDeviceGetMemoryInfo). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

CUresult cuInit(unsigned int);
CUresult cuDeviceGetCount(int *);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuDevicePrimaryCtxGetState(CUdevice, unsigned int *, int *);
CUresult cuCtxCreate(CUcontext *, unsigned int, CUdevice);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuCtxCreate_v3(CUcontext *, void *, int, unsigned int, CUdevice);
CUresult cuCtxCreate_v4(CUcontext *, void *, unsigned int, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxGetCurrent(CUcontext *);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);

typedef CUresult (*gpa_t)(const char *, void **, int, unsigned long long);
typedef CUresult (*gpa2_t)(const char *, void **, int, unsigned long long, int *);
typedef CUresult (*get_t)(CUdevice *, int);
typedef CUresult (*retain_t)(CUcontext *, CUdevice);
typedef CUresult (*create2_t)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*create3_t)(CUcontext *, void *, int, unsigned int, CUdevice);
typedef CUresult (*create4_t)(CUcontext *, void *, unsigned int, CUdevice);

static void *libcuda;
#define SENTINEL ((CUcontext)0x5e47)

/* The pointer a door hands out for `sym` (NULL when it has none): dlsym, or cuGetProcAddress(_v2)
 * at `version` (gpa2ptsz: with the per-thread default stream flag). */
static void *door_fn(const char *door, const char *sym, int version)
{
    void *p = NULL;
    int status = -1;
    if (strcmp(door, "dlsym") == 0)
        return dlsym(libcuda, sym);
    if (strcmp(door, "gpa") == 0) {
        gpa_t g = (gpa_t)dlsym(libcuda, "cuGetProcAddress");
        return g(sym, &p, version, 0) == 0 ? p : NULL;
    }
    gpa2_t g = (gpa2_t)dlsym(libcuda, "cuGetProcAddress_v2");
    unsigned long long flags = strcmp(door, "gpa2ptsz") == 0 ? 2 : 0;
    return g(sym, &p, version, flags, &status) == 0 ? p : NULL;
}

static const char *const DOORS[] = {"direct", "dlsym", "gpa", "gpa2", "gpa2ptsz", NULL};

static void try_get(int i)
{
    for (int k = 0; DOORS[k] != NULL; k++) {
        const char *door = DOORS[k];
        get_t fn = strcmp(door, "direct") == 0 ? cuDeviceGet : (get_t)door_fn(door, "cuDeviceGet", 12000);
        CUdevice d = -7;
        CUresult r = fn ? fn(&d, i) : -1;
        printf("get.%s.%d %d\nget.%s.%d.d %d\n", door, i, r, door, i, d);
    }
}

static void try_retain(int i)
{
    for (int k = 0; DOORS[k] != NULL; k++) {
        const char *door = DOORS[k];
        retain_t fn = strcmp(door, "direct") == 0 ? cuDevicePrimaryCtxRetain
                                                  : (retain_t)door_fn(door, "cuDevicePrimaryCtxRetain", 12000);
        CUcontext ctx = SENTINEL;
        CUresult r = fn ? fn(&ctx, i) : -1;
        unsigned int flags = 0;
        int active = -1;
        cuDevicePrimaryCtxGetState(i, &flags, &active);
        printf("retain.%s.%d %d\nretain.%s.%d.active %d\nretain.%s.%d.ctx %d\n", door, i, r, door, i, active, door,
               i, ctx == SENTINEL);
        if (r == 0)
            cuDevicePrimaryCtxRelease_v2(i);
    }
}

/* The cuGetProcAddress version that selects each variant (the fake's table: v4 is CUDA 13's, above
 * the profile's 12.4 driver, so only direct and dlsym reach it). */
static const struct {
    const char *name;
    int version;
} VARIANTS[] = {{"cuCtxCreate", 2000}, {"cuCtxCreate_v2", 3020}, {"cuCtxCreate_v3", 11040}, {"cuCtxCreate_v4", 0}};

static CUresult call_create(int variant, void *fn, CUcontext *ctx, CUdevice dev)
{
    switch (variant) {
    case 0:
    case 1: return ((create2_t)fn)(ctx, 0, dev);
    case 2: return ((create3_t)fn)(ctx, NULL, 0, 0, dev);
    default: return ((create4_t)fn)(ctx, NULL, 0, dev);
    }
}

static void try_create(int i)
{
    void *direct[] = {(void *)cuCtxCreate, (void *)cuCtxCreate_v2, (void *)cuCtxCreate_v3, (void *)cuCtxCreate_v4};
    for (int v = 0; v < 4; v++) {
        for (int k = 0; DOORS[k] != NULL; k++) {
            const char *door = DOORS[k];
            void *fn;
            if (strcmp(door, "direct") == 0)
                fn = direct[v];
            else if (strcmp(door, "dlsym") == 0)
                fn = door_fn(door, VARIANTS[v].name, 0);
            else if (VARIANTS[v].version > 0)
                fn = door_fn(door, "cuCtxCreate", VARIANTS[v].version);
            else
                continue;
            CUcontext before = NULL, after = NULL, ctx = SENTINEL;
            cuCtxGetCurrent(&before);
            CUresult r = fn ? call_create(v, fn, &ctx, i) : -1;
            cuCtxGetCurrent(&after);
            printf("create.v%d.%s.%d %d\ncreate.v%d.%s.%d.ctx %d\ncreate.v%d.%s.%d.current %d\n", v + 1, door, i, r,
                   v + 1, door, i, ctx == SENTINEL, v + 1, door, i, before == after);
            if (r == 0)
                cuCtxDestroy_v2(ctx);
        }
    }
}

static void fill(size_t chunk)
{
    CUdevice d;
    CUcontext ctx;
    if (cuDeviceGet(&d, 0) != 0 || cuDevicePrimaryCtxRetain(&ctx, d) != 0 || cuCtxSetCurrent(ctx) != 0)
        return;
    CUdeviceptr p;
    CUresult r;
    int n = 0;
    while ((r = cuMemAlloc_v2(&p, chunk)) == 0 && n < 100000)
        n++;
    printf("fill.count %d\nfill.error %d\n", n, r);
}

typedef struct {
    unsigned long long total, free, used;
} NvmlMem;

static void nvml(int nuuid, char **uuids)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (lib == NULL || ((int (*)(void))dlsym(lib, "nvmlInit_v2"))() != 0) {
        printf("nvml.init -1\n");
        return;
    }
    int (*count_fn)(unsigned *) = (int (*)(unsigned *))dlsym(lib, "nvmlDeviceGetCount_v2");
    int (*by_index)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex");
    int (*by_index2)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    int (*by_uuid)(const char *, void **) = (int (*)(const char *, void **))dlsym(lib, "nvmlDeviceGetHandleByUUID");
    int (*mem)(void *, NvmlMem *) = (int (*)(void *, NvmlMem *))dlsym(lib, "nvmlDeviceGetMemoryInfo");
    unsigned n = 0;
    int r = count_fn(&n);
    printf("nvml.count_rc %d\nnvml.count %u\n", r, n);
    for (unsigned i = 0; i < n; i++) {
        void *h = SENTINEL;
        r = by_index(i, &h);
        printf("nvml.index.%u %d\nnvml.index.%u.h %d\n", i, r, i, h == SENTINEL);
        h = SENTINEL;
        r = by_index2(i, &h);
        printf("nvml.index_v2.%u %d\nnvml.index_v2.%u.h %d\n", i, r, i, h == SENTINEL);
    }
    for (int k = 0; k < nuuid; k++) {
        void *h = SENTINEL;
        r = by_uuid(uuids[k], &h);
        printf("nvml.uuid.%d %d\nnvml.uuid.%d.h %d\n", k, r, k, h == SENTINEL);
        NvmlMem m = {0, 0, 0};
        if (r == 0 && mem(h, &m) == 0)
            printf("nvml.total.%d %llu\n", k, m.total);
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2)
        return 2;
    libcuda = dlopen("libcuda.so.1", RTLD_NOW);
    int count = 0;
    if (libcuda == NULL || cuInit(0) != 0 || cuDeviceGetCount(&count) != 0)
        return 3;
    printf("count %d\n", count);
    for (int i = 0; i < count; i++) {
        try_get(i);
        try_retain(i);
        try_create(i);
    }
    fill(strtoull(argv[1], NULL, 0));
    nvml(argc - 2, argv + 2);
    return 0;
}
