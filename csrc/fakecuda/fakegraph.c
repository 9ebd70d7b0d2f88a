/*
 * fakecuda graphs: nodes (kernel, child graph, empty) with their dependency edges, executable graphs
 * and their update. What a launch of an executable graph costs is the grid blocks of all its kernel
 * nodes, child graphs included, fixed at instantiation (or update); fakeexec.c charges it.
 */
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

struct CUgraphNode_st {
    uint32_t tag;
    int type;
    CUgraph owner;
    CUDA_KERNEL_NODE_PARAMS_v2 kernel;
    CUgraph child; /* NODE_GRAPH: the graph's own copy */
    size_t ndeps, capdeps;
    CUgraphNode *deps; /* the nodes this one depends on: the edges (dep -> this) */
};

struct CUgraph_st {
    uint32_t tag;
    size_t count, cap;
    CUgraphNode *nodes;
};

struct CUgraphExec_st {
    uint32_t tag;
    int ordinal;
    uint64_t blocks; /* Σ grid blocks of every kernel node, child graphs included */
    size_t count;
    int *types; /* node types, in order: what cuGraphExecUpdate may not change */
};

/* CUgraphEdgeData: ports and type of an edge; the fake's edges are all default (zero). */
typedef struct {
    unsigned char from_port, to_port, type, reserved[5];
} CUgraphEdgeData;
_Static_assert(sizeof(CUgraphEdgeData) == 8, "CUgraphEdgeData layout");

uint64_t fc_grid_blocks(unsigned int x, unsigned int y, unsigned int z) {
    return (uint64_t)x * (uint64_t)y * (uint64_t)z;
}

int fc_valid_dims(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz) {
    return gx && gy && gz && bx && by && bz && (uint64_t)bx * by * bz <= 1024 && bz <= 64;
}

static int valid_graph(CUgraph g) { return g != NULL && g->tag == TAG_GRAPH; }
static int valid_node(CUgraphNode n) { return n != NULL && n->tag == TAG_NODE; }

CUgraph fc_graph_new(void) {
    CUgraph g = calloc(1, sizeof *g);
    if (g) g->tag = TAG_GRAPH;
    return g;
}

static void graph_free(CUgraph g) {
    for (size_t i = 0; i < g->count; i++) {
        if (g->nodes[i]->child) graph_free(g->nodes[i]->child);
        free(g->nodes[i]->deps);
        g->nodes[i]->tag = 0;
        free(g->nodes[i]);
    }
    free(g->nodes);
    g->tag = 0;
    free(g);
}

static int add_dep(CUgraphNode n, CUgraphNode dep) {
    if (n->ndeps == n->capdeps) {
        size_t cap = n->capdeps ? n->capdeps * 2 : 4;
        CUgraphNode *grown = realloc(n->deps, cap * sizeof *grown);
        if (grown == NULL) return -1;
        n->deps = grown;
        n->capdeps = cap;
    }
    n->deps[n->ndeps++] = dep;
    return 0;
}

static CUgraph graph_clone(CUgraph g);

/* A new node of `g` depending on deps[0..n) (checked by the caller). */
static CUgraphNode graph_add(CUgraph g, int type, const CUDA_KERNEL_NODE_PARAMS_v2 *k, CUgraph child,
                             const CUgraphNode *deps, size_t ndeps) {
    if (g->count == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 8;
        CUgraphNode *grown = realloc(g->nodes, cap * sizeof *grown);
        if (grown == NULL) return NULL;
        g->nodes = grown;
        g->cap = cap;
    }
    CUgraphNode n = calloc(1, sizeof *n);
    if (n == NULL) return NULL;
    n->tag = TAG_NODE;
    n->type = type;
    n->owner = g;
    if (k) n->kernel = *k;
    int failed = child && (n->child = graph_clone(child)) == NULL;
    for (size_t i = 0; !failed && i < ndeps; i++) failed = add_dep(n, deps[i]) < 0;
    if (failed) {
        if (n->child) graph_free(n->child);
        free(n->deps);
        free(n);
        return NULL;
    }
    g->nodes[g->count++] = n;
    return n;
}

