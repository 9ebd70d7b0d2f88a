/*
 * fakenvml: a stand-in libnvidia-ml.so.1 for machines without GPUs (test support only).
 *
 * It serves the GPUs of a vgpud GPU profile, the same YAML file the mock backend reads, so that
 * vgpud's NVML backend runs its real code path (nvidia-ml-py -> ctypes -> this library) in CI and
 * must produce the same inventory as the mock backend. What the fake libcuda (csrc/fakecuda) does
 * shows here through their shared state (csrc/fakestate): used memory, the compute and graphics
 * process lists, and process / device utilization from simulated kernel time.
 *
 *   FAKE_NVML_PROFILE=/path/to/profile.yaml   read at nvmlInit* when not already initialized (env
 *                                             mode; unset: kernel mode, below)
 *   FAKE_GPU_STATE=/path                      the state shared with the fake libcuda (unset: none,
 *                                             no process uses the GPUs)
 *   FAKE_NVML_HIDE_PROCESS_MEMORY=1           process lists give usedGpuMemory as
 *                                             NVML_VALUE_NOT_AVAILABLE
 *
 * Health, from the shared state (tests set it with tests/fakegpu_state.py, through the
 * fakegpuRaiseXid / fakegpuSetLost entry points below): XID critical-error events through
 * nvmlEventSetCreate / nvmlDeviceRegisterEvents / nvmlEventSetWait_v2, and a lost GPU, on which every
 * device call (and a handle lookup) returns NVML_ERROR_GPU_IS_LOST until it is restored.
 *
 * MIG (see csrc/fakestate/profile.h for what a profile says of it): nvmlDeviceGetMigMode answers a
 * GPU's current and pending modes, NVML_ERROR_NOT_SUPPORTED on a GPU without MIG. A GPU in MIG mode
 * (current) has its MIG devices at MIG indices 0..n-1 of nvmlDeviceGetMigDeviceHandleByIndex (up to
 * nvmlDeviceGetMaxMigDeviceCount, 7; NVML_ERROR_NOT_FOUND for an empty place). A MIG handle answers
 * nvmlDeviceGetUUID, nvmlDeviceGetName ("<GPU name> MIG <profile>"), nvmlDeviceGetMemoryInfo(_v2)
 * (the instance's memory, none of it used), nvmlDeviceGetAttributes(_v2), nvmlDeviceGetGpuInstanceId,
 * nvmlDeviceGetComputeInstanceId, nvmlDeviceIsMigDeviceHandle and
 * nvmlDeviceGetDeviceHandleFromMigDeviceHandle; the other calls take GPU handles only
 * (NVML_ERROR_INVALID_ARGUMENT), and the instance calls on a GPU handle are NVML_ERROR_NOT_SUPPORTED.
 *
 * Kernel mode (csrc/fakestate/driver.h): without FAKE_NVML_PROFILE, a libnvidia-ml.so.1 in a driver
 * root's library directory gets the profile and the state from the fake kernel (csrc/fakekernel) of
 * that root. It enumerates only the GPUs whose device nodes the root has, numbered 0..n-1 in PCI
 * bus id order as real NVML numbers a container's GPUs; minor numbers, UUIDs and PCI ids stay the
 * GPUs' own. In env mode every GPU of the profile shows, at the profile's index.
 *
 * The profile is a flat YAML subset, defined in vgpud/gpu/profile.py and parsed by
 * csrc/fakestate/profile.c. A missing or unparsable profile (or state file, or in kernel mode no
 * fake kernel) makes nvmlInit* fail with NVML_ERROR_UNKNOWN, print one "fakenvml: ..." line to
 * stderr, and nvmlErrorString(NVML_ERROR_UNKNOWN) then says why.
 *
 * Struct layouts follow nvml.h (and nvidia-ml-py's ctypes mirrors of it). Not thread-safe: callers
 * serialize init and shutdown, as vgpud does.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "driver.h"
#include "profile.h"
#include "state.h"

#define EXPORT __attribute__((visibility("default")))

/* ---- the NVML ABI subset ---------------------------------------------------------------- */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE FAKE_PCI_BUS_ID_SIZE
#define NVML_STRING_MAX FAKE_STRING_MAX

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

