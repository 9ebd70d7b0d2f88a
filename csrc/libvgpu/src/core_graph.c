/* Graph launches under the core limit: at instantiation (and exec update) the sum of the grid
 * blocks of the graph's kernel nodes, child graphs included, is cached per executable graph with
 * the device it was made on; cuGraphLaunch(_ptsz) charges that sum. */
#include <pthread.h>
#include <stdlib.h>

#include "capture.h"
#include "core_abi.h"
#include "core_limit.h"
#include "vgpu_state.h"

#define BUCKETS 256
#define MAX_DEPTH 8 /* child graphs nest at most this deep for the sum */

struct exec_entry {
    CUgraphExec exec;
    int host;
    unsigned long long blocks;
    struct exec_entry *next;
};

static struct exec_entry *table[BUCKETS];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t bucket_of(CUgraphExec e)
{
    return ((uintptr_t)e >> 4) % BUCKETS;
}

static unsigned long long graph_blocks(CUgraph g, int depth)
{
    static void *nodes_slot, *type_slot, *params_slot, *params_v1_slot, *child_slot;
    cu_graph_get_nodes_fn get_nodes = vgpu_real_cached(&nodes_slot, VGPU_LIB_CUDA, "cuGraphGetNodes");
    cu_graph_node_get_type_fn get_type = vgpu_real_cached(&type_slot, VGPU_LIB_CUDA, "cuGraphNodeGetType");
    cu_graph_kernel_node_get_params_fn params =
        vgpu_real_cached(&params_slot, VGPU_LIB_CUDA, "cuGraphKernelNodeGetParams_v2");
    if (params == NULL) /* the v1 struct is the v2 struct's prefix: the grid is at the same offsets */
        params = vgpu_real_cached(&params_v1_slot, VGPU_LIB_CUDA, "cuGraphKernelNodeGetParams");
    cu_graph_child_graph_fn child = vgpu_real_cached(&child_slot, VGPU_LIB_CUDA, "cuGraphChildGraphNodeGetGraph");
    size_t n = 0;
    if (depth > MAX_DEPTH || get_nodes == NULL || get_type == NULL || get_nodes(g, NULL, &n) != CUDA_SUCCESS || n == 0)
        return 0;
    CUgraphNode *nodes = malloc(sizeof(*nodes) * n);
    if (nodes == NULL)
        return 0;
    unsigned long long sum = 0;
    if (get_nodes(g, nodes, &n) == CUDA_SUCCESS) {
        for (size_t i = 0; i < n; i++) {
            int type;
            if (get_type(nodes[i], &type) != CUDA_SUCCESS)
                continue;
            CUDA_KERNEL_NODE_PARAMS_v2 p = {0};
            CUgraph sub;
            if (type == CU_GRAPH_NODE_TYPE_KERNEL && params && params(nodes[i], &p) == CUDA_SUCCESS)
                sum += (unsigned long long)p.gridDimX * p.gridDimY * p.gridDimZ;
            else if (type == CU_GRAPH_NODE_TYPE_GRAPH && child && child(nodes[i], &sub) == CUDA_SUCCESS)
                sum += graph_blocks(sub, depth + 1);
        }
    }
    free(nodes);
    return sum;
}

/* Records (or replaces) the sum for `exec`, made on the current context's device. */
static void remember(CUgraphExec exec, CUgraph g)
{
    if (exec == NULL || !vgpu_core_any_limit())
        return;
    unsigned long long blocks = graph_blocks(g, 0);
    int host = vgpu_host_of_current();
    pthread_mutex_lock(&table_lock);
    struct exec_entry **slot = &table[bucket_of(exec)], *e = *slot;
    while (e && e->exec != exec)
        e = e->next;
    if (e == NULL && (e = malloc(sizeof(*e))) != NULL) {
        e->exec = exec;
        e->next = *slot;
        *slot = e;
    }
    if (e) {
        e->host = host;
        e->blocks = blocks;
    }
    pthread_mutex_unlock(&table_lock);
}