static size_t index_of(CUgraph g, CUgraphNode n) {
    for (size_t i = 0; i < g->count; i++)
        if (g->nodes[i] == n) return i;
    return g->count;
}

/* A deep copy: nodes, child graphs and edges. */
static CUgraph graph_clone(CUgraph g) {
    CUgraph c = fc_graph_new();
    for (size_t i = 0; c && i < g->count; i++) {
        CUgraphNode n = g->nodes[i];
        if (graph_add(c, n->type, &n->kernel, n->child, NULL, 0) == NULL) {
            graph_free(c);
            return NULL;
        }
    }
    for (size_t i = 0; c && i < g->count; i++)
        for (size_t d = 0; d < g->nodes[i]->ndeps; d++)
            if (add_dep(c->nodes[i], c->nodes[index_of(g, g->nodes[i]->deps[d])]) < 0) {
                graph_free(c);
                return NULL;
            }
    return c;
}

static uint64_t graph_blocks(CUgraph g) {
    uint64_t sum = 0;
    for (size_t i = 0; i < g->count; i++) {
        CUgraphNode n = g->nodes[i];
        if (n->type == NODE_KERNEL) sum += fc_grid_blocks(n->kernel.gridDimX, n->kernel.gridDimY, n->kernel.gridDimZ);
        if (n->type == NODE_GRAPH) sum += graph_blocks(n->child);
    }
    return sum;
}

CUgraphNode fc_graph_add_kernel(CUgraph g, const CUDA_KERNEL_NODE_PARAMS_v2 *p, CUgraphNode after) {
    return graph_add(g, NODE_KERNEL, p, NULL, after ? &after : NULL, after ? 1 : 0);
}

void fc_graph_destroy(CUgraph g) {
    if (valid_graph(g)) graph_free(g);
}

int fc_exec_blocks(CUgraphExec e, uint64_t *blocks) {
    if (e == NULL || e->tag != TAG_EXEC) return -1;
    *blocks = e->blocks;
    return 0;
}