typedef fake_pci nvmlPciInfo_t;

typedef struct {
    unsigned int version, value;
} nvmlDeviceAddressingMode_t;
#define nvmlDeviceAddressingMode_v1 ((unsigned int)(sizeof(nvmlDeviceAddressingMode_t) | (1 << 24)))

_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(nvmlMemory_v2 == 0x02000028, "nvmlMemory_v2 version");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
_Static_assert(nvmlDeviceAddressingMode_v1 == 0x1000008, "nvmlDeviceAddressingMode_v1 version");

/* ---- the served GPUs ---------------------------------------------------------------------- */

typedef fake_gpu *nvmlDevice_t;

static fake_profile profile;
static int init_count;
static char last_error[1200];
/* The enumerated GPUs by NVML index, and each GPU's NVML index by profile index (-1: not present).
 * The shared state is keyed by the profile index (fake_gpu.index) in both modes. */
static nvmlDevice_t visible[FAKE_MAX_GPUS];
static unsigned int visible_count;
static int nvml_index[FAKE_MAX_GPUS];

/* The MIG devices of the GPUs in MIG mode, by profile index and place. A MIG handle points in here,
 * never into the profile's GPUs, so each call tells the two kinds of handle apart by address. */
typedef struct {
    fake_gpu *parent; /* NULL: no MIG device in this place */
    unsigned int slot;
    char uuid[FAKE_STRING_MAX];
} mig_device;
static mig_device mig_devices[FAKE_MAX_GPUS][FAKE_MIG_SLICES];

/* ---- the exported NVML entry points -------------------------------------------------------- */

#define REQUIRE_INIT()                                                                            \
    do {                                                                                          \
        if (init_count == 0) return NVML_ERROR_UNINITIALIZED;                                     \
    } while (0)

static int valid(nvmlDevice_t device) {
    return device >= profile.gpus && device < profile.gpus + profile.count && nvml_index[device->index] >= 0;
}

/* A lost GPU (tests/fakegpu_state.py set_lost) answers nothing but NVML_ERROR_GPU_IS_LOST. */
#define REQUIRE_DEVICE(device, out)                                                               \
    do {                                                                                          \
        REQUIRE_INIT();                                                                           \
        if (!valid(device) || (out) == NULL) return NVML_ERROR_INVALID_ARGUMENT;                  \
        if (fs_lost((device)->index)) return NVML_ERROR_GPU_IS_LOST;                              \
    } while (0)

/* The MIG device a handle points to (its GPU present), or NULL for any other handle. */
static mig_device *as_mig(nvmlDevice_t device) {
    uintptr_t p = (uintptr_t)(void *)device, first = (uintptr_t)(void *)&mig_devices[0][0];
    if (p < first || p >= first + sizeof mig_devices || (p - first) % sizeof(mig_device) != 0) return NULL;
    mig_device *m = (mig_device *)(void *)device;
    return m->parent != NULL && valid(m->parent) ? m : NULL;
}

/* What a MIG handle's call answers before its own: an argument missing, or its GPU lost. */
static nvmlReturn_t mig_check(const mig_device *m, const void *out) {
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    return fs_lost(m->parent->index) ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

static nvmlReturn_t copy_out(const char *value, char *buffer, unsigned int length) {
    if (buffer == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) >= length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buffer, value);
    return NVML_SUCCESS;
}

/* Number the present GPUs: in env mode all, by profile index; in kernel mode those with a device
 * node, in PCI bus id order. */
