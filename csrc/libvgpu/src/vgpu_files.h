/* Byte layouts of the three files the library shares with its peers (other processes of the
 * container and vgpud on the host), byte-compatible with the reference (vgpu-manager library;
 * reference/libvgpu.md §3, §4). Every multi-byte field is little-endian (the only byte order
 * the library is built for: x86-64, arm64). Every offset is pinned by a static assert below;
 * vgpud's Python side (vgpud/partition/libfiles.py) holds the same table, and
 * tests/unit/test_libfiles.py compares the two through build/libvgpu/tests/files_layout.
 *
 * Container paths (the node side bind-mounts the per-container host directories there):
 *   vgpu.config       /etc/vgpu-manager/config/vgpu.config   limits + identity, written from env
 *                      by the first library process in DRA mode (OFD write lock on byte 0, no
 *                      O_TRUNC: ftruncate 0, pwrite, ftruncate VGPU_CONFIG_FILE_SIZE); a valid file
 *                      gets the env's entries in empty slots and its blank identity fields filled
 *                      (vgpu_config_merge); readers check the header. vgpud adds the entries of
 *                      devices hot-plugged into the running container in place, under the same
 *                      lock, creating a header-only file when no library process wrote one yet;
 *                      each library process adopts those its env does not name (vgpu_config_file.h).
 *   vmem_node.config  /tmp/.vmem_node/vmem_node.config       the ledger of device memory NVML cannot
 *                      see (managed/UVA, async bridge, capture), per device per host PID.
 *   sm_node.config    /tmp/.sm_node/sm_node.config           the container-wide token bucket
 *                      (CUDA_SM_SHARED_BUCKET); sampler election by an OFD lock on sm_node.lock.
 *   vgpu_<i>.lock     /tmp/.vgpu_lock/vgpu_<i>.lock           per host device index i: whole-file
 *                      OFD write lock held across the memory check and the real allocation.
 * The node side deletes vmem_node.config and sm_node.config (never sm_node.lock) at container
 * create (NRI mode) or Prepare (eager mode); the library recreates them. */
#ifndef VGPU_FILES_H
#define VGPU_FILES_H

#include <stddef.h>
#include <stdint.h>

/* ---- paths ---------------------------------------------------------------------------------- */
#define VGPU_CONFIG_DIR "/etc/vgpu-manager/config"
#define VGPU_CONFIG_PATH VGPU_CONFIG_DIR "/vgpu.config"
#define VGPU_VMEM_NODE_DIR "/tmp/.vmem_node"
#define VGPU_VMEM_NODE_PATH VGPU_VMEM_NODE_DIR "/vmem_node.config"
#define VGPU_SM_NODE_DIR "/tmp/.sm_node"
#define VGPU_SM_NODE_PATH VGPU_SM_NODE_DIR "/sm_node.config"
#define VGPU_SM_NODE_LOCK_PATH VGPU_SM_NODE_DIR "/sm_node.lock"
#define VGPU_LOCK_DIR "/tmp/.vgpu_lock"
/* snprintf(buf, n, VGPU_LOCK_PATH_FMT, host_index) */
#define VGPU_LOCK_PATH_FMT VGPU_LOCK_DIR "/vgpu_%d.lock"

/* Host NVML device indexes 0..15: the `<i>` of every per-device env name and array below. */
#define VGPU_MAX_DEVICES 16

/* ---- vgpu.config ---------------------------------------------------------------------------- */
#define VGPU_CONFIG_MAGIC 0x56474346u /* "FCGV" in file byte order */
#define VGPU_CONFIG_LAYOUT 1u
#define VGPU_CONFIG_FILE_SIZE 8192u   /* the file; the struct is its first 2560 bytes, rest zero */
#define VGPU_CONFIG_STRUCT_SIZE 2560u
#define VGPU_CONFIG_DEVICES_OFFSET 512u
#define VGPU_UUID_LEN 48
#define VGPU_NAME_LEN 64
#define VGPU_DRIVER_VERSION_LEN 32

