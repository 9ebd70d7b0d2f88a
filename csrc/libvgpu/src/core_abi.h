/* The CUDA driver / NVML declarations the core limit needs beyond cuda_abi.h / nvml_abi.h: launch,
 * graph and process-utilisation types and the exact prototypes of the hooked launch/graph symbols,
 * from NVIDIA's public driver and NVML API references (our own declarations, not NVIDIA's headers). */
#ifndef VGPU_CORE_ABI_H
#define VGPU_CORE_ABI_H

#include "cuda_abi.h"
#include "nvml_abi.h"

typedef struct CUfunc_st *CUfunction;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUlaunchAttribute_st CUlaunchAttribute; /* only pointed to */

/* CUlaunchConfig (cuLaunchKernelEx). */
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* CUDA_LAUNCH_PARAMS (cuLaunchCooperativeKernelMultiDevice). */
typedef struct {
    CUfunction function;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void **kernelParams;
} CUDA_LAUNCH_PARAMS;

/* CUDA_KERNEL_NODE_PARAMS_v2: the v1 struct's fields then kern and ctx; only the grid is read. */
typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    void *kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;

/* CUgraphNodeType values read here. */
#define CU_GRAPH_NODE_TYPE_KERNEL 0
#define CU_GRAPH_NODE_TYPE_GRAPH 4

/* CUdevice_attribute values read here. */
#define CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR 39
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16

typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st CUDA_GRAPH_INSTANTIATE_PARAMS; /* only passed on */
typedef struct CUgraphExecUpdateResultInfo_st CUgraphExecUpdateResultInfo;     /* only passed on */

typedef CUresult (*cu_device_get_attribute_fn)(int *, int, CUdevice);
typedef CUresult (*cu_device_get_count_fn)(int *);
typedef CUresult (*cu_device_get_fn)(CUdevice *, int);
typedef CUresult (*cu_graph_get_nodes_fn)(CUgraph, CUgraphNode *, size_t *);
typedef CUresult (*cu_graph_node_get_type_fn)(CUgraphNode, int *);
typedef CUresult (*cu_graph_kernel_node_get_params_fn)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS_v2 *);
typedef CUresult (*cu_graph_child_graph_fn)(CUgraphNode, CUgraph *);
typedef CUresult (*cu_stream_get_ctx_fn)(CUstream, CUcontext *);
typedef CUresult (*cu_ctx_push_fn)(CUcontext);
typedef CUresult (*cu_ctx_pop_fn)(CUcontext *);

/* nvmlProcessUtilizationSample_t. */
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp; /* microseconds */
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef nvmlReturn_t (*nvml_get_process_utilization_fn)(nvmlDevice_t, nvmlProcessUtilizationSample_t *,
                                                        unsigned int *, unsigned long long);

/* nvmlProcessesUtilizationInfo_t v1 and its entries (the newer call, R535+). */
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
#define NVML_PROCESSES_UTILIZATION_INFO_V1 ((unsigned int)(sizeof(nvmlProcessesUtilizationInfo_v1_t) | (1u << 24)))
_Static_assert(sizeof(nvmlProcessUtilizationInfo_v1_t) == 40, "nvmlProcessUtilizationInfo_v1_t layout");
_Static_assert(NVML_PROCESSES_UTILIZATION_INFO_V1 == 0x01000018, "nvmlProcessesUtilizationInfo_v1 version");
typedef nvmlReturn_t (*nvml_get_processes_utilization_info_fn)(nvmlDevice_t, nvmlProcessesUtilizationInfo_v1_t *);

/* The hooked launch and graph symbols, exact prototypes (core_hooks.c, core_graph.c). */
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params,
                        void **extra);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                             unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params,
                             void **extra);
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra);
CUresult cuLaunch(CUfunction f);
CUresult cuLaunchGrid(CUfunction f, int w, int h);
CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s);
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                   unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                   CUstream s, void **params);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                        CUstream s, void **params);
CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned int n, unsigned int flags);
CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph g, CUgraphNode *err_node, char *log, size_t log_size);
CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph g, CUgraphNode *err_node, char *log, size_t log_size);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph g, unsigned long long flags);
CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p);
CUresult cuGraphExecUpdate(CUgraphExec exec, CUgraph g, CUgraphNode *err_node, int *result);
CUresult cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph g, CUgraphExecUpdateResultInfo *info);
CUresult cuGraphExecDestroy(CUgraphExec exec);
CUresult cuGraphLaunch(CUgraphExec exec, CUstream s);
CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s);

#endif
