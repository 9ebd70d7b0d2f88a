/* Every container path the library touches, each overridable by an environment variable so that
 * tests run against a temp dir (one place for these facts; the loader's struct loader_paths is
 * filled from here). */
#ifndef VGPU_PATHS_H
#define VGPU_PATHS_H

enum vgpu_path_id {
    VGPU_PATH_CONFIG_DIR,      /* VGPU_CONFIG_DIR       /etc/vgpu-manager/config */
    VGPU_PATH_PIDS_CONFIG,     /* VGPU_PIDS_CONFIG      /etc/vgpu-manager/config/pids.config */
    VGPU_PATH_LOCK_DIR,        /* VGPU_LOCK_DIR         /tmp/.vgpu_lock */
    VGPU_PATH_VMEM_NODE_DIR,   /* VGPU_VMEM_NODE_DIR    /tmp/.vmem_node */
    VGPU_PATH_SM_NODE_DIR,     /* VGPU_SM_NODE_DIR      /tmp/.sm_node */
    VGPU_PATH_REGISTER_CLIENT, /* VGPU_REGISTER_CLIENT  /etc/vgpu-manager/registry/vgpu-register */
    VGPU_PATH_REGISTRY_SOCKET, /* VGPU_REGISTRY_SOCKET  /etc/vgpu-manager/registry/socket.sock */
    VGPU_PATH_HOST_PROC,       /* VGPU_HOST_PROC        /etc/vgpu-manager/.host_proc */
    VGPU_PATH_PROC,            /* VGPU_PROC             /proc */
    VGPU_PATH_DRIVER_VERSION,  /* VGPU_DRIVER_VERSION_FILE /proc/driver/nvidia/version */
    VGPU_PATH_COUNT
};

/* The path, from its override variable (process environment only) or its default. Stable for
 * the life of the process. */
__attribute__((visibility("hidden"))) const char *vgpu_path(enum vgpu_path_id id);

#endif
