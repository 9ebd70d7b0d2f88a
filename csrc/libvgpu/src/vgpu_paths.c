/* See vgpu_paths.h. */
#include "vgpu_paths.h"

#include <stdlib.h>

#include "vgpu_files.h"

static const struct {
    const char *env;
    const char *def;
} paths[VGPU_PATH_COUNT] = {
    [VGPU_PATH_CONFIG_DIR] = {"VGPU_CONFIG_DIR", VGPU_CONFIG_DIR},
    [VGPU_PATH_PIDS_CONFIG] = {"VGPU_PIDS_CONFIG", "/etc/vgpu-manager/config/pids.config"},
    [VGPU_PATH_LOCK_DIR] = {"VGPU_LOCK_DIR", VGPU_LOCK_DIR},
    [VGPU_PATH_VMEM_NODE_DIR] = {"VGPU_VMEM_NODE_DIR", VGPU_VMEM_NODE_DIR},
    [VGPU_PATH_SM_NODE_DIR] = {"VGPU_SM_NODE_DIR", VGPU_SM_NODE_DIR},
    [VGPU_PATH_REGISTER_CLIENT] = {"VGPU_REGISTER_CLIENT", "/etc/vgpu-manager/registry/vgpu-register"},
    [VGPU_PATH_REGISTRY_SOCKET] = {"VGPU_REGISTRY_SOCKET", "/etc/vgpu-manager/registry/socket.sock"},
    [VGPU_PATH_HOST_PROC] = {"VGPU_HOST_PROC", "/etc/vgpu-manager/.host_proc"},
    [VGPU_PATH_PROC] = {"VGPU_PROC", "/proc"},
    [VGPU_PATH_DRIVER_VERSION] = {"VGPU_DRIVER_VERSION_FILE", "/proc/driver/nvidia/version"},
};

const char *vgpu_path(enum vgpu_path_id id)
{
    const char *v = getenv(paths[id].env);
    return v != NULL && v[0] != '\0' ? v : paths[id].def;
}
