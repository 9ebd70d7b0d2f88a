/*
 * The GPU profile both fakes serve (csrc/fakenvml, csrc/fakecuda): a vgpud profile YAML file in the
 * flat subset defined by vgpud/gpu/profile.py, parsed here exactly to that grammar.
 */
#ifndef FAKESTATE_PROFILE_H
#define FAKESTATE_PROFILE_H

#include <stddef.h>

#define FAKE_MAX_GPUS 64
#define FAKE_STRING_MAX 96      /* uuid and name buffers (NVML's _V2 sizes) */
#define FAKE_DRIVER_VERSION_MAX 80
#define FAKE_PCI_BUS_ID_SIZE 32 /* NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE */
#define FAKE_PCI_BUS_ID_LEGACY_SIZE 16
#define FAKE_MIG_SLICES 7          /* a MIG GPU's GPU-instance slices, so at most 7 MIG devices */
#define FAKE_MIG_DEVICES_MAX 128   /* the migDevices value, as written */

/* nvmlPciInfo_t's layout (nvml.h), so the NVML fake can copy it out whole. */
typedef struct {
    char busIdLegacy[FAKE_PCI_BUS_ID_LEGACY_SIZE];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[FAKE_PCI_BUS_ID_SIZE];
} fake_pci;

enum {
    K_UUID = 1 << 0,
    K_INDEX = 1 << 1,
    K_MINOR = 1 << 2,
    K_NAME = 1 << 3,
    K_BRAND = 1 << 4,
    K_ARCH = 1 << 5,
    K_MEMORY = 1 << 6,
    K_PCI = 1 << 7,
    K_NUMA = 1 << 8,
    K_CC = 1 << 9,
    K_ADDRESSING = 1 << 10,
    K_MIG_MODE = 1 << 11,
    K_MIG_PENDING = 1 << 12,
    K_MIG_DEVICES = 1 << 13,
    K_REQUIRED = K_UUID | K_INDEX | K_MINOR | K_NAME | K_BRAND | K_ARCH | K_MEMORY | K_PCI | K_CC,
};

/*
 * One MIG profile the fakes know: NVIDIA's figures (`nvidia-smi mig -lgip`) for the A100-SXM4-40GB
 * (on Ampere GPUs) and the H100 80GB (on Hopper and Blackwell GPUs); vgpud/gpu/migtable.py has the
 * same table for the mock backend.
 */
typedef struct {
    const char *name;        /* "3g.20gb" */
    unsigned int arch;       /* the architecture (NVML's number) whose GPUs offer it */
    unsigned int slices;     /* GPU-instance slices of the 7 */
    unsigned int memory_mib; /* the instance's memory */
    unsigned int sm_count;   /* its streaming multiprocessors */
    unsigned int decoders;   /* its video decoders */
} fake_mig_profile;

typedef struct fake_gpu {
    unsigned int seen;    /* K_* bits */
    int line, index_line; /* where the item and its index are */
    char uuid[FAKE_STRING_MAX];
    char name[FAKE_STRING_MAX];
    unsigned int index, minor, brand, arch, addressing;
    unsigned long long memory;
    fake_pci pci;
    int numa, cc_major, cc_minor;
    /* MIG: the current and pending modes (1: enabled), and the MIG devices, in migDevices order */
    unsigned int mig_mode, mig_pending, mig_count;
    const fake_mig_profile *mig[FAKE_MIG_SLICES];
    char mig_devices[FAKE_MIG_DEVICES_MAX]; /* as written (parsed once the GPU's keys are all read) */
    int mig_mode_line, mig_pending_line, mig_devices_line;
} fake_gpu;

typedef struct {
    unsigned int seen; /* 1: driverVersion, 2: cudaDriverVersion, 4: gpus */
    char driver[FAKE_DRIVER_VERSION_MAX];
    int cuda; /* 1000 * major + 10 * minor */
    unsigned int count;
    fake_gpu gpus[FAKE_MAX_GPUS];      /* in profile order */
    fake_gpu *by_index[FAKE_MAX_GPUS]; /* by NVML index */
} fake_profile;

/* Parse `path` into *out. 0, or -1 with *why saying "profile PATH: line N: what". */
int fake_profile_load(const char *path, fake_profile *out, char *why, size_t why_size);
/* The same from the open `fd` (read from its offset, then closed), `name` in the messages. */
int fake_profile_load_fd(int fd, const char *name, fake_profile *out, char *why, size_t why_size);

/* The profile's GPUs in PCI bus id order (the real driver's enumeration order): out[0..count). */
void fake_profile_pci_order(const fake_profile *p, const fake_gpu **out);

/* Streaming multiprocessors and max resident threads per SM of a GPU. The profile has no such keys
 * (vgpud never needs them), so they follow the compute capability: threads per SM is an
 * architectural constant; the SM count is that of the capability's data-centre part (A100 108,
 * H100/H200 132, B200 148), 80 otherwise. */
unsigned int fake_gpu_sm_count(const fake_gpu *g);
unsigned int fake_gpu_threads_per_sm(const fake_gpu *g);

/*
 * MIG (vgpud/gpu/profile.py's format comment has the keys). A GPU supports MIG when its architecture
 * is Ampere, Hopper or Blackwell and a word of its product name (split at spaces and dashes) is A100,
 * A30, H100, H200 or B200; migMode (the current mode) and migModePending on any other GPU are profile
 * errors, as are MIG devices without migMode enabled, an unknown profile name, and more than 7 slices.
 * MIG device `slot` (its place in migDevices, from 0) has GPU instance id slot + 1, compute instance
 * id 0 (one compute instance filling its GPU instance), and the UUID "MIG-" + the parent's UUID after
 * "GPU-" with its third group (characters 14..17) replaced by the two ids as two hex digits each.
 */
int fake_gpu_mig_capable(const fake_gpu *g);
unsigned int fake_mig_gpu_instance_id(unsigned int slot);
unsigned int fake_mig_compute_instance_id(unsigned int slot);
void fake_mig_uuid(const fake_gpu *g, unsigned int slot, char *out, size_t size);

#endif
