/* vgpu.config (layout vgpu_files.h): the container's identity and limits for the host side. In DRA
 * mode nobody else writes it, so the first library process of the container does, from its env. */
#ifndef VGPU_CONFIG_FILE_H
#define VGPU_CONFIG_FILE_H

#include "env.h"
#include "vgpu_files.h"

/* Fill `out` from the parsed env, the raw env (identity, core limits) and the driver versions
 * (pure given `lookup`). 0, or -1 with err set. */
VGPU_HIDDEN int vgpu_config_build(struct vgpu_config *out, const struct vgpu_env_config *cfg, vgpu_env_lookup lookup,
                                  void *ctx, int cuda_version, const char *driver_version, char *err, size_t cap);

/* Write <config dir>/vgpu.config unless it already holds a valid header (under an OFD write lock on
 * byte 0; no O_TRUNC: ftruncate 0, pwrite, ftruncate to the file size). A directory we cannot
 * write (mounted read-only by a host that writes the file itself) is not an error. */
VGPU_HIDDEN void vgpu_config_publish(const struct vgpu_env_config *cfg);

#endif