static void enumerate(void) {
    const fake_gpu *order[FAKE_MAX_GPUS];
    if (fs_driver_kernel_mode())
        fake_profile_pci_order(&profile, order);
    else
        memcpy(order, profile.by_index, profile.count * sizeof order[0]);
    visible_count = 0;
    for (unsigned int i = 0; i < FAKE_MAX_GPUS; i++) nvml_index[i] = -1;
    for (unsigned int i = 0; i < profile.count; i++)
        if (fs_gpu_present(order[i])) {
            nvml_index[order[i]->index] = (int)visible_count;
            visible[visible_count++] = (nvmlDevice_t)order[i];
        }
    memset(mig_devices, 0, sizeof mig_devices);
    for (unsigned int i = 0; i < profile.count; i++) {
        fake_gpu *g = &profile.gpus[i];
        for (unsigned int slot = 0; g->mig_mode && slot < g->mig_count; slot++) {
            mig_device *m = &mig_devices[g->index][slot];
            m->parent = g;
            m->slot = slot;
            fake_mig_uuid(g, slot, m->uuid, sizeof m->uuid);
        }
    }
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (init_count > 0) {
        init_count++;
        return NVML_SUCCESS;
    }
    char why[1100];
    if (fs_driver_open(&profile, why, sizeof why) < 0) {
        memset(&profile, 0, sizeof profile);
        snprintf(last_error, sizeof last_error, "Unknown Error (fakenvml: %s)", why);
        fprintf(stderr, "fakenvml: %s\n", why);
        return NVML_ERROR_UNKNOWN;
    }
    enumerate();
    last_error[0] = '\0';
    init_count = 1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    REQUIRE_INIT();
    if (--init_count == 0) fs_driver_close();
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    case NVML_ERROR_UNKNOWN: return last_error[0] ? last_error : "Unknown Error";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    REQUIRE_INIT();
    return copy_out(profile.driver, version, length);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    REQUIRE_INIT();
    if (version == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *version = profile.cuda;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    return nvmlSystemGetCudaDriverVersion(version);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    REQUIRE_INIT();
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = visible_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    REQUIRE_INIT();
    if (device == NULL || index >= visible_count) return NVML_ERROR_INVALID_ARGUMENT;
    if (fs_lost(visible[index]->index)) return NVML_ERROR_GPU_IS_LOST;
    *device = visible[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    REQUIRE_DEVICE(device, index);
    *index = (unsigned int)nvml_index[device->index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    REQUIRE_INIT();
    mig_device *m = as_mig(device);
    if (m != NULL) {
        nvmlReturn_t rc = mig_check(m, uuid);
        return rc != NVML_SUCCESS ? rc : copy_out(m->uuid, uuid, length);
    }
    REQUIRE_DEVICE(device, uuid);
    return copy_out(device->uuid, uuid, length);
}

/* A MIG device's name is its GPU's and its profile's, as NVML gives it ("NVIDIA A100-SXM4-40GB MIG
 * 3g.20gb"); a GPU name too long for that loses its end, so the profile always shows. */
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    REQUIRE_INIT();
    mig_device *m = as_mig(device);
    if (m != NULL) {
        nvmlReturn_t rc = mig_check(m, name);
        if (rc != NVML_SUCCESS) return rc;
        const char *kind = m->parent->mig[m->slot]->name;
        char full[NVML_STRING_MAX];
        int room = (int)(sizeof full - 1 - strlen(" MIG ") - strlen(kind));
        snprintf(full, sizeof full, "%.*s MIG %s", room, m->parent->name, kind);
        return copy_out(full, name, length);
    }
    REQUIRE_DEVICE(device, name);
    return copy_out(device->name, name, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    REQUIRE_DEVICE(device, minor);
    *minor = device->minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, unsigned int *brand) {
    REQUIRE_DEVICE(device, brand);
    *brand = device->brand;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch) {
    REQUIRE_DEVICE(device, arch);
    *arch = device->arch;
    return NVML_SUCCESS;
}

/* A MIG device's memory: its profile's, none of it used. */
static unsigned long long mig_memory(const mig_device *m) {
    return (unsigned long long)m->parent->mig[m->slot]->memory_mib << 20;
}

/* Used memory is what the fake libcuda's processes hold on the device (FAKE_GPU_STATE). */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    REQUIRE_INIT();
    mig_device *m = as_mig(device);
    if (m != NULL) {
        nvmlReturn_t rc = mig_check(m, memory);
        if (rc == NVML_SUCCESS) *memory = (nvmlMemory_t){mig_memory(m), mig_memory(m), 0};
        return rc;
    }
    REQUIRE_DEVICE(device, memory);
    unsigned long long used = fs_mem_used(device->index);
    memory->total = device->memory;
    memory->used = used < device->memory ? used : device->memory;
    memory->free = device->memory - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    REQUIRE_INIT();
    mig_device *m = as_mig(device);
    if (m != NULL) {
        nvmlReturn_t rc = mig_check(m, memory);
        if (rc != NVML_SUCCESS) return rc;
        if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        *memory = (nvmlMemory_v2_t){nvmlMemory_v2, mig_memory(m), 0, mig_memory(m), 0};
        return NVML_SUCCESS;
    }
    REQUIRE_DEVICE(device, memory);
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long used = fs_mem_used(device->index);
    memory->total = device->memory;
    memory->reserved = 0;
    memory->used = used < device->memory ? used : device->memory;
    memory->free = device->memory - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    REQUIRE_DEVICE(device, pci);
    *pci = device->pci;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    REQUIRE_DEVICE(device, node);
    if (device->numa < 0) return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned int)device->numa;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    REQUIRE_DEVICE(device, major);
    if (minor == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *major = device->cc_major;
    *minor = device->cc_minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAddressingMode(nvmlDevice_t device, nvmlDeviceAddressingMode_t *mode) {
    REQUIRE_DEVICE(device, mode);
    if (mode->version != nvmlDeviceAddressingMode_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!(device->seen & K_ADDRESSING)) return NVML_ERROR_NOT_SUPPORTED;
    mode->value = device->addressing;
    return NVML_SUCCESS;
}

/* ---- processes and utilization, from the fake libcuda's shared state ------------------------- */

#define NVML_VALUE_NOT_AVAILABLE_UINT 0xFFFFFFFFu
#define NVML_VALUE_NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFull

/* FAKE_NVML_HIDE_PROCESS_MEMORY=1: usedGpuMemory reads NVML_VALUE_NOT_AVAILABLE, as real NVML reports
 * it where it may not see other processes' memory (e.g. without privileges, or under Windows WDDM). */
static int hide_process_memory(void) {
    const char *v = getenv("FAKE_NVML_HIDE_PROCESS_MEMORY");
    return v && strcmp(v, "1") == 0;
}

/* nvmlProcessInfo_v1_t: what the unsuffixed calls fill. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory; /* bytes; NVML_VALUE_NOT_AVAILABLE when unknown */
} nvmlProcessInfo_v1_t;

/* nvmlProcessInfo_v2_t, also what the _v3 calls fill (nvmlProcessInfo_t). */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId; /* 0xFFFFFFFF: not a MIG device */
} nvmlProcessInfo_v2_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp; /* CPU wall clock, microseconds */
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo_v1_t layout");
_Static_assert(sizeof(nvmlProcessInfo_v2_t) == 24, "nvmlProcessInfo_v2_t layout");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t layout");

#define MAX_PROCS 256

/* The common body of the process list calls: `stride` is the caller's struct size. */
static nvmlReturn_t list_processes(nvmlDevice_t device, unsigned int *count, void *infos, size_t stride,
                                   uint32_t flags) {
    REQUIRE_DEVICE(device, count);
    fs_proc procs[MAX_PROCS];
    unsigned int n = fs_processes(device->index, flags, procs, MAX_PROCS);
    if (n > MAX_PROCS) n = MAX_PROCS;
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    if (n > 0 && infos == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (hide_process_memory())
        for (unsigned int i = 0; i < n; i++) procs[i].bytes = NVML_VALUE_NOT_AVAILABLE_ULL;
    for (unsigned int i = 0; i < n; i++) {
        char *slot = (char *)infos + i * stride;
        if (stride == sizeof(nvmlProcessInfo_v1_t)) {
            nvmlProcessInfo_v1_t v1 = {(unsigned int)procs[i].pid, procs[i].bytes};
            memcpy(slot, &v1, sizeof v1);
        } else {
            nvmlProcessInfo_v2_t v2 = {(unsigned int)procs[i].pid, procs[i].bytes, NVML_VALUE_NOT_AVAILABLE_UINT,
                                       NVML_VALUE_NOT_AVAILABLE_UINT};
            memcpy(slot, &v2, sizeof v2);
        }
    }
    return NVML_SUCCESS;
}

#define PROCESS_LIST(name, info_t, flag)                                                             \
    EXPORT nvmlReturn_t name(nvmlDevice_t device, unsigned int *count, info_t *infos) {              \
        return list_processes(device, count, infos, sizeof *infos, flag);                            \
    }

/* Compute processes: every pid with a fake libcuda context or memory on the device. */
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, FS_FLAG_CONTEXT)
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_v2_t, FS_FLAG_CONTEXT)
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_v2_t, FS_FLAG_CONTEXT)

