/* Test driver for the control library's memory limit: allocates through one "door" (the way an
 * application reaches the driver) and reports what happened, one `key value` line per fact.
 * Its own minimal declarations of the driver API (not the library's headers), so a mismatch
 * between the library's ABI and the documented one shows up here.
 *
 *   memprobe info                         limited views: cuMemGetInfo_v2, cuDeviceTotalMem_v2, NVML
 *   memprobe fill DOOR CHUNK [HOLD]       allocate CHUNK bytes until refused; HOLD: then wait for stdin EOF
 *   memprobe random SEED MAX              random sizes in [1 MiB, MAX] until refused, then wait for EOF
 *   memprobe owners                       dladdr of what cuGetProcAddress(_v2) hands out
 *   memprobe fork CHUNK                   fork, parent takes CHUNK, then the child fills with CHUNK
 *   memprobe cycle DOOR SIZE N            N rounds of: fill with SIZE chunks, free them all
 *   memprobe host SIZE                    cuMemHostAlloc and cuMemHostRegister_v2 of SIZE
 *   memprobe nvml                         NVML mode calls and nvmlDeviceGetMemoryInfo_v2
 *   memprobe bench N SIZE                 ns per cuMemAlloc_v2 + cuMemFree_v2 pair, N pairs
 *   memprobe threads T N SIZE             T threads x N rounds: keep one managed SIZE, free another;
 *                                         then wait for EOF
 *   memprobe forkrandom N MAX             N forked children fill at random together (as random)
 *   memprobe take SIZE                    one allocation of SIZE, then wait for stdin EOF
 *   memprobe steps SIZE                   "ready 1", then per stdin line one allocation of SIZE ("rc N")
 * DOOR: direct dlsym next gpa gpa2 gpa2ptsz v1 pitch managed async asyncptsz pool create array */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct {
    int type, handleTypes, locType, locId;
    void *win32;
    unsigned char flags[8];
} Prop;
typedef struct {
    size_t Width, Height;
    int Format;
    unsigned int NumChannels;
} ArrayDesc;

CUresult cuInit(unsigned int);
CUresult cuDriverGetVersion(int *);
CUresult cuDeviceGet(int *, int);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuDeviceTotalMem_v2(size_t *, int);
CUresult cuDeviceGetDefaultMemPool(void **, int);

typedef CUresult (*alloc2_t)(CUdeviceptr *, size_t);
typedef CUresult (*gpa_t)(const char *, void **, int, unsigned long long);
typedef CUresult (*gpa2_t)(const char *, void **, int, unsigned long long, int *);

static void *libcuda;
static int device = -1; /* the CUdevice of ordinal 0 */
static void *ctx0;      /* its primary context */

static void *proc(const char *door, const char *sym, unsigned long long flags)
{
    void *p = NULL;
    int status = -1;
    if (strncmp(door, "gpa2", 4) == 0) {
        gpa2_t g = (gpa2_t)dlsym(libcuda, "cuGetProcAddress_v2");
        if (g(sym, &p, 12000, flags, &status) != 0)
            return NULL;
    } else {
        gpa_t g = (gpa_t)dlsym(libcuda, "cuGetProcAddress");
        if (g(sym, &p, 12000, flags) != 0)
            return NULL;
    }
    return p;
}

