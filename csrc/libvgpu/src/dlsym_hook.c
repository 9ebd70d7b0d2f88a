/* The dlsym hook and cuGetProcAddress routing (reference §1). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_abi.h"
#include "hooks.h"

/* --- the sorted driver-pointer -> exact-name index ----------------------------------------- */

static const char *const known_names[] = {
#define VGPU_NAME(n) #n,
#include "cuda_names.def"
#undef VGPU_NAME
};

struct index_entry {
    uintptr_t fn;
    const char *name;
    int hooked;
};

static struct index_entry *fn_index;
static size_t fn_index_len;
static pthread_once_t index_once = PTHREAD_ONCE_INIT;

static int by_fn(const void *a, const void *b)
{
    const struct index_entry *x = a, *y = b;
    if (x->fn != y->fn)
        return x->fn < y->fn ? -1 : 1;
    /* Aliases (one driver function under several names): the hooked name first, so they share
     * its hook. */
    if (x->hooked != y->hooked)
        return y->hooked - x->hooked;
    return strcmp(x->name, y->name);
}

static void add_entry(void *lib, const char *name, int hooked)
{
    if (strncmp(name, "cu", 2) != 0)
        return; /* NVML hooks are not reachable through cuGetProcAddress */
    void *p = vgpu_real_dlsym(lib, name);
    if (p == NULL || vgpu_is_own_address(p))
        return;
    fn_index[fn_index_len++] = (struct index_entry){(uintptr_t)p, name, hooked};
}

static void build_index(void)
{
    void *lib = vgpu_real_lib(VGPU_LIB_CUDA);
    size_t nhooks;
    const struct vgpu_hook *hooks = vgpu_hooks(&nhooks);
    size_t nknown = sizeof(known_names) / sizeof(known_names[0]);
    fn_index = calloc(nhooks + nknown, sizeof(*fn_index));
    if (lib == NULL || fn_index == NULL)
        return;
    for (size_t i = 0; i < nhooks; i++)
        add_entry(lib, hooks[i].name, 1);
    for (size_t i = 0; i < nknown; i++)
        add_entry(lib, known_names[i], vgpu_hook_by_name(known_names[i]) != NULL);
    qsort(fn_index, fn_index_len, sizeof(*fn_index), by_fn);
}

