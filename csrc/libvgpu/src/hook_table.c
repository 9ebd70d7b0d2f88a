/* The hook table (hooks.h): built from hooks_lib.def and core_hooks.def, sorted once. */
#include "hooks.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Declarations only to take the address; each hook is defined with its real prototype in its
 * own file, and this translation unit never calls them. */
#define VGPU_HOOK(name) extern void name(void);
#include "hooks_lib.def"
#include "core_hooks.def"
#undef VGPU_HOOK

#define VGPU_HOOK(name) {#name, (void *)&name},
static const struct vgpu_hook listed[] = {
#include "hooks_lib.def"
#include "core_hooks.def"
};
#undef VGPU_HOOK

#define N_HOOKS (sizeof(listed) / sizeof(listed[0]))

static struct vgpu_hook sorted[N_HOOKS];
static pthread_once_t sort_once = PTHREAD_ONCE_INIT;

static int by_name(const void *a, const void *b)
{
    return strcmp(((const struct vgpu_hook *)a)->name, ((const struct vgpu_hook *)b)->name);
}

static void sort_hooks(void)
{
    memcpy(sorted, listed, sizeof(listed));
    qsort(sorted, N_HOOKS, sizeof(sorted[0]), by_name);
}

const struct vgpu_hook *vgpu_hooks(size_t *count)
{
    pthread_once(&sort_once, sort_hooks);
    *count = N_HOOKS;
    return sorted;
}

void *vgpu_hook_by_name(const char *name)
{
    size_t n;
    const struct vgpu_hook *h = vgpu_hooks(&n);
    struct vgpu_hook key = {name, NULL};
    const struct vgpu_hook *hit = bsearch(&key, h, n, sizeof(*h), by_name);
    return hit != NULL ? hit->fn : NULL;
}

int vgpu_hook_family(const char *name)
{
    if (name[0] == 'c' && name[1] == 'u')
        return (name[2] >= 'A' && name[2] <= 'Z') || strncmp(name, "cudbg", 5) == 0;
    return strncmp(name, "nvml", 4) == 0 && name[4] >= 'A' && name[4] <= 'Z';
}