EXPORT CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
    CUresult rc = fc_ready();
    if (rc != CUDA_SUCCESS) return rc;
    if (phGraph == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    return (*phGraph = fc_graph_new()) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuGraphDestroy(CUgraph g) {
    if (!valid_graph(g)) return CUDA_ERROR_INVALID_VALUE;
    graph_free(g);
    return CUDA_SUCCESS;
}

static CUresult check_deps(CUgraph g, const CUgraphNode *deps, size_t n) {
    if (n > 0 && deps == NULL) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n; i++)
        if (!valid_node(deps[i]) || deps[i]->owner != g) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

static CUresult add_kernel(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                           const CUDA_KERNEL_NODE_PARAMS_v2 *p) {
    if (out == NULL || p == NULL || !valid_graph(g)) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = check_deps(g, deps, n);
    if (rc != CUDA_SUCCESS) return rc;
    if (!fc_valid_function(p->func)) return CUDA_ERROR_INVALID_HANDLE;
    if (!fc_valid_dims(p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX, p->blockDimY, p->blockDimZ))
        return CUDA_ERROR_INVALID_VALUE;
    return (*out = graph_add(g, NODE_KERNEL, p, NULL, deps, n)) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                        size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams) {
    return add_kernel(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
}

EXPORT CUresult cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                     size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS_v1 *p) {
    if (p == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUDA_KERNEL_NODE_PARAMS_v2 v2 = {p->func, p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX, p->blockDimY,
                                     p->blockDimZ, p->sharedMemBytes, p->kernelParams, p->extra, NULL, NULL};
    return add_kernel(phGraphNode, hGraph, dependencies, numDependencies, &v2);
}

EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                         size_t numDependencies, CUgraph childGraph) {
    if (phGraphNode == NULL || !valid_graph(hGraph) || !valid_graph(childGraph)) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = check_deps(hGraph, dependencies, numDependencies);
    if (rc != CUDA_SUCCESS) return rc;
    *phGraphNode = graph_add(hGraph, NODE_GRAPH, NULL, childGraph, dependencies, numDependencies);
    return *phGraphNode ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuGraphAddEmptyNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                    size_t numDependencies) {
    if (phGraphNode == NULL || !valid_graph(hGraph)) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = check_deps(hGraph, dependencies, numDependencies);
    if (rc != CUDA_SUCCESS) return rc;
    *phGraphNode = graph_add(hGraph, NODE_EMPTY, NULL, NULL, dependencies, numDependencies);
    return *phGraphNode ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* CUgraphNodeParams (CUDA 12.2): the type, then a union whose kernel member is
 * CUDA_KERNEL_NODE_PARAMS_v3 (v2's layout). The fake adds kernel and empty nodes this way. */
typedef struct {
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_KERNEL_NODE_PARAMS_v2 kernel;
    } u;
    long long reserved2;
} CUgraphNodeParams;
_Static_assert(sizeof(CUgraphNodeParams) == 256, "CUgraphNodeParams layout");

static CUresult add_node(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUgraphNodeParams *p) {
    if (out == NULL || p == NULL || !valid_graph(g)) return CUDA_ERROR_INVALID_VALUE;
    if (p->type == NODE_KERNEL) return add_kernel(out, g, deps, n, &p->u.kernel);
    if (p->type == NODE_EMPTY) return cuGraphAddEmptyNode(out, g, deps, n);
    return CUDA_ERROR_NOT_SUPPORTED;
}

EXPORT CUresult cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                               size_t numDependencies, CUgraphNodeParams *nodeParams) {
    return add_node(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
}

EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                  const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                  CUgraphNodeParams *nodeParams) {
    (void)dependencyData; /* default edges only */
    return add_node(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
}

EXPORT CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *numNodes) {
    if (!valid_graph(g) || numNodes == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (nodes == NULL) {
        *numNodes = g->count;
        return CUDA_SUCCESS;
    }
    size_t n = *numNodes < g->count ? *numNodes : g->count;
    for (size_t i = 0; i < *numNodes; i++) nodes[i] = i < n ? g->nodes[i] : NULL;
    *numNodes = n;
    return CUDA_SUCCESS;
}

/* ---- edges ---- */

/* Fill pairs (from[i] -> to[i]) of `g` up to *num (NULL arrays: count them); edge data are zeros. */
static CUresult get_edges(CUgraph g, CUgraphNode *from, CUgraphNode *to, CUgraphEdgeData *data, size_t *num) {
    if (!valid_graph(g) || num == NULL || ((from == NULL) != (to == NULL))) return CUDA_ERROR_INVALID_VALUE;
    size_t total = 0, k = 0;
    for (size_t i = 0; i < g->count; i++)
        for (size_t d = 0; d < g->nodes[i]->ndeps; d++, total++)
            if (from && k < *num) {
                from[k] = g->nodes[i]->deps[d];
                to[k] = g->nodes[i];
                if (data) memset(&data[k], 0, sizeof data[k]);
                k++;
            }
    if (from == NULL) {
        *num = total;
        return CUDA_SUCCESS;
    }
    for (size_t i = k; i < *num; i++) from[i] = to[i] = NULL;
    *num = k;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphGetEdges(CUgraph g, CUgraphNode *from, CUgraphNode *to, size_t *numEdges) {
    return get_edges(g, from, to, NULL, numEdges);
}

EXPORT CUresult cuGraphGetEdges_v2(CUgraph g, CUgraphNode *from, CUgraphNode *to, CUgraphEdgeData *edgeData,
                                   size_t *numEdges) {
    return get_edges(g, from, to, edgeData, numEdges);
}

/* The dependencies (dependents: 1) of node `n`, up to *num (NULL array: count them). */
static CUresult neighbours(CUgraphNode n, int dependents, CUgraphNode *out, CUgraphEdgeData *data, size_t *num) {
    if (!valid_node(n) || num == NULL) return CUDA_ERROR_INVALID_VALUE;
    size_t total = 0, k = 0;
    CUgraph g = n->owner;
    for (size_t i = 0; i < (dependents ? g->count : n->ndeps); i++) {
        CUgraphNode found = NULL;
        if (!dependents) {
            found = n->deps[i];
        } else {
            for (size_t d = 0; d < g->nodes[i]->ndeps; d++)
                if (g->nodes[i]->deps[d] == n) found = g->nodes[i];
        }
        if (found == NULL) continue;
        total++;
        if (out && k < *num) {
            out[k] = found;
            if (data) memset(&data[k], 0, sizeof data[k]);
            k++;
        }
    }
    if (out == NULL) {
        *num = total;
        return CUDA_SUCCESS;
    }
    for (size_t i = k; i < *num; i++) out[i] = NULL;
    *num = k;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphNodeGetDependencies(CUgraphNode n, CUgraphNode *deps, size_t *numDependencies) {
    return neighbours(n, 0, deps, NULL, numDependencies);
}
EXPORT CUresult cuGraphNodeGetDependencies_v2(CUgraphNode n, CUgraphNode *deps, CUgraphEdgeData *edgeData,
                                              size_t *numDependencies) {
    return neighbours(n, 0, deps, edgeData, numDependencies);
}
EXPORT CUresult cuGraphNodeGetDependentNodes(CUgraphNode n, CUgraphNode *dependents, size_t *numDependentNodes) {
    return neighbours(n, 1, dependents, NULL, numDependentNodes);
}
EXPORT CUresult cuGraphNodeGetDependentNodes_v2(CUgraphNode n, CUgraphNode *dependents, CUgraphEdgeData *edgeData,
                                                size_t *numDependentNodes) {
    return neighbours(n, 1, dependents, edgeData, numDependentNodes);
}

static int has_edge(CUgraphNode from, CUgraphNode to) {
    for (size_t d = 0; d < to->ndeps; d++)
        if (to->deps[d] == from) return 1;
    return 0;
}

/* Add (add: 1) or remove the edges from[i] -> to[i]; all checked before any changes. */
static CUresult change_edges(CUgraph g, const CUgraphNode *from, const CUgraphNode *to, size_t n, int add) {
    if (!valid_graph(g) || (n > 0 && (from == NULL || to == NULL))) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n; i++) {
        if (!valid_node(from[i]) || !valid_node(to[i]) || from[i]->owner != g || to[i]->owner != g ||
            from[i] == to[i] || has_edge(from[i], to[i]) == add)
            return CUDA_ERROR_INVALID_VALUE;
        for (size_t j = 0; j < i; j++)
            if (from[j] == from[i] && to[j] == to[i]) return CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t i = 0; i < n; i++) {
        CUgraphNode t = to[i];
        if (add) {
            if (add_dep(t, from[i]) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
            continue;
        }
        size_t k = 0;
        for (size_t d = 0; d < t->ndeps; d++)
            if (t->deps[d] != from[i]) t->deps[k++] = t->deps[d];
        t->ndeps = k;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddDependencies(CUgraph g, const CUgraphNode *from, const CUgraphNode *to, size_t n) {
    return change_edges(g, from, to, n, 1);
}
EXPORT CUresult cuGraphAddDependencies_v2(CUgraph g, const CUgraphNode *from, const CUgraphNode *to,
                                          const CUgraphEdgeData *edgeData, size_t n) {
    (void)edgeData;
    return change_edges(g, from, to, n, 1);
}
EXPORT CUresult cuGraphRemoveDependencies(CUgraph g, const CUgraphNode *from, const CUgraphNode *to, size_t n) {
    return change_edges(g, from, to, n, 0);
}
EXPORT CUresult cuGraphRemoveDependencies_v2(CUgraph g, const CUgraphNode *from, const CUgraphNode *to,
                                             const CUgraphEdgeData *edgeData, size_t n) {
    (void)edgeData;
    return change_edges(g, from, to, n, 0);
}

/* ---- node queries ---- */

EXPORT CUresult cuGraphNodeGetType(CUgraphNode n, int *type) {
    if (!valid_node(n) || type == NULL) return CUDA_ERROR_INVALID_VALUE;
    *type = n->type;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode n, CUDA_KERNEL_NODE_PARAMS_v2 *p) {
    if (!valid_node(n) || n->type != NODE_KERNEL || p == NULL) return CUDA_ERROR_INVALID_VALUE;
    *p = n->kernel;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphKernelNodeGetParams(CUgraphNode n, CUDA_KERNEL_NODE_PARAMS_v1 *p) {
    if (!valid_node(n) || n->type != NODE_KERNEL || p == NULL) return CUDA_ERROR_INVALID_VALUE;
    memcpy(p, &n->kernel, sizeof *p); /* v1 is v2's prefix */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode n, CUgraph *phGraph) {
    if (!valid_node(n) || n->type != NODE_GRAPH || phGraph == NULL) return CUDA_ERROR_INVALID_VALUE;
    *phGraph = n->child;
    return CUDA_SUCCESS;
}

/* ---- executable graphs ---- */

static CUresult instantiate(CUgraphExec *out, CUgraph g) {
    int ordinal;
    CUresult rc = fc_current_ordinal(&ordinal);
    if (rc != CUDA_SUCCESS) return rc;
    if (out == NULL || !valid_graph(g)) return CUDA_ERROR_INVALID_VALUE;
    CUgraphExec e = calloc(1, sizeof *e);
    int *types = calloc(g->count + 1, sizeof *types);
    if (e == NULL || types == NULL) {
        free(e);
        free(types);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < g->count; i++) types[i] = g->nodes[i]->type;
    *e = (struct CUgraphExec_st){TAG_EXEC, ordinal, graph_blocks(g), g->count, types};
    *out = e;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
    if (flags & ~0xFull) return CUDA_ERROR_INVALID_VALUE;
    return instantiate(phGraphExec, hGraph);
}

/* CUDA 11's form (error node and log buffer), as cuGraphInstantiate and cuGraphInstantiate_v2. */
EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                      char *logBuffer, size_t bufferSize) {
    if (phErrorNode) *phErrorNode = NULL;
    if (logBuffer && bufferSize) logBuffer[0] = '\0';
    return instantiate(phGraphExec, hGraph);
}
EXPORT CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                   char *logBuffer, size_t bufferSize) {
    return cuGraphInstantiate_v2(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

/* CUDA_GRAPH_INSTANTIATE_PARAMS: flags, upload stream, error node out, result out. */
typedef struct {
    cuuint64_t flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out; /* CUDA_GRAPH_INSTANTIATE_SUCCESS = 0 */
} CUDA_GRAPH_INSTANTIATE_PARAMS;

static CUresult instantiate_params(CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    if (p == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = instantiate(phGraphExec, hGraph);
    p->hErrNode_out = NULL;
    p->result_out = rc == CUDA_SUCCESS ? 0 : 1;
    return rc;
}
EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                             CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    return instantiate_params(phGraphExec, hGraph, p);
}
EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    return instantiate_params(phGraphExec, hGraph, p);
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
    if (e == NULL || e->tag != TAG_EXEC) return CUDA_ERROR_INVALID_VALUE;
    e->tag = 0;
    free(e->types);
    free(e);
    return CUDA_SUCCESS;
}

/* Takes the new graph's kernel parameters when its nodes have the same types in the same order. */
static CUresult exec_update(CUgraphExec e, CUgraph g, int *result) {
    if (e == NULL || e->tag != TAG_EXEC || !valid_graph(g)) return CUDA_ERROR_INVALID_VALUE;
    int same = g->count == e->count;
    for (size_t i = 0; same && i < g->count; i++) same = g->nodes[i]->type == e->types[i];
    if (!same) {
        *result = g->count == e->count ? 3 : 2; /* NODE_TYPE_CHANGED : TOPOLOGY_CHANGED */
        return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    }
    e->blocks = graph_blocks(g);
    *result = 0; /* CU_GRAPH_EXEC_UPDATE_SUCCESS */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphNode *hErrorNode_out, int *updateResult_out) {
    int result = 1;
    CUresult rc = exec_update(e, g, &result);
    if (hErrorNode_out) *hErrorNode_out = NULL;
    if (updateResult_out) *updateResult_out = result;
    return rc;
}

typedef struct {
    int result;
    CUgraphNode errorNode, errorFromNode;
} CUgraphExecUpdateResultInfo;

EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info) {
    int result = 1;
    CUresult rc = exec_update(e, g, &result);
    if (info) *info = (CUgraphExecUpdateResultInfo){result, NULL, NULL};
    return rc;
}