/* The exact exported name of driver function `fn`, or NULL when it is not one we know. */
static const char *exact_name(void *fn)
{
    pthread_once(&index_once, build_index);
    size_t lo = 0, hi = fn_index_len;
    while (lo < hi) { /* first entry with fn_index[i].fn >= fn */
        size_t mid = (lo + hi) / 2;
        if (fn_index[mid].fn < (uintptr_t)fn)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < fn_index_len && fn_index[lo].fn == (uintptr_t)fn ? fn_index[lo].name : NULL;
}

/* Families whose versions changed the ABI under one base name: a name match could hand a caller
 * a hook with another arity, so they are routed by the driver's pointer only. */
static int abi_conflict(const char *symbol)
{
    static const char *const families[] = {
        "cuCtxCreate",         "cuMemAdvise",       "cuMemPrefetchAsync",         "cuStreamGetCaptureInfo",
        "cuGraphGetEdges",     "cuGraphAddNode",    "cuGraphAddDependencies",     "cuGraphRemoveDependencies",
        "cuGraphNodeGetDependencies", "cuGraphNodeGetDependentNodes", NULL,
    };
    for (int i = 0; families[i] != NULL; i++) {
        size_t n = strlen(families[i]);
        if (strncmp(symbol, families[i], n) == 0 && (symbol[n] == '\0' || symbol[n] == '_'))
            return 1;
    }
    return 0;
}

/* A hook named `<symbol>_vN` exists: the base name alone does not say which ABI the caller gets. */
static int has_versioned_hook(const char *symbol)
{
    char name[256];
    for (int v = 2; v <= 4; v++) {
        if (snprintf(name, sizeof(name), "%s_v%d", symbol, v) < (int)sizeof(name) && vgpu_hook_by_name(name))
            return 1;
    }
    return 0;
}

static void *hook_suffixed(const char *symbol, const char *suffix)
{
    char name[256];
    if (snprintf(name, sizeof(name), "%s%s", symbol, suffix) >= (int)sizeof(name))
        return NULL;
    return vgpu_hook_by_name(name);
}

void *vgpu_route_proc(const char *symbol, void *driver_fn, int cuda_version, unsigned long long flags)
{
    /* Already one of ours: the driver's cuGetProcAddress called the _v2 entry through the PLT,
     * which routed it once. */
    if (driver_fn == NULL || symbol == NULL || vgpu_is_own_address(driver_fn))
        return driver_fn;
    const char *name = exact_name(driver_fn);
    if (name != NULL) {
        void *hook = vgpu_hook_by_name(name);
        return hook != NULL ? hook : driver_fn; /* known but unhooked: the driver's pointer */
    }
    /* Unknown pointer: match by name, never for the ABI-conflict families. */
    if (abi_conflict(symbol))
        return driver_fn;
    if (strcmp(symbol, "cuGraphExecUpdate") == 0) {
        void *hook = vgpu_hook_by_name(cuda_version >= 12000 ? "cuGraphExecUpdate_v2" : "cuGraphExecUpdate");
        return hook != NULL ? hook : driver_fn;
    }
    if (has_versioned_hook(symbol))
        return driver_fn;
    void *hook = NULL;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        hook = hook_suffixed(symbol, "_ptsz");
        if (hook == NULL)
            hook = hook_suffixed(symbol, "_ptds");
    }
    if (hook == NULL)
        hook = vgpu_hook_by_name(symbol);
    return hook != NULL ? hook : driver_fn;
}

/* --- dlsym ------------------------------------------------------------------------------------ */

static __thread int dlsym_depth;
static void *self_handle;
static pthread_once_t self_once = PTHREAD_ONCE_INIT;

static void open_self(void)
{
    const char *path = vgpu_self_path();
    /* RTLD_NOLOAD: we are loaded already; this only gets a handle. Failure leaves the table. */
    if (path != NULL)
        self_handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
}

static void *find_hook(const char *symbol)
{
    pthread_once(&self_once, open_self);
    if (self_handle != NULL) {
        /* Our handle's scope is this library and its own dependencies (libc): never libcuda,
         * never the global scope, so a miss cannot resolve back into the hook (HAMi-core
         * PR #215). A hit must still be ours and listed. */
        void *p = vgpu_real_dlsym(self_handle, symbol);
        if (p != NULL && vgpu_is_own_address(p) && vgpu_hook_by_name(symbol) == p)
            return p;
    }
    return vgpu_hook_by_name(symbol);
}

/* glibc resolves RTLD_NEXT relative to its caller's return address, so every path that is not
 * a hook ends in a sibling call of the real dlsym: the caller glibc sees is the application's
 * (tests/unit/libvgpu check RTLD_NEXT from a library loaded after this one). */
static __attribute__((noinline)) void *hook_for(const char *symbol)
{
    dlsym_depth++;
    void *hook = find_hook(symbol);
    dlsym_depth--;
    return hook;
}

VGPU_EXPORT void *dlsym(void *handle, const char *symbol)
{
    vgpu_dlsym_fn real = vgpu_real_dlsym_fn();
    /* <dlfcn.h> declares symbol nonnull; callers still pass NULL, and glibc answers it with an
     * error rather than a crash, so read it through a copy the compiler cannot assume about. */
    const char *volatile name = symbol;
    if (dlsym_depth == 0 && name != NULL && vgpu_hook_family(symbol)) {
        /* Whatever the handle, RTLD_NEXT included: the caller asked for a function we replace. */
        void *hook = hook_for(symbol);
        if (hook != NULL)
            return hook;
    }
    return real(handle, symbol);
}