/* Graphics processes: those whose context was made with FAKE_GPU_GRAPHICS=1 (they are "C+G"). */
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t, FS_FLAG_GRAPHICS)
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_v2_t, FS_FLAG_GRAPHICS)
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_v2_t, FS_FLAG_GRAPHICS)

/* How far back a lastSeenTimeStamp of 0 (or an older one) reaches: the driver's sample buffer. */
#define SAMPLE_BUFFER_NS 10000000000ull
/* nvmlDeviceGetUtilizationRates' sample period. */
#define UTILIZATION_PERIOD_NS 1000000000ull

static unsigned int percent(uint64_t busy, uint64_t window) {
    if (window == 0) return 0;
    uint64_t p = (busy * 100 + window / 2) / window;
    return p > 100 ? 100 : (unsigned int)p;
}

/*
 * One sample per pid that ran kernels after lastSeenTimeStamp (microseconds): smUtil is its share
 * of the wall time from then (at most SAMPLE_BUFFER_NS back) to now. NOT_FOUND when none did;
 * utilization == NULL or a short buffer: INSUFFICIENT_SIZE with the count needed.
 */
static nvmlReturn_t process_utilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                        unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp) {
    REQUIRE_DEVICE(device, processSamplesCount);
    uint64_t now = fs_now_ns();
    uint64_t t0 = lastSeenTimeStamp > now / 1000 ? now : lastSeenTimeStamp * 1000;
    if (now - t0 > SAMPLE_BUFFER_NS) t0 = now - SAMPLE_BUFFER_NS;
    fs_busy busy[MAX_PROCS];
    unsigned int n = fs_busy_by_pid(device->index, t0, now, busy, MAX_PROCS);
    if (n > MAX_PROCS) n = MAX_PROCS;
    if (n == 0) return NVML_ERROR_NOT_FOUND;
    if (utilization == NULL || *processSamplesCount < n) {
        *processSamplesCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++)
        utilization[i] = (nvmlProcessUtilizationSample_t){(unsigned int)busy[i].pid, now / 1000,
                                                          percent(busy[i].busy_ns, now - t0), 0, 0, 0};
    *processSamplesCount = n;
    return NVML_SUCCESS;
}

