/* vgpu.config (layout vgpu_files.h): the container's identity and limits for the host side. In DRA
 * mode the first library process of the container writes it from its env, and later ones merge
 * their env into it; vgpud adds the entries of hot-plugged devices (creating the file when no
 * library process ran yet), and each process reads back those its env does not name. */
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

/* `file` (a valid vgpu.config) completed with what `env` (vgpu_config_build) holds (pure): each
 * identity field still zero or blank takes the env's (the CUDA version as one pair), and each
 * device of the env takes its slot unless the slot holds an active entry the library wrote (the
 * first publisher's; every process of a container has the same env). A slot holding an inactive
 * entry, or a hot-plugged one where the env has its own device (a file vgpud would never leave:
 * its extend refuses such a slot), gets the env's entry. Hot-plugged entries elsewhere stay. */
VGPU_HIDDEN void vgpu_config_merge(struct vgpu_config *file, const struct vgpu_config *env);

/* Write <config dir>/vgpu.config from the env (vgpu_config_build) under an OFD write lock on byte
 * 0: a file without a valid header and whole struct is rebuilt (no O_TRUNC: ftruncate 0, pwrite,
 * ftruncate to the file size); a valid one (written by an earlier process, or created by vgpud with
 * hot-plugged entries before the library ever ran) gets vgpu_config_merge, in one pwrite of the
 * struct and only when it changes something. Entries are written whole under the lock, seq 0, as
 * vgpud writes its own: every reader takes the lock. A directory we cannot write (mounted
 * read-only by a host that writes the file itself) is not an error. */
VGPU_HIDDEN void vgpu_config_publish(const struct vgpu_env_config *cfg);

#endif