/* One device's limits, 128 bytes. Strings are NUL-padded (not necessarily NUL-terminated when
 * full: read at most the field's length). Integer flags are 0/1. */
struct vgpu_config_device {
    uint32_t seq;                 /* @0  seqlock: odd while a writer updates the entry */
    uint32_t _pad0;               /* @4 */
    char uuid[VGPU_UUID_LEN];     /* @8  "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
    uint64_t total_memory;        /* @56 bytes the container may use (the limit) */
    uint64_t real_memory;         /* @64 bytes of real device memory (limit / ratio when oversold) */
    int32_t hard_core;            /* @72 CUDA_CORE_LIMIT_<i>, percent */
    int32_t soft_core;            /* @76 CUDA_CORE_SOFT_LIMIT_<i>, percent */
    int32_t core_limit;           /* @80 1 when the core limit is enforced */
    int32_t hard_limit;           /* @84 1 when the core limit is hard (no soft burst) */
    int32_t memory_limit;         /* @88 1 when the memory limit is enforced */
    int32_t memory_oversold;      /* @92 1 when CUDA_MEM_RATIO_<i> > 1 / CUDA_MEM_OVERSOLD_<i> */
    int32_t activate;             /* @96 1 when this entry describes a device of the container */
    int32_t hotplug;              /* @100 1: added by vgpud for a device hot-plugged into the running
                                   * container (not in its env); 0 in every entry the library writes */
    uint8_t _pad1[24];            /* @104 */
};

struct vgpu_config {
    uint32_t magic;                               /* @0   VGPU_CONFIG_MAGIC */
    uint32_t layout;                              /* @4   VGPU_CONFIG_LAYOUT */
    uint32_t size;                                /* @8   VGPU_CONFIG_STRUCT_SIZE */
    uint32_t count;                               /* @12  VGPU_MAX_DEVICES */
    int32_t cuda_version_major;                   /* @16  cuDriverGetVersion / 1000 */
    int32_t cuda_version_minor;                   /* @20  (cuDriverGetVersion % 1000) / 10 */
    char driver_version[VGPU_DRIVER_VERSION_LEN]; /* @24  nvmlSystemGetDriverVersion */
    uint8_t _pad0[72];                            /* @56 */
    char pod_uid[VGPU_UUID_LEN];                  /* @128 VGPU_POD_UID */
    char pod_name[VGPU_NAME_LEN];                 /* @176 VGPU_POD_NAME */
    char pod_namespace[VGPU_NAME_LEN];            /* @240 VGPU_POD_NAMESPACE */
    char container_name[VGPU_NAME_LEN];           /* @304 VGPU_CONTAINER_NAME */
    char reg_uuid[VGPU_UUID_LEN];                 /* @368 MANAGER_CLIENT_REGISTER_UUID */
    int32_t compatibility_mode;                   /* @416 MANAGER_COMPATIBILITY_MODE */
    int32_t sm_watcher;                           /* @420 EXTERNAL_SM_WATCHER_ENABLED */
    int32_t vmem_node;                            /* @424 VMEMORY_NODE_ENABLED */
    uint8_t _pad1[84];                            /* @428 */
    struct vgpu_config_device devices[VGPU_MAX_DEVICES]; /* @512, 16 x 128 */
};

/* ---- vmem_node.config ----------------------------------------------------------------------- */
#define VGPU_VMEM_MAGIC 0x564D4E44u /* "DNMV" in file byte order */
#define VGPU_VMEM_LAYOUT 1u
#define VGPU_VMEM_FILE_SIZE (320u * 1024u) /* 327680; the struct is its first 262400 bytes */
#define VGPU_VMEM_STRUCT_SIZE 262400u
#define VGPU_VMEM_DEVICES_OFFSET 128u
#define VGPU_VMEM_MAX_PROCESSES 1024
#define VGPU_VMEM_DEVICE_STRIDE 16392u

