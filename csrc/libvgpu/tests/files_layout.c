/* Prints the layouts of vgpu_files.h as JSON: for every struct its size and, per field, its
 * offset and size, plus the constants. tests/unit/test_libfiles.py compares this with the
 * Python table in vgpud/partition/libfiles.py, so the two sides cannot drift apart.
 *
 * `files_layout --write DIR` writes the three files, filled through the C structs with the
 * sample values below, for the Python parser to read back (the test knows the same values);
 * `files_layout --read DIR` reads the three files (as vgpud's Python side built them) through the
 * C structs and prints what it found as JSON. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vgpu_files.h"

#define FIELD(T, f) printf("%s\"%s\": [%zu, %zu]", first ? "" : ", ", #f, offsetof(T, f), sizeof(((T *)0)->f)), first = 0
#define OPEN(T) printf("%s\"%s\": {\"size\": %zu, \"fields\": {", n++ ? ", " : "", #T, sizeof(T)), first = 1
#define CLOSE() printf("}}")
#define CONST(c) printf(", \"%s\": %llu", #c, (unsigned long long)(c))

static int write_file(const char *dir, const char *name, const void *data, size_t len, size_t file_size) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)file_size) != 0 || pwrite(fd, data, len, 0) != (ssize_t)len) {
        fprintf(stderr, "files_layout: %s: %s\n", path, strerror(errno));
        return 1;
    }
    return close(fd) != 0;
}

static int write_samples(const char *dir) {
    static struct vgpu_config config;
    static struct vgpu_vmem_node vmem;
    static struct vgpu_sm_node sm;

    config.magic = VGPU_CONFIG_MAGIC;
    config.layout = VGPU_CONFIG_LAYOUT;
    config.size = sizeof config;
    config.count = VGPU_MAX_DEVICES;
    config.cuda_version_major = 12;
    config.cuda_version_minor = 8;
    strcpy(config.driver_version, "570.86.15");
    strcpy(config.pod_uid, "0f6c7d9e-1111-2222-3333-444455556666");
    strcpy(config.pod_name, "trainer");
    strcpy(config.pod_namespace, "team-a");
    strcpy(config.container_name, "main");
    memset(config.reg_uuid, 'r', sizeof config.reg_uuid); /* full field: no NUL */
    config.compatibility_mode = 102;
    config.sm_watcher = 0;
    config.vmem_node = 1;
    struct vgpu_config_device *d = &config.devices[3];
    d->seq = 2;
    strcpy(d->uuid, "GPU-8d2f0d3a-5c41-4b0e-9d2a-0123456789ab");
    d->total_memory = 4ull << 30;
    d->real_memory = 2ull << 30;
    d->hard_core = 30;
    d->soft_core = 60;
    d->core_limit = 1;
    d->hard_limit = 0;
    d->memory_limit = 1;
    d->memory_oversold = 1;
    d->activate = 1;

    vmem.magic = VGPU_VMEM_MAGIC;
    vmem.layout = VGPU_VMEM_LAYOUT;
    vmem.size = sizeof vmem;
    vmem.count = VGPU_MAX_DEVICES;
    vmem.devices[3].processes[0] = (struct vgpu_vmem_process){.pid = 4242, .used = 1ull << 20};
    vmem.devices[3].processes[1] = (struct vgpu_vmem_process){.pid = 4343, .used = (3ull << 30) + 7};
    vmem.devices[3].processes_size = 2;
    vmem.devices[15].processes[1023] = (struct vgpu_vmem_process){.pid = 2147483647, .used = ~0ull};
    vmem.devices[15].processes_size = 1024;

    sm.magic = VGPU_SM_MAGIC;
    sm.layout = VGPU_SM_LAYOUT;
    sm.size = sizeof sm;
    sm.count = VGPU_MAX_DEVICES;
    sm.sampler_pid = 4242;
    sm.sampler_heartbeat_ns = 123456789012345ull;
    struct vgpu_sm_device *b = &sm.devices[3];
    b->tokens = -1234567;
    b->last_refill_ns = 987654321ull;
    b->ceiling = 8650752;
    b->share = 40000;
    b->last_sample_ns = 987000000ull;
    b->util = 295;
    b->limit = 30;
    b->hard_core = 30;
    b->soft_core = 60;
    b->active = 1;

    return write_file(dir, "vgpu.config", &config, sizeof config, VGPU_CONFIG_FILE_SIZE) ||
           write_file(dir, "vmem_node.config", &vmem, sizeof vmem, VGPU_VMEM_FILE_SIZE) ||
           write_file(dir, "sm_node.config", &sm, sizeof sm, VGPU_SM_FILE_SIZE);
}