/* FAKE_NVML_NO_PROCESS_UTILIZATION=1: NOT_SUPPORTED, as drivers that offer only the newer
 * nvmlDeviceGetProcessesUtilizationInfo. */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount,
                                                    unsigned long long lastSeenTimeStamp) {
    const char *off = getenv("FAKE_NVML_NO_PROCESS_UTILIZATION");
    if (off != NULL && strcmp(off, "1") == 0) return NVML_ERROR_NOT_SUPPORTED;
    return process_utilization(device, utilization, processSamplesCount, lastSeenTimeStamp);
}

/* gpu: the device's kernel time over the last second; memory (bandwidth): not simulated, 0. */
EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    REQUIRE_DEVICE(device, utilization);
    uint64_t now = fs_now_ns();
    utilization->gpu = percent(fs_busy_device(device->index, now - UTILIZATION_PERIOD_NS, now),
                               UTILIZATION_PERIOD_NS);
    utilization->memory = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    REQUIRE_INIT();
    if (uuid == NULL || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < visible_count; i++)
        if (strcmp(visible[i]->uuid, uuid) == 0) {
            if (fs_lost(visible[i]->index)) return NVML_ERROR_GPU_IS_LOST;
            *device = visible[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

/* nvmlProcessesUtilizationInfo_t (v1) and its entries. */
typedef struct {
    unsigned long long timeStamp;
    unsigned int pid, smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil;
} nvmlProcessUtilizationInfo_v1_t;

typedef struct {
    unsigned int version;
    unsigned int processSamplesCount;
    unsigned long long lastSeenTimeStamp;
    nvmlProcessUtilizationInfo_v1_t *procUtilArray;
} nvmlProcessesUtilizationInfo_v1_t;
#define nvmlProcessesUtilizationInfo_v1 ((unsigned int)(sizeof(nvmlProcessesUtilizationInfo_v1_t) | (1 << 24)))

_Static_assert(sizeof(nvmlProcessUtilizationInfo_v1_t) == 40, "nvmlProcessUtilizationInfo_v1_t layout");
_Static_assert(nvmlProcessesUtilizationInfo_v1 == 0x01000018, "nvmlProcessesUtilizationInfo_v1 version");

/* The newer form of nvmlDeviceGetProcessUtilization: the same samples, the same rules. */
EXPORT nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device, nvmlProcessesUtilizationInfo_v1_t *info) {
    REQUIRE_DEVICE(device, info);
    if (info->version != nvmlProcessesUtilizationInfo_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlProcessUtilizationSample_t samples[MAX_PROCS];
    unsigned int n = MAX_PROCS;
    nvmlReturn_t rc = process_utilization(device, samples, &n, info->lastSeenTimeStamp);
    if (rc != NVML_SUCCESS) return rc;
    if (info->procUtilArray == NULL || info->processSamplesCount < n) {
        info->processSamplesCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++)
        info->procUtilArray[i] = (nvmlProcessUtilizationInfo_v1_t){samples[i].timeStamp, samples[i].pid, samples[i].smUtil,
                                                                    0, 0, 0, 0, 0};
    info->processSamplesCount = n;
    return NVML_SUCCESS;
}

/* The compute mode: NVML_COMPUTEMODE_DEFAULT (0) until set, per process (no driver keeps it). */
static unsigned int compute_modes[FAKE_MAX_GPUS];

EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, unsigned int *mode) {
    REQUIRE_DEVICE(device, mode);
    *mode = compute_modes[device->index];
    return NVML_SUCCESS;
}

/* DEFAULT 0, EXCLUSIVE_THREAD 1 (deprecated), PROHIBITED 2, EXCLUSIVE_PROCESS 3. */
EXPORT nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, unsigned int mode) {
    REQUIRE_INIT();
    if (!valid(device) || mode > 3) return NVML_ERROR_INVALID_ARGUMENT;
    if (fs_lost(device->index)) return NVML_ERROR_GPU_IS_LOST;
    compute_modes[device->index] = mode;
    return NVML_SUCCESS;
}

