/* The container check's CUDA program (bench/gpu/acceptance.py, phase `driver`): run as the only
 * process of a container-like root, it says what a CUDA application there sees, one `key value`
 * line per fact. Linked against libcuda.so.1 by soname, as an application built with -lcuda; its
 * own minimal declarations of the driver API and NVML (from the public documentation).
 *
 *   ctrprobe CHUNK MAX
 *
 * pid; libcuda_path / libcuda_realpath / libcuda_dev / libcuda_ino: the libcuda.so.1 the loader
 * mapped (its link map name, that name with links followed, the file's st_dev as major:minor and
 * st_ino); init_rc, driver_version, cuda_count (cuDeviceGetCount), cuda_uuid_rc / cuda_uuid (ordinal 0,
 * cuDeviceGetUuid_v2); nvml_rc, nvml_count, nvml_uuid (index 0); device_rc (cuDeviceGet, primary
 * context retained and made current), meminfo_rc / meminfo_total / meminfo_free (cuMemGetInfo_v2),
 * alloc_owner (the file defining the cuMemAlloc_v2 this program calls), then cuMemAlloc_v2 of CHUNK
 * bytes until refused or MAX allocations: count, total, error. Exit 0 when it got that far, 3 when
 * no context could be made current (the lines before say why). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct {
    unsigned char bytes[16];
} CUuuid;

CUresult cuInit(unsigned int);
CUresult cuDriverGetVersion(int *);
CUresult cuDeviceGetCount(int *);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceGetUuid_v2(CUuuid *, CUdevice);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);

static void uuid_text(const unsigned char *b, char *out, size_t cap)
{
    snprintf(out, cap, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static void libcuda(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    struct link_map *map = NULL;
    if (h == NULL || dlinfo(h, RTLD_DI_LINKMAP, &map) != 0 || map == NULL) {
        printf("libcuda_path ?\n");
        return;
    }
    char real[PATH_MAX];
    struct stat st;
    printf("libcuda_path %s\n", map->l_name);
    if (realpath(map->l_name, real) != NULL && stat(real, &st) == 0)
        printf("libcuda_realpath %s\nlibcuda_dev %u:%u\nlibcuda_ino %llu\n", real, major(st.st_dev), minor(st.st_dev),
               (unsigned long long)st.st_ino);
}

static void nvml(void)
{
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (h == NULL) {
        printf("nvml_rc -1\n");
        return;
    }
    int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    int (*count)(unsigned *) = (int (*)(unsigned *))dlsym(h, "nvmlDeviceGetCount_v2");
    int (*by_index)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    int (*uuid)(void *, char *, unsigned) = (int (*)(void *, char *, unsigned))dlsym(h, "nvmlDeviceGetUUID");
    unsigned n = 0;
    void *dev = NULL;
    char text[96] = "";
    int rc = init == NULL || count == NULL || by_index == NULL || uuid == NULL ? -1 : init();
    if (rc == 0)
        rc = count(&n);
    printf("nvml_rc %d\nnvml_count %u\n", rc, n);
    if (rc == 0 && n > 0 && by_index(0, &dev) == 0 && uuid(dev, text, sizeof(text)) == 0)
        printf("nvml_uuid %s\n", text);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 3) {
        fprintf(stderr, "usage: ctrprobe CHUNK MAX\n");
        return 2;
    }
    size_t chunk = strtoull(argv[1], NULL, 0);
    long max = atol(argv[2]);
    printf("pid %d\n", (int)getpid());
    libcuda();
    int version = 0, count = 0;
    CUresult rc = cuInit(0);
    printf("init_rc %d\n", rc);
    cuDriverGetVersion(&version);
    printf("driver_version %d\n", version);
    rc = cuDeviceGetCount(&count);
    printf("cuda_count_rc %d\ncuda_count %d\n", rc, count);
    CUuuid id;
    rc = cuDeviceGetUuid_v2(&id, 0);
    printf("cuda_uuid_rc %d\n", rc);
    if (rc == 0) {
        char text[64];
        uuid_text(id.bytes, text, sizeof(text));
        printf("cuda_uuid %s\n", text);
    }
    nvml();
    CUdevice dev = -1;
    CUcontext ctx = NULL;
    if ((rc = cuDeviceGet(&dev, 0)) == 0 && (rc = cuDevicePrimaryCtxRetain(&ctx, dev)) == 0)
        rc = cuCtxSetCurrent(ctx);
    printf("device_rc %d\n", rc);
    if (rc != 0)
        return 3;
    size_t free_b = 0, total_b = 0;
    rc = cuMemGetInfo_v2(&free_b, &total_b);
    printf("meminfo_rc %d\nmeminfo_total %zu\nmeminfo_free %zu\n", rc, total_b, free_b);
    Dl_info info;
    printf("alloc_owner %s\n", dladdr((void *)&cuMemAlloc_v2, &info) && info.dli_fname ? info.dli_fname : "?");
    unsigned long long total = 0;
    long n = 0;
    CUdeviceptr p;
    rc = 0;
    while (n < max && (rc = cuMemAlloc_v2(&p, chunk)) == 0) {
        total += chunk;
        n++;
    }
    printf("count %ld\ntotal %llu\nerror %d\n", n, total, rc);
    return 0;
}
