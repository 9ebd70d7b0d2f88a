/*
 * The entry points cuGetProcAddress serves: (base name, CUDA version of the ABI variant, per-thread
 * stream variant?, exported name). A lookup takes the newest variant not newer than the caller's
 * version, as documented for cuGetProcAddress; the versions are those of cudaTypedefs.h's PFN_*_vNNNNN
 * typedefs (cuCtxCreate's _v4 is CUDA 13's default).
 */
#include "fakecuda.h"

#define FAKE_PROCS(X)                                                                              \
    X(cuInit, 2000, 0, cuInit)                                                                     \
    X(cuDriverGetVersion, 2020, 0, cuDriverGetVersion)                                             \
    X(cuGetProcAddress, 11030, 0, cuGetProcAddress)                                                \
    X(cuGetProcAddress, 12000, 0, cuGetProcAddress_v2)                                             \
    X(cuGetErrorName, 6000, 0, cuGetErrorName)                                                     \
    X(cuGetErrorString, 6000, 0, cuGetErrorString)                                                 \
    X(cuGetExportTable, 3000, 0, cuGetExportTable)                                                 \
    X(cuDeviceGet, 2000, 0, cuDeviceGet)                                                           \
    X(cuDeviceGetCount, 2000, 0, cuDeviceGetCount)                                                 \
    X(cuDeviceGetName, 2000, 0, cuDeviceGetName)                                                   \
    X(cuDeviceGetUuid, 9020, 0, cuDeviceGetUuid)                                                   \
    X(cuDeviceGetUuid, 11040, 0, cuDeviceGetUuid_v2)                                               \
    X(cuDeviceGetAttribute, 2000, 0, cuDeviceGetAttribute)                                         \
    X(cuDeviceTotalMem, 2000, 0, cuDeviceTotalMem)                                                 \
    X(cuDeviceTotalMem, 3020, 0, cuDeviceTotalMem_v2)                                              \
    X(cuDeviceComputeCapability, 2000, 0, cuDeviceComputeCapability)                               \
    X(cuDeviceGetPCIBusId, 4010, 0, cuDeviceGetPCIBusId)                                           \
    X(cuDeviceGetDefaultMemPool, 11020, 0, cuDeviceGetDefaultMemPool)                              \
    X(cuDeviceGetMemPool, 11020, 0, cuDeviceGetMemPool)                                            \
    X(cuDevicePrimaryCtxRetain, 7000, 0, cuDevicePrimaryCtxRetain)                                 \
    X(cuDevicePrimaryCtxRelease, 7000, 0, cuDevicePrimaryCtxRelease)                               \
    X(cuDevicePrimaryCtxRelease, 11000, 0, cuDevicePrimaryCtxRelease_v2)                           \
    X(cuDevicePrimaryCtxReset, 7000, 0, cuDevicePrimaryCtxReset)                                   \
    X(cuDevicePrimaryCtxReset, 11000, 0, cuDevicePrimaryCtxReset_v2)                               \
    X(cuDevicePrimaryCtxSetFlags, 7000, 0, cuDevicePrimaryCtxSetFlags)                             \
    X(cuDevicePrimaryCtxSetFlags, 11000, 0, cuDevicePrimaryCtxSetFlags_v2)                         \
    X(cuDevicePrimaryCtxGetState, 7000, 0, cuDevicePrimaryCtxGetState)                             \
    X(cuCtxCreate, 2000, 0, cuCtxCreate)                                                           \
    X(cuCtxCreate, 3020, 0, cuCtxCreate_v2)                                                        \
    X(cuCtxCreate, 11040, 0, cuCtxCreate_v3)                                                       \
    X(cuCtxCreate, 13000, 0, cuCtxCreate_v4)                                                       \
    X(cuCtxDestroy, 2000, 0, cuCtxDestroy)                                                         \
    X(cuCtxDestroy, 4000, 0, cuCtxDestroy_v2)                                                      \
    X(cuCtxPushCurrent, 2000, 0, cuCtxPushCurrent)                                                 \
    X(cuCtxPushCurrent, 4000, 0, cuCtxPushCurrent_v2)                                              \
    X(cuCtxPopCurrent, 2000, 0, cuCtxPopCurrent)                                                   \
    X(cuCtxPopCurrent, 4000, 0, cuCtxPopCurrent_v2)                                                \
    X(cuCtxSetCurrent, 4000, 0, cuCtxSetCurrent)                                                   \
    X(cuCtxGetCurrent, 4000, 0, cuCtxGetCurrent)                                                   \
    X(cuCtxGetDevice, 2000, 0, cuCtxGetDevice)                                                     \
    X(cuCtxSynchronize, 2000, 0, cuCtxSynchronize)                                                 \
    X(cuMemAlloc, 2000, 0, cuMemAlloc)                                                             \
    X(cuMemAlloc, 3020, 0, cuMemAlloc_v2)                                                          \
    X(cuMemAllocPitch, 2000, 0, cuMemAllocPitch)                                                   \
    X(cuMemAllocPitch, 3020, 0, cuMemAllocPitch_v2)                                                \
    X(cuMemAllocManaged, 6000, 0, cuMemAllocManaged)                                               \
    X(cuMemAllocAsync, 11020, 0, cuMemAllocAsync)                                                  \
    X(cuMemAllocAsync, 11020, 1, cuMemAllocAsync_ptsz)                                             \
    X(cuMemAllocFromPoolAsync, 11020, 0, cuMemAllocFromPoolAsync)                                  \
    X(cuMemAllocFromPoolAsync, 11020, 1, cuMemAllocFromPoolAsync_ptsz)                             \
    X(cuMemFree, 2000, 0, cuMemFree)                                                               \
    X(cuMemFree, 3020, 0, cuMemFree_v2)                                                            \
    X(cuMemFreeAsync, 11020, 0, cuMemFreeAsync)                                                    \
    X(cuMemFreeAsync, 11020, 1, cuMemFreeAsync_ptsz)                                               \
    X(cuMemPoolCreate, 11020, 0, cuMemPoolCreate)                                                  \
    X(cuMemPoolDestroy, 11020, 0, cuMemPoolDestroy)                                                \
    X(cuMemGetInfo, 2000, 0, cuMemGetInfo)                                                         \
    X(cuMemGetInfo, 3020, 0, cuMemGetInfo_v2)                                                      \
    X(cuMemGetAllocationGranularity, 10020, 0, cuMemGetAllocationGranularity)                      \
    X(cuMemCreate, 10020, 0, cuMemCreate)                                                          \
    X(cuMemRelease, 10020, 0, cuMemRelease)                                                        \
    X(cuMemAddressReserve, 10020, 0, cuMemAddressReserve)                                          \
    X(cuMemAddressFree, 10020, 0, cuMemAddressFree)                                                \
    X(cuMemMap, 10020, 0, cuMemMap)                                                                \
    X(cuMemUnmap, 10020, 0, cuMemUnmap)                                                            \
    X(cuMemSetAccess, 10020, 0, cuMemSetAccess)                                                    \
    X(cuArrayCreate, 2000, 0, cuArrayCreate)                                                       \
    X(cuArrayCreate, 3020, 0, cuArrayCreate_v2)                                                    \
    X(cuArray3DCreate, 2000, 0, cuArray3DCreate)                                                   \
    X(cuArray3DCreate, 3020, 0, cuArray3DCreate_v2)                                                \
    X(cuArrayDestroy, 2000, 0, cuArrayDestroy)                                                     \
    X(cuMipmappedArrayCreate, 5000, 0, cuMipmappedArrayCreate)                                     \
    X(cuMipmappedArrayDestroy, 5000, 0, cuMipmappedArrayDestroy)                                   \
    X(cuMemHostAlloc, 2020, 0, cuMemHostAlloc)                                                     \
    X(cuMemAllocHost, 2000, 0, cuMemAllocHost)                                                     \
    X(cuMemAllocHost, 3020, 0, cuMemAllocHost_v2)                                                  \
    X(cuMemFreeHost, 2000, 0, cuMemFreeHost)                                                       \
    X(cuMemHostRegister, 4000, 0, cuMemHostRegister)                                               \
    X(cuMemHostRegister, 6050, 0, cuMemHostRegister_v2)                                            \
    X(cuMemHostUnregister, 4000, 0, cuMemHostUnregister)                                           \
    X(cuMemHostGetDevicePointer, 3020, 0, cuMemHostGetDevicePointer_v2)                            \
    X(cuStreamCreate, 2000, 0, cuStreamCreate)                                                     \
    X(cuStreamCreateWithPriority, 5050, 0, cuStreamCreateWithPriority)                             \
    X(cuStreamDestroy, 2000, 0, cuStreamDestroy)                                                   \
    X(cuStreamDestroy, 4000, 0, cuStreamDestroy_v2)                                                \
    X(cuStreamSynchronize, 2000, 0, cuStreamSynchronize)                                           \
    X(cuStreamSynchronize, 7000, 1, cuStreamSynchronize_ptsz)                                      \
    X(cuStreamQuery, 2000, 0, cuStreamQuery)                                                       \
    X(cuStreamQuery, 7000, 1, cuStreamQuery_ptsz)                                                  \
    X(cuStreamWaitEvent, 3020, 0, cuStreamWaitEvent)                                               \
    X(cuStreamWaitEvent, 7000, 1, cuStreamWaitEvent_ptsz)                                          \
    X(cuStreamBeginCapture, 10000, 0, cuStreamBeginCapture)                                        \
    X(cuStreamBeginCapture, 10000, 1, cuStreamBeginCapture_ptsz)                                   \
    X(cuStreamBeginCapture, 10010, 0, cuStreamBeginCapture_v2)                                     \
    X(cuStreamBeginCapture, 10010, 1, cuStreamBeginCapture_v2_ptsz)                                \
    X(cuStreamEndCapture, 10000, 0, cuStreamEndCapture)                                            \
    X(cuStreamEndCapture, 10000, 1, cuStreamEndCapture_ptsz)                                       \
    X(cuStreamIsCapturing, 10000, 0, cuStreamIsCapturing)                                          \
    X(cuStreamIsCapturing, 10000, 1, cuStreamIsCapturing_ptsz)                                     \
    X(cuStreamGetCaptureInfo, 10010, 0, cuStreamGetCaptureInfo)                                    \
    X(cuStreamGetCaptureInfo, 10010, 1, cuStreamGetCaptureInfo_ptsz)                               \
    X(cuStreamGetCaptureInfo, 11030, 0, cuStreamGetCaptureInfo_v2)                                 \
    X(cuStreamGetCaptureInfo, 11030, 1, cuStreamGetCaptureInfo_v2_ptsz)                            \
    X(cuStreamGetCaptureInfo, 12030, 0, cuStreamGetCaptureInfo_v3)                                 \
    X(cuStreamGetCaptureInfo, 12030, 1, cuStreamGetCaptureInfo_v3_ptsz)                            \
    X(cuEventCreate, 2000, 0, cuEventCreate)                                                       \
    X(cuEventRecord, 2000, 0, cuEventRecord)                                                       \
    X(cuEventRecord, 7000, 1, cuEventRecord_ptsz)                                                  \
    X(cuEventQuery, 2000, 0, cuEventQuery)                                                         \
    X(cuEventSynchronize, 2000, 0, cuEventSynchronize)                                             \
    X(cuEventElapsedTime, 2000, 0, cuEventElapsedTime)                                             \
    X(cuEventDestroy, 2000, 0, cuEventDestroy)                                                     \
    X(cuEventDestroy, 4000, 0, cuEventDestroy_v2)                                                  \
    X(cuModuleLoadData, 2000, 0, cuModuleLoadData)                                                 \
    X(cuModuleLoadDataEx, 2010, 0, cuModuleLoadDataEx)                                             \
    X(cuModuleGetFunction, 2000, 0, cuModuleGetFunction)                                           \
    X(cuModuleUnload, 2000, 0, cuModuleUnload)                                                     \
    X(cuLaunchKernel, 4000, 0, cuLaunchKernel)                                                     \
    X(cuLaunchKernel, 7000, 1, cuLaunchKernel_ptsz)                                                \
    X(cuLaunchKernelEx, 11060, 0, cuLaunchKernelEx)                                                \
    X(cuLaunchKernelEx, 11060, 1, cuLaunchKernelEx_ptsz)                                           \
    X(cuLaunchCooperativeKernel, 9000, 0, cuLaunchCooperativeKernel)                               \
    X(cuLaunchCooperativeKernel, 9000, 1, cuLaunchCooperativeKernel_ptsz)                          \
    X(cuLaunchCooperativeKernelMultiDevice, 9000, 0, cuLaunchCooperativeKernelMultiDevice)         \
    X(cuLaunch, 2000, 0, cuLaunch)                                                                 \
    X(cuLaunchGrid, 2000, 0, cuLaunchGrid)                                                         \
    X(cuLaunchGridAsync, 2000, 0, cuLaunchGridAsync)                                               \
    X(cuFuncSetBlockShape, 2000, 0, cuFuncSetBlockShape)                                           \
    X(cuGraphCreate, 10000, 0, cuGraphCreate)                                                      \
    X(cuGraphDestroy, 10000, 0, cuGraphDestroy)                                                    \
    X(cuGraphAddKernelNode, 10000, 0, cuGraphAddKernelNode)                                        \
    X(cuGraphAddKernelNode, 12000, 0, cuGraphAddKernelNode_v2)                                     \
    X(cuGraphAddChildGraphNode, 10000, 0, cuGraphAddChildGraphNode)                                \
    X(cuGraphAddEmptyNode, 10000, 0, cuGraphAddEmptyNode)                                          \
    X(cuGraphGetNodes, 10000, 0, cuGraphGetNodes)                                                  \
    X(cuGraphNodeGetType, 10000, 0, cuGraphNodeGetType)                                            \
    X(cuGraphKernelNodeGetParams, 10000, 0, cuGraphKernelNodeGetParams)                            \
    X(cuGraphKernelNodeGetParams, 12000, 0, cuGraphKernelNodeGetParams_v2)                         \
    X(cuGraphChildGraphNodeGetGraph, 10000, 0, cuGraphChildGraphNodeGetGraph)                      \
    X(cuGraphInstantiate, 10000, 0, cuGraphInstantiate)                                            \
    X(cuGraphInstantiate, 11000, 0, cuGraphInstantiate_v2)                                         \
    X(cuGraphInstantiate, 12000, 0, cuGraphInstantiateWithFlags)                                   \
    X(cuGraphInstantiateWithFlags, 11040, 0, cuGraphInstantiateWithFlags)                          \
    X(cuGraphInstantiateWithParams, 12000, 0, cuGraphInstantiateWithParams)                        \
    X(cuGraphInstantiateWithParams, 12000, 1, cuGraphInstantiateWithParams_ptsz)                   \
    X(cuGraphExecDestroy, 10000, 0, cuGraphExecDestroy)                                            \
    X(cuGraphExecUpdate, 10020, 0, cuGraphExecUpdate)                                              \
    X(cuGraphExecUpdate, 12000, 0, cuGraphExecUpdate_v2)                                           \
    X(cuGraphLaunch, 10000, 0, cuGraphLaunch)                                                      \
    X(cuGraphLaunch, 10000, 1, cuGraphLaunch_ptsz)

/* The functions are declared as objects only to take their addresses without repeating every
 * prototype here; nothing calls through these declarations. */
#define X_DECL(base, version, ptsz, name) extern char name[];
FAKE_PROCS(X_DECL)

#define X_ENTRY(base, version, ptsz, name) {#base, version, ptsz, #name, (void *)name},
const fc_proc fc_procs[] = {FAKE_PROCS(X_ENTRY){NULL, 0, 0, NULL, NULL}};