/* One ledger entry, 16 bytes (natural alignment: 4 bytes of padding after pid). pid 0 = free. */
struct vgpu_vmem_process {
    int32_t pid;   /* @0 host PID (as the library sees it: its own getpid in host-PID mode) */
    uint32_t _pad; /* @4 */
    uint64_t used; /* @8 bytes charged to this PID on this device that NVML does not report */
};

/* One device's ledger, 16392 bytes. Entries [0, processes_size) are live and compact;
 * processes_size only grows or shrinks under the device's byte lock. */
struct vgpu_vmem_device {
    struct vgpu_vmem_process processes[VGPU_VMEM_MAX_PROCESSES]; /* @0 */
    uint32_t processes_size; /* @16384 */
    uint8_t lock_byte;       /* @16388 the byte locked (fcntl F_OFD_SETLKW, l_len 1) around every
                              * read-modify-write of this device; vgpud reads under it as well */
    uint8_t _pad[3];         /* @16389 */
};

struct vgpu_vmem_node {
    uint32_t magic;  /* @0  VGPU_VMEM_MAGIC */
    uint32_t layout; /* @4  VGPU_VMEM_LAYOUT */
    uint32_t size;   /* @8  VGPU_VMEM_STRUCT_SIZE */
    uint32_t count;  /* @12 VGPU_MAX_DEVICES */
    uint8_t _pad[112];                                   /* @16 */
    struct vgpu_vmem_device devices[VGPU_MAX_DEVICES];   /* @128, stride 16392 */
};

/* File offset of device d's lock byte (for struct flock.l_start). */
#define VGPU_VMEM_LOCK_OFFSET(d) \
    (VGPU_VMEM_DEVICES_OFFSET + (uint64_t)(d) * VGPU_VMEM_DEVICE_STRIDE + 16388u)

/* ---- sm_node.config ------------------------------------------------------------------------- */
/* The container-wide token bucket (CUDA_SM_SHARED_BUCKET), shared by every process of the
 * container through a MAP_SHARED mmap. The reference fixes only the file size, the magic and
 * the layout number; the fields are this project's (layout 3 of this file format is ours).
 *
 * Protocol (for the core controller):
 *   - Creation: open O_RDWR|O_CREAT 0666, OFD write lock on byte 0 of sm_node.config while
 *     checking/initialising; a file whose header is not {SMND, 3, size, 16} is rebuilt in
 *     place (ftruncate 0, ftruncate VGPU_SM_FILE_SIZE, write the header last).
 *   - Tokens: `tokens` is only changed by atomic ops (__atomic_*, seq_cst or acq_rel) on the
 *     mapped field: launches CAS-subtract their cost (may go negative), refills atomic-add
 *     the controller's `share` and then clamp to `ceiling` with a CAS loop.
 *   - Sampler: exactly one process samples NVML utilization for the container: the holder of
 *     an OFD write lock on sm_node.lock (non-blocking attempt by each process's watcher; the
 *     kernel releases it when the holder dies, and the next watcher takes over). The holder
 *     writes its pid to `sampler_pid` and bumps `sampler_heartbeat_ns` each cycle.
 *   - Refill: elected by CAS on a device's `last_refill_ns` (CLOCK_MONOTONIC ns, one clock
 *     per machine, so valid across the container's processes): a process whose
 *     now - last_refill_ns >= VGPU_SM_REFILL_PERIOD_NS and whose CAS from the old value to now
 *     succeeds adds `share` once.
 *   - The sampler stores `util` (the container's measured SM share, per-mille) and the new
 *     `share`; every field other than `tokens` and `last_refill_ns` is written only by the
 *     sampler, with __atomic_store_n, and read with __atomic_load_n. */