static CUresult alloc_one(const char *door, size_t size, CUdeviceptr *out)
{
    if (strcmp(door, "direct") == 0)
        return cuMemAlloc_v2(out, size);
    if (strcmp(door, "dlsym") == 0)
        return ((alloc2_t)dlsym(libcuda, "cuMemAlloc_v2"))(out, size);
    if (strcmp(door, "next") == 0)
        return ((alloc2_t)dlsym(RTLD_NEXT, "cuMemAlloc_v2"))(out, size);
    if (strcmp(door, "gpa") == 0 || strcmp(door, "gpa2") == 0)
        return ((alloc2_t)proc(door, "cuMemAlloc", 0))(out, size);
    if (strcmp(door, "gpa2ptsz") == 0) {
        CUresult (*f)(CUdeviceptr *, size_t, void *) = proc("gpa2", "cuMemAllocAsync", 2);
        return f(out, size, NULL);
    }
    if (strcmp(door, "v1") == 0) {
        unsigned int p32 = 0;
        CUresult r = ((CUresult(*)(unsigned int *, unsigned int))dlsym(libcuda, "cuMemAlloc"))(&p32, (unsigned)size);
        *out = p32;
        return r;
    }
    if (strcmp(door, "pitch") == 0) {
        size_t pitch;
        return ((CUresult(*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned))dlsym(libcuda, "cuMemAllocPitch_v2"))(
            out, &pitch, size / 1024, 1024, 4);
    }
    if (strcmp(door, "managed") == 0)
        return ((CUresult(*)(CUdeviceptr *, size_t, unsigned))dlsym(libcuda, "cuMemAllocManaged"))(out, size, 1);
    if (strcmp(door, "async") == 0 || strcmp(door, "asyncptsz") == 0) {
        const char *n = door[5] ? "cuMemAllocAsync_ptsz" : "cuMemAllocAsync";
        return ((CUresult(*)(CUdeviceptr *, size_t, void *))dlsym(libcuda, n))(out, size, NULL);
    }
    if (strcmp(door, "pool") == 0) {
        void *pool = NULL;
        cuDeviceGetDefaultMemPool(&pool, device);
        return ((CUresult(*)(CUdeviceptr *, size_t, void *, void *))dlsym(libcuda, "cuMemAllocFromPoolAsync"))(
            out, size, pool, NULL);
    }
    if (strcmp(door, "create") == 0) {
        Prop prop;
        memset(&prop, 0, sizeof(prop));
        prop.type = 1;    /* PINNED */
        prop.locType = 1; /* DEVICE */
        prop.locId = device;
        return ((CUresult(*)(CUdeviceptr *, size_t, const Prop *, unsigned long long))dlsym(libcuda, "cuMemCreate"))(
            out, size, &prop, 0);
    }
    if (strcmp(door, "array") == 0) {
        ArrayDesc d = {size / 4, 1, 0x20 /* FLOAT */, 1};
        return ((CUresult(*)(CUdeviceptr *, const ArrayDesc *))dlsym(libcuda, "cuArrayCreate_v2"))(out, &d);
    }
    fprintf(stderr, "unknown door %s\n", door);
    exit(2);
}

/* CUDA device 0's primary context made current; exit 3 when that fails, with `setup_error <rc>`
 * (the failing call's CUresult: 101 when the library refuses device 0). */
static void setup(void)
{
    libcuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (libcuda == NULL) {
        fprintf(stderr, "setup failed: %s\n", dlerror());
        exit(3);
    }
    void *ctx = NULL;
    CUresult r;
    if ((r = cuInit(0)) != 0 || (r = cuDeviceGet(&device, 0)) != 0 || (r = cuDevicePrimaryCtxRetain(&ctx, device)) != 0 ||
        (r = cuCtxSetCurrent(ctx)) != 0) {
        printf("setup_error %d\n", r);
        fprintf(stderr, "setup failed: CUresult %d\n", r);
        exit(3);
    }
    ctx0 = ctx;
}

static long thread_n;
static size_t thread_size;

static void *managed_worker(void *arg)
{
    CUdeviceptr keep, drop;
    long ok = 0;
    cuCtxSetCurrent(ctx0);
    /* Keep one, free one: frees (not under the device lock) race with the other threads. */
    for (long i = 0; i < thread_n; i++) {
        ok += alloc_one("managed", thread_size, &keep) == 0;
        if (alloc_one("managed", thread_size, &drop) == 0)
            cuMemFree_v2(drop);
    }
    return (void *)ok;
}

static void wait_eof(void)
{
    char buf[64];
    fflush(stdout);
    while (read(0, buf, sizeof(buf)) > 0)
        ;
}

/* Random sizes in [1 MiB, max] until 20 refusals in a row: the device is as full as it gets. */
static unsigned long long random_fill(unsigned long long max)
{
    unsigned long long total = 0;
    int fails = 0;
    CUdeviceptr p;
    while (fails < 20) {
        size_t size = ((size_t)(1 + rand() % (max >> 20))) << 20;
        if (alloc_one("direct", size, &p) == 0) {
            total += size;
            fails = 0;
        } else {
            fails++;
        }
    }
    return total;
}

static int fill(const char *door, size_t chunk, int hold)
{
    unsigned long long total = 0;
    int n = 0;
    CUresult r;
    CUdeviceptr p;
    while ((r = alloc_one(door, chunk, &p)) == 0 && n < 100000) {
        total += chunk;
        n++;
    }
    printf("count %d\ntotal %llu\nerror %d\n", n, total, r);
    if (hold)
        wait_eof();
    return 0;
}

typedef struct {
    unsigned long long total, free, used;
} NvmlMem;