/* ---- MIG -------------------------------------------------------------------------------- */

/* nvmlDeviceAttributes_t (nvml.h): what a MIG device is made of. */
typedef struct {
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount, sharedJpegCount,
        sharedOfaCount;
    unsigned int gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

_Static_assert(sizeof(nvmlDeviceAttributes_t) == 40, "nvmlDeviceAttributes_t layout");

/* A MIG handle is a MIG device (nvidia-ctk asks before it lists a GPU's device nodes). */
EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    REQUIRE_INIT();
    mig_device *m = as_mig(device);
    if (m != NULL) {
        nvmlReturn_t rc = mig_check(m, isMigDevice);
        if (rc == NVML_SUCCESS) *isMigDevice = 1;
        return rc;
    }
    REQUIRE_DEVICE(device, isMigDevice);
    *isMigDevice = 0;
    return NVML_SUCCESS;
}

/* NVML_DEVICE_MIG_ENABLE (1) or _DISABLE (0), now and after the next reset. */
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    REQUIRE_DEVICE(device, currentMode);
    if (pendingMode == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!fake_gpu_mig_capable(device)) return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = device->mig_mode;
    *pendingMode = device->mig_pending;
    return NVML_SUCCESS;
}

/* How many MIG devices the GPU may have: 7 in MIG mode, else 0. */
EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    REQUIRE_DEVICE(device, count);
    *count = device->mig_mode ? FAKE_MIG_SLICES : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *migDevice) {
    REQUIRE_DEVICE(device, migDevice);
    if (!device->mig_mode || index >= FAKE_MIG_SLICES) return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= device->mig_count) return NVML_ERROR_NOT_FOUND;
    *migDevice = (nvmlDevice_t)(void *)&mig_devices[device->index][index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    REQUIRE_INIT();
    mig_device *m = as_mig(migDevice);
    if (m == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = mig_check(m, device);
    if (rc == NVML_SUCCESS) *device = m->parent;
    return rc;
}

/* Copy engines: one per slice; decoders: the profile's; no encoder, JPEG or OFA engine. */
EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    REQUIRE_INIT();
    mig_device *m = as_mig(device);
    if (m == NULL) {
        REQUIRE_DEVICE(device, attributes);
        return NVML_ERROR_NOT_SUPPORTED;
    }
    nvmlReturn_t rc = mig_check(m, attributes);
    if (rc != NVML_SUCCESS) return rc;
    const fake_mig_profile *p = m->parent->mig[m->slot];
    *attributes = (nvmlDeviceAttributes_t){p->sm_count, p->slices, p->decoders, 0, 0, 0, p->slices, p->slices,
                                           p->memory_mib};
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    return nvmlDeviceGetAttributes_v2(device, attributes);
}

