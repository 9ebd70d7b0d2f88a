/* The subset of the CUDA driver API the library hooks or calls, declared from NVIDIA's public
 * driver API documentation (docs.nvidia.com/cuda/cuda-driver-api). These are our own
 * declarations, not NVIDIA's header: the exported hooks carry the exact signature of each
 * versioned symbol (cuMemAlloc is the 32-bit v1 ABI, cuMemAlloc_v2 the size_t one). */
#ifndef VGPU_CUDA_ABI_H
#define VGPU_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t cuuint64_t;
typedef unsigned long long CUdeviceptr;    /* CUdeviceptr_v2 */
typedef unsigned int CUdeviceptr_v1;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUgreenCtx_st *CUgreenCtx;
typedef struct CUdevResourceDesc_st *CUdevResourceDesc;
typedef struct CUexecAffinityParam_st CUexecAffinityParam; /* only pointed to (cuCtxCreate_v3) */
typedef struct CUctxCreateParams_st CUctxCreateParams;     /* only pointed to (cuCtxCreate_v4) */

typedef struct {
    char bytes[16];
} CUuuid;

/* CUresult values used here. */
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_UNKNOWN 999

/* cuGetProcAddress flags (CUdriverProcAddress_flags). */
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2

/* CUdriverProcAddressQueryResult (cuGetProcAddress_v2's fifth argument). */
typedef enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;

/* cuMemAllocManaged flags (CUmemAttach_flags). */
#define CU_MEM_ATTACH_GLOBAL 0x1
#define CU_MEM_ATTACH_HOST 0x2

/* CUmemLocationType / CUmemAllocationType. */
#define CU_MEM_LOCATION_TYPE_INVALID 0
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEM_ALLOCATION_TYPE_PINNED 1

typedef struct {
    int type; /* CUmemLocationType */
    int id;
} CUmemLocation;

typedef struct {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

/* cuMemPoolCreate's properties (CUmemPoolProps_v1, 88 bytes); the library reads only location. */
typedef struct {
    int allocType;   /* CUmemAllocationType */
    int handleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;
_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps_v1 layout");

/* CUarray_format: the element size of one channel. */
#define CU_AD_FORMAT_UNSIGNED_INT8 0x01
#define CU_AD_FORMAT_UNSIGNED_INT16 0x02
#define CU_AD_FORMAT_UNSIGNED_INT32 0x03
#define CU_AD_FORMAT_SIGNED_INT8 0x08
#define CU_AD_FORMAT_SIGNED_INT16 0x09
#define CU_AD_FORMAT_SIGNED_INT32 0x0a
#define CU_AD_FORMAT_HALF 0x10
#define CU_AD_FORMAT_FLOAT 0x20

typedef struct {
    unsigned int Width;
    unsigned int Height;
    int Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;

typedef struct {
    size_t Width;
    size_t Height;
    int Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
    unsigned int Width;
    unsigned int Height;
    unsigned int Depth;
    int Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

typedef struct {
    size_t Width;
    size_t Height;
    size_t Depth;
    int Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/* Calls the library makes itself (through the real table, never these symbols). */
typedef CUresult (*cu_init_fn)(unsigned int);
typedef CUresult (*cu_device_get_uuid_fn)(CUuuid *, CUdevice);
typedef CUresult (*cu_ctx_get_device_fn)(CUdevice *);
typedef CUresult (*cu_device_total_mem_fn)(size_t *, CUdevice);
typedef CUresult (*cu_mem_get_info_fn)(size_t *, size_t *);
typedef CUresult (*cu_get_proc_address_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*cu_get_proc_address_v2_fn)(const char *, void **, int, cuuint64_t,
                                              CUdriverProcAddressQueryResult *);

#endif