static void info(void)
{
    size_t f = 0, t = 0, dt = 0;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    printf("meminfo_rc %d\nmeminfo_total %zu\nmeminfo_free %zu\n", r, t, f);
    r = cuDeviceTotalMem_v2(&dt, device);
    printf("totalmem_rc %d\ntotalmem %zu\n", r, dt);
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    int (*init)(void) = (int (*)(void))dlsym(nvml, "nvmlInit_v2");
    int (*byuuid)(const char *, void **) = (int (*)(const char *, void **))dlsym(nvml, "nvmlDeviceGetHandleByUUID");
    int (*mem)(void *, NvmlMem *) = (int (*)(void *, NvmlMem *))dlsym(nvml, "nvmlDeviceGetMemoryInfo");
    const char *uuid = getenv("PROBE_NVML_UUID");
    void *h = NULL;
    NvmlMem m = {0, 0, 0};
    int rc = init() || byuuid(uuid, &h) || mem(h, &m);
    printf("nvml_rc %d\nnvml_total %llu\nnvml_used %llu\nnvml_free %llu\n", rc, m.total, m.used, m.free);
}

static const char *owner(void *p)
{
    static char buf[8][512];
    static int k;
    Dl_info i;
    char *b = buf[k++ % 8];
    if (p == NULL || !dladdr(p, &i))
        return "NULL";
    snprintf(b, 512, "%s:%s", i.dli_fname, i.dli_sname ? i.dli_sname : "?");
    return b;
}