/* The ids of a MIG device's GPU instance and compute instance (see profile.h). */
static nvmlReturn_t mig_id(nvmlDevice_t device, unsigned int *id, unsigned int (*of)(unsigned int)) {
    REQUIRE_INIT();
    mig_device *m = as_mig(device);
    if (m == NULL) {
        REQUIRE_DEVICE(device, id);
        return NVML_ERROR_NOT_SUPPORTED;
    }
    nvmlReturn_t rc = mig_check(m, id);
    if (rc == NVML_SUCCESS) *id = of(m->slot);
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    return mig_id(device, id, fake_mig_gpu_instance_id);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    return mig_id(device, id, fake_mig_compute_instance_id);
}

/* Persistence mode: enabled (1), as on data-centre GPUs. */
EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, unsigned int *mode) {
    REQUIRE_DEVICE(device, mode);
    *mode = 1;
    return NVML_SUCCESS;
}

/* ---- health: XID events and lost GPUs, from the shared state ---------------------------------- */

#define nvmlEventTypeXidCriticalError 0x0000000000000008ull
/* The only event type the fake raises; registering another is NVML_ERROR_NOT_SUPPORTED. */
#define SUPPORTED_EVENTS nvmlEventTypeXidCriticalError
/* How often a waiting nvmlEventSetWait_v2 looks at the shared state (a lock-free read). */
#define EVENT_POLL_NS 5000000ull

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData; /* the XID */
    unsigned int gpuInstanceId, computeInstanceId; /* 0xFFFFFFFF: not a MIG device */
} nvmlEventData_t;

