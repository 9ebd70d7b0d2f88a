/* The subset of NVML the library hooks or calls, declared from NVIDIA's public NVML API
 * reference (docs.nvidia.com/deploy/nvml-api); our own declarations, not NVIDIA's header. */
#ifndef VGPU_NVML_ABI_H
#define VGPU_NVML_ABI_H

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlUnit_st *nvmlUnit_t;
typedef struct nvmlUUID_st nvmlUUID_t; /* only pointed to (nvmlDeviceGetHandleByUUIDV) */

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_UNKNOWN 999

#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
/* usedGpuMemory when the driver cannot tell (e.g. Windows WDDM, or no permission). */
#define NVML_VALUE_NOT_AVAILABLE (~0ULL)

#define NVML_FEATURE_DISABLED 0
#define NVML_FEATURE_ENABLED 1

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

/* NVML_STRUCT_VERSION(Memory, 2) */
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

/* The 16-byte v1 process record of the unsuffixed nvmlDeviceGet*RunningProcesses. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef nvmlReturn_t (*nvml_init_fn)(void);
typedef nvmlReturn_t (*nvml_get_handle_by_uuid_fn)(const char *, nvmlDevice_t *);
typedef nvmlReturn_t (*nvml_get_uuid_fn)(nvmlDevice_t, char *, unsigned int);
typedef nvmlReturn_t (*nvml_get_processes_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_v1_t *);
typedef nvmlReturn_t (*nvml_get_memory_info_fn)(nvmlDevice_t, nvmlMemory_t *);

#endif