static void forget(CUgraphExec exec)
{
    pthread_mutex_lock(&table_lock);
    for (struct exec_entry **p = &table[bucket_of(exec)]; *p; p = &(*p)->next) {
        if ((*p)->exec == exec) {
            struct exec_entry *gone = *p;
            *p = gone->next;
            free(gone);
            break;
        }
    }
    pthread_mutex_unlock(&table_lock);
}

static void charge(CUgraphExec exec)
{
    if (!vgpu_core_any_limit())
        return;
    int host = -1;
    unsigned long long blocks = 0;
    pthread_mutex_lock(&table_lock);
    for (struct exec_entry *e = table[bucket_of(exec)]; e; e = e->next) {
        if (e->exec == exec) {
            host = e->host;
            blocks = e->blocks;
            break;
        }
    }
    pthread_mutex_unlock(&table_lock);
    if (blocks > 0)
        vgpu_core_charge(host, blocks);
}

#define INSTANTIATE5(name)                                                                           \
    VGPU_EXPORT CUresult name(CUgraphExec *exec, CUgraph g, CUgraphNode *err_node, char *log, size_t log_size) \
    {                                                                                                \
        HOOK_REAL_CU(name);                                                                          \
        CUresult rc = real(exec, g, err_node, log, log_size);                                        \
        if (rc == CUDA_SUCCESS && exec)                                                              \
            remember(*exec, g);                                                                      \
        return rc;                                                                                   \
    }
INSTANTIATE5(cuGraphInstantiate)
INSTANTIATE5(cuGraphInstantiate_v2)

VGPU_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph g, unsigned long long flags)
{
    HOOK_REAL_CU(cuGraphInstantiateWithFlags);
    CUresult rc = real(exec, g, flags);
    if (rc == CUDA_SUCCESS && exec)
        remember(*exec, g);
    return rc;
}

#define INSTANTIATE_PARAMS(name)                                                                 \
    VGPU_EXPORT CUresult name(CUgraphExec *exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)    \
    {                                                                                            \
        HOOK_REAL_CU(name);                                                                      \
        CUresult rc = real(exec, g, p);                                                          \
        if (rc == CUDA_SUCCESS && exec)                                                          \
            remember(*exec, g);                                                                  \
        return rc;                                                                               \
    }
INSTANTIATE_PARAMS(cuGraphInstantiateWithParams)
INSTANTIATE_PARAMS(cuGraphInstantiateWithParams_ptsz)

VGPU_EXPORT CUresult cuGraphExecUpdate(CUgraphExec exec, CUgraph g, CUgraphNode *err_node, int *result)
{
    HOOK_REAL_CU(cuGraphExecUpdate);
    CUresult rc = real(exec, g, err_node, result);
    if (rc == CUDA_SUCCESS)
        remember(exec, g);
    return rc;
}

VGPU_EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph g, CUgraphExecUpdateResultInfo *info)
{
    HOOK_REAL_CU(cuGraphExecUpdate_v2);
    CUresult rc = real(exec, g, info);
    if (rc == CUDA_SUCCESS)
        remember(exec, g);
    return rc;
}

VGPU_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    HOOK_REAL_CU(cuGraphExecDestroy);
    forget(exec);
    return real(exec);
}

/* A graph launched into a capturing stream becomes a child graph node: charged when that graph runs. */
#define GRAPH_LAUNCH(name, ptsz)                                 \
    VGPU_EXPORT CUresult name(CUgraphExec exec, CUstream s)      \
    {                                                            \
        HOOK_REAL_CU(name);                                      \
        if (!vgpu_launch_is_captured(s, ptsz))                   \
            charge(exec);                                        \
        return real(exec, s);                                    \
    }
GRAPH_LAUNCH(cuGraphLaunch, 0)
GRAPH_LAUNCH(cuGraphLaunch_ptsz, 1)