_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t layout");

/* Per NVML index: the registered event types (0: not registered), the last XID sequence number and
 * loss count delivered. Only events after the registration are delivered, as NVML does. */
typedef struct nvmlEventSet_st {
    unsigned long long types[FAKE_MAX_GPUS];
    uint64_t seen_xid[FAKE_MAX_GPUS];
    uint64_t seen_lost[FAKE_MAX_GPUS];
} *nvmlEventSet_t;

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    REQUIRE_INIT();
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof **set);
    return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    REQUIRE_INIT();
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    free(set);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    REQUIRE_DEVICE(device, types);
    *types = SUPPORTED_EVENTS;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    REQUIRE_DEVICE(device, set);
    if (types & ~SUPPORTED_EVENTS) return NVML_ERROR_NOT_SUPPORTED;
    unsigned int i = device->index;
    if (__atomic_load_n(&set->types[i], __ATOMIC_ACQUIRE) == 0) {
        set->seen_xid[i] = fs_xid_seq(i);
        set->seen_lost[i] = fs_lost_gen(i);
    }
    /* a wait in another thread may be reading the set: the marks above are published with the types */
    __atomic_or_fetch(&set->types[i], types, __ATOMIC_RELEASE);
    return NVML_SUCCESS;
}

/* The next event of a registered device: a loss since the last look (NVML_ERROR_GPU_IS_LOST, once
 * per loss), else its oldest undelivered XID; NVML_ERROR_TIMEOUT when none came in `timeoutms`. */
EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    REQUIRE_INIT();
    if (set == NULL || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint64_t start = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
    uint64_t deadline = start + (uint64_t)timeoutms * 1000000ull;
    for (;;) {
        for (unsigned int i = 0; i < profile.count; i++) {
            unsigned long long types = __atomic_load_n(&set->types[i], __ATOMIC_ACQUIRE);
            if (types == 0) continue;
            uint64_t gen = fs_lost_gen(i);
            if (gen != set->seen_lost[i]) {
                set->seen_lost[i] = gen;
                if (fs_lost(i)) return NVML_ERROR_GPU_IS_LOST;
            }
            uint64_t xid;
            if ((types & nvmlEventTypeXidCriticalError) && fs_next_xid(i, &set->seen_xid[i], &xid)) {
                *data = (nvmlEventData_t){profile.by_index[i], nvmlEventTypeXidCriticalError, xid, 0xFFFFFFFFu,
                                          0xFFFFFFFFu};
                return NVML_SUCCESS;
            }
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        uint64_t t = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
        if (t >= deadline) return NVML_ERROR_TIMEOUT;
        uint64_t nap = deadline - t < EVENT_POLL_NS ? deadline - t : EVENT_POLL_NS;
        struct timespec ts = {(time_t)(nap / 1000000000ull), (long)(nap % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

/* ---- test control (not NVML): tests/fakegpu_state.py --------------------------------------- */

/* Raise XID `xid` on GPU `index` of the state file `state_path`: every event set registered for it,
 * in any process sharing the file, delivers it. 0, or -1 with `why` filled. */
EXPORT int fakegpuRaiseXid(const char *state_path, unsigned int index, unsigned long long xid, char *why,
                           unsigned int why_size) {
    return fs_file_raise_xid(state_path, index, xid, why, why_size);
}

/* Make GPU `index` lost (lost != 0) or restore it. 0, or -1 with `why` filled. */
EXPORT int fakegpuSetLost(const char *state_path, unsigned int index, int lost, char *why, unsigned int why_size) {
    return fs_file_set_lost(state_path, index, lost, why, why_size);
}
