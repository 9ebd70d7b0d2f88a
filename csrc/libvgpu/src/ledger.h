/* The vmem_node.config ledger (vgpu_files.h): device memory NVML does not show per process, per
 * device per PID, shared by the container's processes: managed memory (UVA), a stream-ordered
 * allocation until its stream's earlier work ended (ASYNC_BRIDGE, charged and retired inside its
 * hook), one made during a stream capture until the capture ends (CAPTURE); plus this process's
 * dptr -> {bytes, device, kind} list so a free retires the charge on the right device. */
#ifndef VGPU_LEDGER_H
#define VGPU_LEDGER_H

#include "real.h"

/* Charge / retire `bytes` for this process on host device `host`. 0, or -1 (no ledger file). */
VGPU_HIDDEN int vgpu_ledger_add(int host, unsigned long long bytes);
VGPU_HIDDEN void vgpu_ledger_sub(int host, unsigned long long bytes);

/* Σ of every live PID's charge on `host` (0 without a ledger file); dead PIDs (kill(pid,0) ==
 * ESRCH or zombie) are reaped when `reap` is set. */
VGPU_HIDDEN unsigned long long vgpu_ledger_sum(int host, int reap);

/* Remember / forget an allocation charged to the ledger. untrack: 1 and *host, *bytes when it
 * was one, else 0. */
VGPU_HIDDEN void vgpu_ledger_track(unsigned long long dptr, unsigned long long bytes, int host);
VGPU_HIDDEN int vgpu_ledger_untrack(unsigned long long dptr, int *host, unsigned long long *bytes);
/* The same for an allocation made under stream capture `capture` (its id), and the retirement of
 * every charge of that capture still tracked (at its end). */
VGPU_HIDDEN void vgpu_ledger_track_capture(unsigned long long dptr, unsigned long long bytes, int host,
                                           unsigned long long capture);
VGPU_HIDDEN void vgpu_ledger_retire_capture(unsigned long long capture);

/* Drop this process's entries from every device. */
VGPU_HIDDEN void vgpu_ledger_drop_self(void);

/* atexit + chained SIGTERM/SIGINT/SIGABRT handlers that drop this process's entries. */
VGPU_HIDDEN void vgpu_ledger_install_exit_handlers(void);

/* A forked child: the inherited dptr list and file mapping describe the parent. */
VGPU_HIDDEN void vgpu_ledger_after_fork(void);

#endif
