/* Prints the layouts of vgpu_files.h as JSON: for every struct its size and, per field, its
 * offset and size, plus the constants. tests/unit/test_libfiles.py compares this with the
 * Python table in vgpud/partition/libfiles.py, so the two sides cannot drift apart. */
#include <stdio.h>

#include "vgpu_files.h"

#define FIELD(T, f) printf("%s\"%s\": [%zu, %zu]", first ? "" : ", ", #f, offsetof(T, f), sizeof(((T *)0)->f)), first = 0
#define OPEN(T) printf("%s\"%s\": {\"size\": %zu, \"fields\": {", n++ ? ", " : "", #T, sizeof(T)), first = 1
#define CLOSE() printf("}}")
#define CONST(c) printf(", \"%s\": %llu", #c, (unsigned long long)(c))

int main(void) {
    int n = 0, first;
    printf("{\"structs\": {");
    OPEN(struct vgpu_config_device);
    FIELD(struct vgpu_config_device, seq);
    FIELD(struct vgpu_config_device, uuid);
    FIELD(struct vgpu_config_device, total_memory);
    FIELD(struct vgpu_config_device, real_memory);
    FIELD(struct vgpu_config_device, hard_core);
    FIELD(struct vgpu_config_device, soft_core);
    FIELD(struct vgpu_config_device, core_limit);
    FIELD(struct vgpu_config_device, hard_limit);
    FIELD(struct vgpu_config_device, memory_limit);
    FIELD(struct vgpu_config_device, memory_oversold);
    FIELD(struct vgpu_config_device, activate);
    CLOSE();
    OPEN(struct vgpu_config);
    FIELD(struct vgpu_config, magic);
    FIELD(struct vgpu_config, layout);
    FIELD(struct vgpu_config, size);
    FIELD(struct vgpu_config, count);
    FIELD(struct vgpu_config, cuda_version_major);
    FIELD(struct vgpu_config, cuda_version_minor);
    FIELD(struct vgpu_config, driver_version);
    FIELD(struct vgpu_config, pod_uid);
    FIELD(struct vgpu_config, pod_name);
    FIELD(struct vgpu_config, pod_namespace);
    FIELD(struct vgpu_config, container_name);
    FIELD(struct vgpu_config, reg_uuid);
    FIELD(struct vgpu_config, compatibility_mode);
    FIELD(struct vgpu_config, sm_watcher);
    FIELD(struct vgpu_config, vmem_node);
    FIELD(struct vgpu_config, devices);
    CLOSE();
    OPEN(struct vgpu_vmem_process);
    FIELD(struct vgpu_vmem_process, pid);
    FIELD(struct vgpu_vmem_process, used);
    CLOSE();
    OPEN(struct vgpu_vmem_device);
    FIELD(struct vgpu_vmem_device, processes);
    FIELD(struct vgpu_vmem_device, processes_size);
    FIELD(struct vgpu_vmem_device, lock_byte);
    CLOSE();
    OPEN(struct vgpu_vmem_node);
    FIELD(struct vgpu_vmem_node, magic);
    FIELD(struct vgpu_vmem_node, layout);
    FIELD(struct vgpu_vmem_node, size);
    FIELD(struct vgpu_vmem_node, count);
    FIELD(struct vgpu_vmem_node, devices);
    CLOSE();
    OPEN(struct vgpu_sm_device);
    FIELD(struct vgpu_sm_device, tokens);
    FIELD(struct vgpu_sm_device, last_refill_ns);
    FIELD(struct vgpu_sm_device, ceiling);
    FIELD(struct vgpu_sm_device, share);
    FIELD(struct vgpu_sm_device, last_sample_ns);
    FIELD(struct vgpu_sm_device, util);
    FIELD(struct vgpu_sm_device, limit);
    FIELD(struct vgpu_sm_device, hard_core);
    FIELD(struct vgpu_sm_device, soft_core);
    FIELD(struct vgpu_sm_device, active);
    CLOSE();
    OPEN(struct vgpu_sm_node);
    FIELD(struct vgpu_sm_node, magic);
    FIELD(struct vgpu_sm_node, layout);
    FIELD(struct vgpu_sm_node, size);
    FIELD(struct vgpu_sm_node, count);
    FIELD(struct vgpu_sm_node, sampler_pid);
    FIELD(struct vgpu_sm_node, sampler_heartbeat_ns);
    FIELD(struct vgpu_sm_node, devices);
    CLOSE();
    printf("}, \"constants\": {\"VGPU_MAX_DEVICES\": %d", VGPU_MAX_DEVICES);
    CONST(VGPU_CONFIG_MAGIC);
    CONST(VGPU_CONFIG_LAYOUT);
    CONST(VGPU_CONFIG_FILE_SIZE);
    CONST(VGPU_CONFIG_STRUCT_SIZE);
    CONST(VGPU_VMEM_MAGIC);
    CONST(VGPU_VMEM_LAYOUT);
    CONST(VGPU_VMEM_FILE_SIZE);
    CONST(VGPU_VMEM_STRUCT_SIZE);
    CONST(VGPU_VMEM_MAX_PROCESSES);
    CONST(VGPU_VMEM_DEVICE_STRIDE);
    CONST(VGPU_SM_MAGIC);
    CONST(VGPU_SM_LAYOUT);
    CONST(VGPU_SM_FILE_SIZE);
    CONST(VGPU_SM_STRUCT_SIZE);
    CONST(VGPU_SM_REFILL_PERIOD_NS);
    printf("}, \"paths\": {\"config\": \"%s\", \"vmem_node\": \"%s\", \"sm_node\": \"%s\", \"sm_node_lock\": \"%s\", "
           "\"vgpu_lock_fmt\": \"%s\"}}\n",
           VGPU_CONFIG_PATH, VGPU_VMEM_NODE_PATH, VGPU_SM_NODE_PATH, VGPU_SM_NODE_LOCK_PATH, VGPU_LOCK_PATH_FMT);
    return 0;
}
