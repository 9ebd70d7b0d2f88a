/* Forced into every object of libvgpu-control.so (-include): bind the glibc functions whose
 * default version moved to GLIBC_2.34 (libdl and libpthread merged into libc) to their original
 * versions, so the library built here also loads into container images with an older glibc
 * (where they live in libdl.so.2 / libpthread.so.0, both NEEDED). A library that fails to load
 * would leave the container unlimited. tests/unit/libvgpu/test_structure.py checks the result. */
#ifndef VGPU_GLIBC_COMPAT_H
#define VGPU_GLIBC_COMPAT_H

#if defined(__x86_64__)
#define VGPU_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define VGPU_GLIBC_BASE "GLIBC_2.17"
#endif

#ifdef VGPU_GLIBC_BASE
__asm__(".symver dlopen,dlopen@" VGPU_GLIBC_BASE);
__asm__(".symver dladdr,dladdr@" VGPU_GLIBC_BASE);
__asm__(".symver dlvsym,dlvsym@" VGPU_GLIBC_BASE);
__asm__(".symver pthread_once,pthread_once@" VGPU_GLIBC_BASE);
__asm__(".symver pthread_mutex_trylock,pthread_mutex_trylock@" VGPU_GLIBC_BASE);
__asm__(".symver pthread_create,pthread_create@" VGPU_GLIBC_BASE);
__asm__(".symver pthread_join,pthread_join@" VGPU_GLIBC_BASE);
__asm__(".symver pthread_sigmask,pthread_sigmask@" VGPU_GLIBC_BASE);
__asm__(".symver pthread_mutex_timedlock,pthread_mutex_timedlock@" VGPU_GLIBC_BASE);
#endif

/* fstat and stat became real libc symbols only in GLIBC_2.33 (before, inlines over __fxstat and
 * __xstat): call the system calls instead, whose struct stat is glibc's on x86-64 and arm64. */
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
static inline int vgpu_fstat(int fd, struct stat *st) { return (int)syscall(SYS_fstat, fd, st); }
#define fstat vgpu_fstat
static inline int vgpu_stat(const char *path, struct stat *st)
{
    return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, 0);
}
#define stat(path, st) vgpu_stat(path, st)

#endif