#define VGPU_SM_MAGIC 0x444E4D53u /* the bytes "SMND" in file order */
#define VGPU_SM_LAYOUT 3u
#define VGPU_SM_FILE_SIZE 8192u
#define VGPU_SM_STRUCT_SIZE 2176u
#define VGPU_SM_DEVICES_OFFSET 128u
#define VGPU_SM_REFILL_PERIOD_NS 90000000ull

/* One device's bucket, 128 bytes (two cache lines: the hot `tokens` alone with the refill
 * clock in the first, the sampler's fields in the second). */
struct vgpu_sm_device {
    int64_t tokens;            /* @0  bucket level in blocks; launches subtract, refills add */
    uint64_t last_refill_ns;   /* @8  CLOCK_MONOTONIC ns of the last refill (CAS-elected) */
    uint8_t _pad0[48];         /* @16 */
    int64_t ceiling;           /* @64 cap of `tokens`: SMs x maxThreadsPerSM x 32 */
    int64_t share;             /* @72 tokens added per refill, set by the controller */
    uint64_t last_sample_ns;   /* @80 CLOCK_MONOTONIC ns of the sampler's last NVML sample */
    int32_t util;              /* @88 container's SM utilization at the last sample, per-mille;
                                * -1 while no sample could be taken */
    int32_t limit;             /* @92 effective core limit now, percent (hard, or soft in burst) */
    int32_t hard_core;         /* @96 CUDA_CORE_LIMIT_<i> as the sampler read it, percent */
    int32_t soft_core;         /* @100 CUDA_CORE_SOFT_LIMIT_<i>, percent (0 = none) */
    int32_t active;            /* @104 0 unused, 2 being set up by one process (CAS from 0), 1 ready */
    uint8_t _pad1[20];         /* @108 */
};

struct vgpu_sm_node {
    uint32_t magic;                /* @0  VGPU_SM_MAGIC */
    uint32_t layout;               /* @4  VGPU_SM_LAYOUT */
    uint32_t size;                 /* @8  VGPU_SM_STRUCT_SIZE */
    uint32_t count;                /* @12 VGPU_MAX_DEVICES */
    int32_t sampler_pid;           /* @16 pid of the process holding sm_node.lock (0: none yet) */
    uint32_t _pad0;                /* @20 */
    uint64_t sampler_heartbeat_ns; /* @24 CLOCK_MONOTONIC ns of the sampler's last cycle */
    uint8_t _pad1[96];             /* @32 */
    struct vgpu_sm_device devices[VGPU_MAX_DEVICES]; /* @128, 16 x 128 */
};

/* ---- the pinned offsets --------------------------------------------------------------------- */
#define VGPU_AT(T, f, n) _Static_assert(offsetof(T, f) == (n), #T "." #f " at " #n)

VGPU_AT(struct vgpu_config_device, seq, 0);
VGPU_AT(struct vgpu_config_device, uuid, 8);
VGPU_AT(struct vgpu_config_device, total_memory, 56);
VGPU_AT(struct vgpu_config_device, real_memory, 64);
VGPU_AT(struct vgpu_config_device, hard_core, 72);
VGPU_AT(struct vgpu_config_device, soft_core, 76);
VGPU_AT(struct vgpu_config_device, core_limit, 80);
VGPU_AT(struct vgpu_config_device, hard_limit, 84);
VGPU_AT(struct vgpu_config_device, memory_limit, 88);
VGPU_AT(struct vgpu_config_device, memory_oversold, 92);
VGPU_AT(struct vgpu_config_device, activate, 96);
VGPU_AT(struct vgpu_config_device, hotplug, 100);
_Static_assert(sizeof(struct vgpu_config_device) == 128, "vgpu_config_device is 128 bytes");

