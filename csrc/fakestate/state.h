/*
 * The simulated GPUs' shared state: what the fake libcuda did, for the fake NVML to report.
 *
 * Env mode (fs_attach):
 *   FAKE_GPU_STATE=/path   one mmap'd file shared by every process that loads either fake; created
 *                          on first use from the profile. Unset: a private, in-process state.
 *   FAKE_GPU_HOST_PROC=/path  a procfs of the host's PID namespace (in a container: the host /proc
 *                          mounted in): pids are recorded and reaped as the host numbers them, as a
 *                          real driver's kernel module records them. Unset: getpid() and kill(2).
 *
 * Per device (NVML index): the device memory each host pid holds, which pids have a context, and
 * the kernel busy time each pid added (spans of wall time, serialized per device as if the kernels
 * ran one after another), so utilization is a rate over a window. Every access holds a pthread
 * mutex (threads) and an OFD lock on the file (processes; the kernel drops it when a holder dies).
 * Slots of dead pids (kill(pid, 0) == ESRCH, or a zombie) are dropped by every call that reads
 * or charges memory or reads busy time, as a real driver frees a dead process's memory.
 *
 * Kernel mode (fs_attach_kernel, csrc/fakestate/driver.h): the state file and this process's host
 * pid come from the fake kernel (csrc/fakekernel), which also maps the file itself
 * (fs_attach_file) and drops a process's slots when its connection closes (fs_drop_pid); readers
 * reap nothing.
 *
 * Health, per device, for the fake NVML's events: the XIDs raised on it (a sequence number and the
 * newest FS_XID_RING codes) and whether it is lost (fallen off the bus), with a count of losses.
 * Tests set them in a state file with fs_file_raise_xid / fs_file_set_lost (exported by the fake
 * NVML for tests/fakegpu_state.py), from any process, while the fakes run.
 */
#ifndef FAKESTATE_STATE_H
#define FAKESTATE_STATE_H

#include <stdint.h>

#include "profile.h"

#define FS_FLAG_CONTEXT 1u  /* the pid has a context on the device (a compute process) */
#define FS_FLAG_GRAPHICS 2u /* it also shows as a graphics process (FAKE_GPU_GRAPHICS=1) */

typedef struct {
    int pid;
    uint32_t flags;
    uint64_t bytes; /* device memory held, as NVML shows it now */
} fs_proc;

typedef struct {
    int pid;
    uint64_t busy_ns; /* kernel time inside the window */
} fs_busy;

/* Map the state for `profile` (idempotent), env mode. 0, or -1 with *why set. */
int fs_attach(const fake_profile *profile, char *why, unsigned long why_size);

/* Kernel mode: map the state file open on `fd` (an open file description of this process's own;
 * taken over, closed on failure); `host_pid` says this process's pid as the state records it (0:
 * unknown, nothing is charged). Idempotent. 0, or -1 with *why set. */
int fs_attach_kernel(const fake_profile *profile, int fd, int (*host_pid)(void), char *why,
                     unsigned long why_size);

/* The fake kernel's own mapping: the state file at `path`, created for `profile` as a fake's first
 * attach creates it. 0, or -1 with *why set. */
int fs_attach_file(const fake_profile *profile, const char *path, char *why, unsigned long why_size);
/* Drop every slot of `pid` (its memory, contexts and busy time), as a driver frees a dead process's. */
void fs_drop_pid(int pid);
/* Drop the slots of pids dead in this process's PID namespace (kill(2), zombies). */
void fs_reap_dead(void);

/* Unmap the state (the NVML fake's last nvmlShutdown), so the next fs_attach maps the state of
 * the then current FAKE_GPU_STATE and profile. Callers make sure no other thread is using it. */
void fs_detach(void);

/* CLOCK_REALTIME in ns: NVML's timestamps are wall-clock microseconds. */
uint64_t fs_now_ns(void);

/* Charge `bytes` of device memory to this pid; -1 when the device has not that much free. */
int fs_mem_alloc(unsigned int dev, uint64_t bytes);
/* The same for a stream-ordered allocation: reserved at once (the free-memory check of the next
 * allocation counts it), shown by NVML (fs_mem_used, fs_processes) only from `visible_ns` (fs_now_ns
 * clock; at once when not later than now). */
int fs_mem_alloc_at(unsigned int dev, uint64_t bytes, uint64_t visible_ns);
void fs_mem_free(unsigned int dev, uint64_t bytes);
/* Bytes held on `dev` by all pids as NVML shows them now (pending stream-ordered bytes left out),
 * and all of them (the driver's own view, cuMemGetInfo). */
uint64_t fs_mem_used(unsigned int dev);
uint64_t fs_mem_reserved(unsigned int dev);
uint64_t fs_mem_total(unsigned int dev);

/* This pid gains / drops a context on `dev`. */
void fs_context(unsigned int dev, int present);

/* Processes on `dev` with any of `flags` (or memory, when flags has FS_FLAG_CONTEXT): fills up to
 * `max` of them and returns how many there are. */
unsigned int fs_processes(unsigned int dev, uint32_t flags, fs_proc *out, unsigned int max);

/* A kernel of `cost_ns` from this pid: it starts when the device is free (or now) and occupies
 * it for cost_ns. Returns when it ends (fs_now_ns clock). */
uint64_t fs_launch(unsigned int dev, uint64_t cost_ns);

/* Kernel time of each pid on `dev` inside [t0, t1]: fills up to `max` pids with busy time > 0 and
 * returns how many there are. */
unsigned int fs_busy_by_pid(unsigned int dev, uint64_t t0, uint64_t t1, fs_busy *out, unsigned int max);
/* Kernel time of the whole device inside [t0, t1]. */
uint64_t fs_busy_device(unsigned int dev, uint64_t t0, uint64_t t1);

/* ---- health ---------------------------------------------------------------------------- */

#define FS_XID_RING 64 /* XIDs kept per device; a reader further behind misses the oldest */

/* XIDs raised on `dev` so far (the sequence number of the newest; 0: none). */
uint64_t fs_xid_seq(unsigned int dev);
/* The oldest XID raised on `dev` after sequence number *seen: 1 with *xid set and *seen advanced,
 * 0 when there is none. A reader more than FS_XID_RING behind skips what the ring dropped. */
int fs_next_xid(unsigned int dev, uint64_t *seen, uint64_t *xid);
/* Whether `dev` is lost now, and how many times it became lost. */
int fs_lost(unsigned int dev);
uint64_t fs_lost_gen(unsigned int dev);

/* Test control of the state FILE at `path` (created by a fake's first attach; not this process's
 * attached state, so any process may call them): raise XID `xid` on device `dev`, or make it lost /
 * restore it. 0, or -1 with *why set. */
int fs_file_raise_xid(const char *path, unsigned int dev, uint64_t xid, char *why, unsigned long why_size);
int fs_file_set_lost(const char *path, unsigned int dev, int lost, char *why, unsigned long why_size);

#endif