static void owners(void)
{
    printf("gpa.cuMemAlloc %s\n", owner(proc("gpa", "cuMemAlloc", 0)));
    printf("gpa2.cuMemAlloc %s\n", owner(proc("gpa2", "cuMemAlloc", 0)));
    printf("gpa2.cuMemAllocAsync %s\n", owner(proc("gpa2", "cuMemAllocAsync", 0)));
    printf("gpa2.cuMemAllocAsync.ptsz %s\n", owner(proc("gpa2", "cuMemAllocAsync", 2)));
    printf("gpa2.cuMemFreeAsync.ptsz %s\n", owner(proc("gpa2", "cuMemFreeAsync", 2)));
    printf("gpa2.cuMemGetInfo %s\n", owner(proc("gpa2", "cuMemGetInfo", 0)));
    printf("gpa2.cuDeviceGet %s\n", owner(proc("gpa2", "cuDeviceGet", 0)));
    printf("gpa2.cuDeviceGetName %s\n", owner(proc("gpa2", "cuDeviceGetName", 0)));
    printf("gpa2.cuGetProcAddress %s\n", owner(proc("gpa2", "cuGetProcAddress", 0)));
    printf("gpa.cuGetProcAddress %s\n", owner(proc("gpa", "cuGetProcAddress", 0)));
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2)
        return 2;
    if (strcmp(argv[1], "fork") == 0 || strcmp(argv[1], "forkrandom") == 0) {
        /* CUDA is undefined in a child forked after cuInit (real drivers fail it, and so does the
         * fake): the library initialises here through a hooked entry, then each process sets up
         * CUDA after the fork, as a fork-based program must. */
        int version;
        if (cuDriverGetVersion(&version) != 0)
            return 3;
    } else {
        setup();
    }
    if (strcmp(argv[1], "info") == 0)
        info();
    else if (strcmp(argv[1], "owners") == 0)
        owners();
    else if (strcmp(argv[1], "fill") == 0 && argc >= 4)
        return fill(argv[2], strtoull(argv[3], NULL, 0), argc > 4);
    else if (strcmp(argv[1], "random") == 0 && argc == 4) {
        srand((unsigned)strtoul(argv[2], NULL, 0));
        printf("total %llu\n", random_fill(strtoull(argv[3], NULL, 0)));
        wait_eof();
    } else if (strcmp(argv[1], "forkrandom") == 0 && argc == 4) {
        int n = atoi(argv[2]);
        unsigned long long max = strtoull(argv[3], NULL, 0);
        int go[2];
        if (pipe(go) != 0)
            return 1;
        for (int i = 0; i < n; i++) {
            if (fork() == 0) {
                char c;
                close(go[1]);
                if (read(go[0], &c, 1) != 1) /* start together: the race is the point */
                    _exit(1);
                setup();
                srand((unsigned)getpid());
                printf("child%d %llu\n", i, random_fill(max));
                wait_eof();
                _exit(0);
            }
        }
        close(go[0]);
        if (write(go[1], "gggggggggggggggggggggggggggggggg", (size_t)n) != n)
            return 1;
        while (wait(NULL) > 0)
            ;
    } else if (strcmp(argv[1], "cycle") == 0 && argc == 5) {
        size_t size = strtoull(argv[3], NULL, 0);
        int rounds = atoi(argv[4]), done = 0;
        CUdeviceptr held[4096];
        for (; done < rounds; done++) {
            int n = 0;
            while (n < 4096 && alloc_one(argv[2], size, &held[n]) == 0)
                n++;
            if (n == 0)
                break;
            for (int i = 0; i < n; i++)
                cuMemFree_v2(held[i]);
        }
        printf("rounds %d\n", done);
    } else if (strcmp(argv[1], "host") == 0 && argc == 3) {
        size_t size = strtoull(argv[2], NULL, 0);
        void *h = NULL;
        CUresult r = ((CUresult(*)(void **, size_t, unsigned))dlsym(libcuda, "cuMemHostAlloc"))(&h, size, 0);
        printf("hostalloc_rc %d\nhostalloc_null %d\n", r, h == NULL);
        void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        r = ((CUresult(*)(void *, size_t, unsigned))dlsym(libcuda, "cuMemHostRegister_v2"))(m, size, 0);
        printf("register_rc %d\n", r);
        /* Registered again: the driver refuses a second registration, unless ours was undone. */
        r = ((CUresult(*)(void *))dlsym(libcuda, "cuMemHostUnregister"))(m);
        printf("unregister_rc %d\n", r);
    } else if (strcmp(argv[1], "nvml") == 0) {
        void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
        int (*init)(void) = (int (*)(void))dlsym(nvml, "nvmlInit_v2");
        int (*byuuid)(const char *, void **) = (int (*)(const char *, void **))dlsym(nvml, "nvmlDeviceGetHandleByUUID");
        void *h = NULL;
        init();
        byuuid(getenv("PROBE_NVML_UUID"), &h);
        int mode = -1;
        printf("setcompute_rc %d\n", ((int (*)(void *, int))dlsym(nvml, "nvmlDeviceSetComputeMode"))(h, 0));
        int r = ((int (*)(void *, int *))dlsym(nvml, "nvmlDeviceGetPersistenceMode"))(h, &mode);
        printf("persistence_rc %d\npersistence %d\n", r, mode);
        struct {
            unsigned int version;
            unsigned long long total, reserved, free, used;
        } m2 = {(unsigned)(40 | (2u << 24)), 0, 0, 0, 0};
        r = ((int (*)(void *, void *))dlsym(nvml, "nvmlDeviceGetMemoryInfo_v2"))(h, &m2);
        printf("mem2_rc %d\nmem2_total %llu\nmem2_reserved %llu\nmem2_free %llu\nmem2_used %llu\n", r, m2.total,
               m2.reserved, m2.free, m2.used);
    } else if (strcmp(argv[1], "bench") == 0 && argc == 4) {
        long n = atol(argv[2]);
        size_t size = strtoull(argv[3], NULL, 0);
        CUdeviceptr p;
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (long i = 0; i < n; i++) {
            if (cuMemAlloc_v2(&p, size) != 0 || cuMemFree_v2(p) != 0) {
                fprintf(stderr, "bench: allocation %ld failed\n", i);
                return 1;
            }
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)n;
        printf("ns_per_pair %.0f\n", ns);
    } else if (strcmp(argv[1], "threads") == 0 && argc == 5) {
        int t = atoi(argv[2]);
        pthread_t tids[64];
        long ok = 0;
        thread_n = atol(argv[3]);
        thread_size = strtoull(argv[4], NULL, 0);
        for (int i = 0; i < t && i < 64; i++)
            pthread_create(&tids[i], NULL, managed_worker, NULL);
        for (int i = 0; i < t && i < 64; i++) {
            void *r;
            pthread_join(tids[i], &r);
            ok += (long)r;
        }
        printf("allocated %ld\n", ok);
        wait_eof();
    } else if (strcmp(argv[1], "steps") == 0 && argc == 3) {
        size_t size = strtoull(argv[2], NULL, 0);
        char line[64];
        CUdeviceptr p;
        printf("ready 1\n");
        while (fgets(line, sizeof(line), stdin) != NULL)
            printf("rc %d\n", alloc_one("direct", size, &p));
    } else if (strcmp(argv[1], "take") == 0 && argc == 3) {
        CUdeviceptr p;
        printf("rc %d\n", alloc_one("direct", strtoull(argv[2], NULL, 0), &p));
        wait_eof();
    } else if (strcmp(argv[1], "fork") == 0 && argc == 3) {
        size_t chunk = strtoull(argv[2], NULL, 0);
        int go[2];
        if (pipe(go) != 0)
            return 1;
        pid_t pid = fork();
        if (pid == 0) {
            char c;
            close(go[1]);
            if (read(go[0], &c, 1) != 1) /* after the parent's allocation */
                _exit(1);
            setup();
            fill("direct", chunk, 0);
            fflush(stdout);
            _exit(0);
        }
        close(go[0]);
        setup();
        CUdeviceptr p;
        printf("parent_rc %d\n", alloc_one("direct", chunk, &p));
        fflush(stdout);
        if (write(go[1], "g", 1) != 1)
            return 1;
        int st;
        waitpid(pid, &st, 0);
        printf("child_status %d\n", st);
    } else {
        return 2;
    }
    return 0;
}