static void *read_file(const char *dir, const char *name, size_t len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    void *buf = calloc(1, len);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (buf == NULL || fd < 0 || pread(fd, buf, len, 0) != (ssize_t)len) {
        fprintf(stderr, "files_layout: %s: %s\n", path, fd < 0 ? strerror(errno) : "short read");
        exit(1);
    }
    close(fd);
    return buf;
}

static int read_samples(const char *dir) {
    struct vgpu_config *c = read_file(dir, "vgpu.config", sizeof *c);
    struct vgpu_vmem_node *v = read_file(dir, "vmem_node.config", sizeof *v);
    struct vgpu_sm_node *s = read_file(dir, "sm_node.config", sizeof *s);
    printf("{\"config\": {\"header\": [%u, %u, %u, %u], \"cuda\": [%d, %d], \"driver\": \"%.32s\", "
           "\"pod_uid\": \"%.48s\", \"pod_name\": \"%.64s\", \"pod_namespace\": \"%.64s\", "
           "\"container_name\": \"%.64s\", \"reg_uuid\": \"%.48s\", \"flags\": [%d, %d, %d], \"devices\": {",
           c->magic, c->layout, c->size, c->count, c->cuda_version_major, c->cuda_version_minor, c->driver_version,
           c->pod_uid, c->pod_name, c->pod_namespace, c->container_name, c->reg_uuid, c->compatibility_mode,
           c->sm_watcher, c->vmem_node);
    const char *sep = "";
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        const struct vgpu_config_device *d = &c->devices[i];
        if (!d->activate)
            continue;
        printf("%s\"%d\": [%u, \"%.48s\", %llu, %llu, %d, %d, %d, %d, %d, %d, %d]", sep, i, d->seq, d->uuid,
               (unsigned long long)d->total_memory, (unsigned long long)d->real_memory, d->hard_core, d->soft_core,
               d->core_limit, d->hard_limit, d->memory_limit, d->memory_oversold, d->activate);
        sep = ", ";
    }
    printf("}}, \"vmem\": {\"header\": [%u, %u, %u, %u], \"devices\": {", v->magic, v->layout, v->size, v->count);
    sep = "";
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        const struct vgpu_vmem_device *d = &v->devices[i];
        if (d->processes_size == 0)
            continue;
        printf("%s\"%d\": [", sep, i);
        for (uint32_t k = 0; k < d->processes_size && k < VGPU_VMEM_MAX_PROCESSES; k++)
            printf("%s[%d, %llu]", k ? ", " : "", d->processes[k].pid, (unsigned long long)d->processes[k].used);
        printf("]");
        sep = ", ";
    }
    printf("}}, \"sm\": {\"header\": [%u, %u, %u, %u], \"sampler\": [%d, %llu], \"devices\": {", s->magic,
           s->layout, s->size, s->count, s->sampler_pid, (unsigned long long)s->sampler_heartbeat_ns);
    sep = "";
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        const struct vgpu_sm_device *b = &s->devices[i];
        if (!b->active)
            continue;
        printf("%s\"%d\": [%lld, %llu, %lld, %lld, %llu, %d, %d, %d, %d, %d]", sep, i, (long long)b->tokens,
               (unsigned long long)b->last_refill_ns, (long long)b->ceiling, (long long)b->share,
               (unsigned long long)b->last_sample_ns, b->util, b->limit, b->hard_core, b->soft_core, b->active);
        sep = ", ";
    }
    printf("}}}\n");
    free(c);
    free(v);
    free(s);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write") == 0)
        return write_samples(argv[2]);
    if (argc == 3 && strcmp(argv[1], "--read") == 0)
        return read_samples(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: files_layout [--write DIR | --read DIR]\n");
        return 2;
    }
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
    FIELD(struct vgpu_config_device, hotplug);
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
