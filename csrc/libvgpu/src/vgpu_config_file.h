/* vgpu.config (layout vgpu_files.h): the container's identity and limits for the host side. In DRA
 * mode nobody else writes it, so the first library process of the container does, from its env;
 * each process reads back the entries of devices its env does not name (hot-plugged ones). */
#ifndef VGPU_CONFIG_FILE_H
#define VGPU_CONFIG_FILE_H

#include "env.h"
#include "vgpu_files.h"

/* Fill `out` from the parsed env, the raw env (identity, core limits) and the driver versions
 * (pure given `lookup`). 0, or -1 with err set. */
VGPU_HIDDEN int vgpu_config_build(struct vgpu_config *out, const struct vgpu_env_config *cfg, vgpu_env_lookup lookup,
                                  void *ctx, int cuda_version, const char *driver_version, char *err, size_t cap);

/* Read <config dir>/vgpu.config under a read lock on byte 0 (O_NOFOLLOW, a regular file only): 0
 * when it holds a valid header, -1 when there is none. */
VGPU_HIDDEN int vgpu_config_read(struct vgpu_config *out);

/* The devices the environment does not name, from a read vgpu.config: vgpud adds an entry there for
 * a device hot-plugged into the running container (vgpud/hotplug/vgpuconfig.py), whose limits the
 * container's env cannot carry. Adopts every active entry marked `hotplug` with a GPU UUID at an
 * index whose env slot is empty, unless the env names that UUID at another index (pure). Entries of devices the env
 * names are never read: the file can add limits to an unlimited device, never lift one. Returns
 * the number adopted. */
VGPU_HIDDEN int vgpu_config_adopt(struct vgpu_env_config *cfg, const struct vgpu_config *file);

/* Write <config dir>/vgpu.config unless it already holds a valid header (under an OFD write lock on
 * byte 0; no O_TRUNC: ftruncate 0, pwrite, ftruncate to the file size). A directory we cannot
 * write (mounted read-only by a host that writes the file itself) is not an error. */
VGPU_HIDDEN void vgpu_config_publish(const struct vgpu_env_config *cfg);

#endif
