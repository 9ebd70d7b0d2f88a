/*
 * How a fake library (csrc/fakecuda, csrc/fakenvml) finds its GPUs, its state and who its caller is.
 *
 * Env mode, when FAKE_NVML_PROFILE is set: the profile it names, the state of FAKE_GPU_STATE,
 * pids as FAKE_GPU_HOST_PROC says (state.h). Every GPU of the profile is present.
 *
 * Kernel mode, otherwise, as a real driver learns them from its kernel module: the library finds
 * its own file (dladdr); a file in one of the NVIDIA container toolkit's library directories
 * (/usr/lib/x86_64-linux-gnu, /usr/lib64, /lib/x86_64-linux-gnu, /lib64, /usr/lib, /lib, and the
 * .../nvidia/current ones) lies in a driver root R, the prefix before that directory ("" for /).
 * It connects to the fake kernel at R/run/nvidia-persistenced/socket (kernel.h), which sends the
 * profile, the state file and the caller's host pid, and keeps the connection open. A GPU is present
 * only if R/dev/nvidia<minor> is a character device 195:<minor>, as the real driver sees only the
 * device nodes a container was given.
 */
#ifndef FAKESTATE_DRIVER_H
#define FAKESTATE_DRIVER_H

#include <stddef.h>

#include "profile.h"

/* Load the profile into *profile and attach the state, in either mode. 0, or -1 with *why set. */
int fs_driver_open(fake_profile *profile, char *why, size_t why_size);

/* Detach the state and close the kernel connection (the fake NVML's last nvmlShutdown). */
void fs_driver_close(void);

/* Whether the open driver is in kernel mode. */
int fs_driver_kernel_mode(void);

/* Whether `g` is present to this process (always, in env mode). */
int fs_gpu_present(const fake_gpu *g);

#endif
