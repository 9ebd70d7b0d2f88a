/* The real dlsym and the real libraries. See real.h. */
#include "real.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vgpu_paths.h"

typedef void *(*dlsym_fn)(void *, const char *);

static dlsym_fn real_dlsym_ptr;
static pthread_once_t dlsym_once = PTHREAD_ONCE_INIT;

/* GLIBC_2.34 (libdl merged into libc), 2.17 (arm64), 2.2.5 (amd64), 2.0 (i386). dlvsym is not
 * hooked, so this never re-enters our dlsym. */
static void find_real_dlsym(void)
{
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.17", "GLIBC_2.2.5", "GLIBC_2.0", NULL};
    for (int i = 0; versions[i] != NULL && real_dlsym_ptr == NULL; i++)
        real_dlsym_ptr = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (real_dlsym_ptr == NULL) {
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        for (int i = 0; libc != NULL && versions[i] != NULL && real_dlsym_ptr == NULL; i++)
            real_dlsym_ptr = (dlsym_fn)dlvsym(libc, "dlsym", versions[i]);
    }
    if (real_dlsym_ptr == NULL) {
        fprintf(stderr, "vgpu: FATAL: cannot find glibc's dlsym\n");
        abort();
    }
}

vgpu_dlsym_fn vgpu_real_dlsym_fn(void)
{
    pthread_once(&dlsym_once, find_real_dlsym);
    return real_dlsym_ptr;
}

void *vgpu_real_dlsym(void *handle, const char *symbol)
{
    pthread_once(&dlsym_once, find_real_dlsym);
    return real_dlsym_ptr(handle, symbol);
}

void vgpu_libcuda_soname(const char *text, char *out, size_t cap)
{
    snprintf(out, cap, "libcuda.so.1");
    const char *line = text ? strstr(text, "NVRM version:") : NULL;
    if (line == NULL)
        return;
    /* "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ..." (open module:
     * "NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build ..."): the first token
     * that starts with a digit and holds a dot. */
    const char *end = strchr(line, '\n');
    if (end == NULL)
        end = line + strlen(line);
    for (const char *p = line + 13; p < end; p++) {
        if ((p[-1] != ' ' && p[-1] != '\t') || *p < '0' || *p > '9')
            continue;
        size_t n = 0;
        int dot = 0;
        while (p + n < end && ((p[n] >= '0' && p[n] <= '9') || p[n] == '.')) {
            dot |= p[n] == '.';
            n++;
        }
        if (dot && (p + n == end || p[n] == ' ' || p[n] == '\t')) {
            snprintf(out, cap, "libcuda.so.%.*s", (int)n, p);
            return;
        }
    }
}

static void *libs[2];
static pthread_once_t libs_once = PTHREAD_ONCE_INIT;

static void open_libs(void)
{
    char soname[128], text[1024] = "";
    FILE *f = fopen(vgpu_path(VGPU_PATH_DRIVER_VERSION), "re");
    if (f != NULL) {
        size_t n = fread(text, 1, sizeof(text) - 1, f);
        text[n] = '\0';
        fclose(f);
    }
    vgpu_libcuda_soname(text, soname, sizeof(soname));
    libs[VGPU_LIB_CUDA] = dlopen(soname, RTLD_NOW | RTLD_NODELETE);
    if (libs[VGPU_LIB_CUDA] == NULL && strcmp(soname, "libcuda.so.1") != 0)
        libs[VGPU_LIB_CUDA] = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NODELETE);
    libs[VGPU_LIB_NVML] = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NODELETE);
}

void *vgpu_real_lib(enum vgpu_lib lib)
{
    pthread_once(&libs_once, open_libs);
    return libs[lib];
}

static char self_path[4096];
static pthread_once_t self_once = PTHREAD_ONCE_INIT;
static void *self_base;

static void find_self(void)
{
    Dl_info info;
    if (dladdr((void *)&vgpu_real_dlsym, &info) != 0) {
        self_base = info.dli_fbase;
        if (info.dli_fname != NULL)
            snprintf(self_path, sizeof(self_path), "%s", info.dli_fname);
    }
}

int vgpu_is_own_address(const void *addr)
{
    pthread_once(&self_once, find_self);
    Dl_info info;
    return addr != NULL && dladdr(addr, &info) != 0 && info.dli_fbase == self_base;
}

const char *vgpu_self_path(void)
{
    pthread_once(&self_once, find_self);
    return self_path[0] ? self_path : NULL;
}

void *vgpu_real_fn(enum vgpu_lib lib, const char *name)
{
    void *h = vgpu_real_lib(lib);
    void *p = h != NULL ? vgpu_real_dlsym(h, name) : NULL;
    if (p == NULL)
        p = vgpu_real_dlsym(RTLD_NEXT, name);
    /* Never hand back one of our hooks as "the original": that would recurse forever. */
    if (p != NULL && vgpu_is_own_address(p))
        p = NULL;
    return p;
}

void *vgpu_real_cached(void **slot, enum vgpu_lib lib, const char *name)
{
    void *p = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (p == NULL) {
        p = vgpu_real_fn(lib, name);
        __atomic_store_n(slot, p, __ATOMIC_RELEASE);
    }
    return p;
}