VGPU_AT(struct vgpu_config, magic, 0);
VGPU_AT(struct vgpu_config, layout, 4);
VGPU_AT(struct vgpu_config, size, 8);
VGPU_AT(struct vgpu_config, count, 12);
VGPU_AT(struct vgpu_config, cuda_version_major, 16);
VGPU_AT(struct vgpu_config, cuda_version_minor, 20);
VGPU_AT(struct vgpu_config, driver_version, 24);
VGPU_AT(struct vgpu_config, pod_uid, 128);
VGPU_AT(struct vgpu_config, pod_name, 176);
VGPU_AT(struct vgpu_config, pod_namespace, 240);
VGPU_AT(struct vgpu_config, container_name, 304);
VGPU_AT(struct vgpu_config, reg_uuid, 368);
VGPU_AT(struct vgpu_config, compatibility_mode, 416);
VGPU_AT(struct vgpu_config, sm_watcher, 420);
VGPU_AT(struct vgpu_config, vmem_node, 424);
VGPU_AT(struct vgpu_config, devices, 512);
_Static_assert(sizeof(struct vgpu_config) == VGPU_CONFIG_STRUCT_SIZE, "vgpu_config is 2560 bytes");
_Static_assert(VGPU_CONFIG_DEVICES_OFFSET == offsetof(struct vgpu_config, devices), "devices @512");

VGPU_AT(struct vgpu_vmem_process, pid, 0);
VGPU_AT(struct vgpu_vmem_process, used, 8);
_Static_assert(sizeof(struct vgpu_vmem_process) == 16, "vgpu_vmem_process is 16 bytes");
VGPU_AT(struct vgpu_vmem_device, processes, 0);
VGPU_AT(struct vgpu_vmem_device, processes_size, 16384);
VGPU_AT(struct vgpu_vmem_device, lock_byte, 16388);
_Static_assert(sizeof(struct vgpu_vmem_device) == VGPU_VMEM_DEVICE_STRIDE, "vmem device stride 16392");
VGPU_AT(struct vgpu_vmem_node, magic, 0);
VGPU_AT(struct vgpu_vmem_node, layout, 4);
VGPU_AT(struct vgpu_vmem_node, size, 8);
VGPU_AT(struct vgpu_vmem_node, count, 12);
VGPU_AT(struct vgpu_vmem_node, devices, 128);
_Static_assert(sizeof(struct vgpu_vmem_node) == VGPU_VMEM_STRUCT_SIZE, "vmem_node is 262400 bytes");
_Static_assert(VGPU_VMEM_STRUCT_SIZE <= VGPU_VMEM_FILE_SIZE, "vmem_node fits its file");

VGPU_AT(struct vgpu_sm_device, tokens, 0);
VGPU_AT(struct vgpu_sm_device, last_refill_ns, 8);
VGPU_AT(struct vgpu_sm_device, ceiling, 64);
VGPU_AT(struct vgpu_sm_device, share, 72);
VGPU_AT(struct vgpu_sm_device, last_sample_ns, 80);
VGPU_AT(struct vgpu_sm_device, util, 88);
VGPU_AT(struct vgpu_sm_device, limit, 92);
VGPU_AT(struct vgpu_sm_device, hard_core, 96);
VGPU_AT(struct vgpu_sm_device, soft_core, 100);
VGPU_AT(struct vgpu_sm_device, active, 104);
_Static_assert(sizeof(struct vgpu_sm_device) == 128, "vgpu_sm_device is 128 bytes");
VGPU_AT(struct vgpu_sm_node, magic, 0);
VGPU_AT(struct vgpu_sm_node, layout, 4);
VGPU_AT(struct vgpu_sm_node, size, 8);
VGPU_AT(struct vgpu_sm_node, count, 12);
VGPU_AT(struct vgpu_sm_node, sampler_pid, 16);
VGPU_AT(struct vgpu_sm_node, sampler_heartbeat_ns, 24);
VGPU_AT(struct vgpu_sm_node, devices, 128);
_Static_assert(sizeof(struct vgpu_sm_node) == VGPU_SM_STRUCT_SIZE, "sm_node is 2176 bytes");
_Static_assert(VGPU_SM_STRUCT_SIZE <= VGPU_SM_FILE_SIZE, "sm_node fits its file");

#undef VGPU_AT

#endif
