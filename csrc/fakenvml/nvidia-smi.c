/*
 * A fake nvidia-smi (test support): the few forms of NVIDIA's tool that tests and the demo use, over
 * whichever libnvidia-ml.so.1 the loader finds (linked by soname, no rpath), so in a vGPU container a
 * preloaded control library's limited memory shows as it would with the real tool.
 *
 *   nvidia-smi                 a short table: per GPU its index, name, UUID, memory used / total and
 *                              MIG mode ("MIG M.": Enabled, Disabled, or N/A on a GPU without MIG)
 *   nvidia-smi -L              GPU <index>: <name> (UUID: <uuid>), and under a GPU in MIG mode one
 *                              line per MIG device: MIG <profile> Device <n>: (UUID: <uuid>)
 *   nvidia-smi --version       the tool's, the driver's and CUDA's versions
 *   nvidia-smi --query-gpu=uuid,memory.total,memory.used --format=csv[,noheader][,nounits]
 *                              any of those three fields, in any order
 *
 * Exit status as the real tool's: 9 when NVML cannot be initialized (with its message), 2 for
 * arguments it does not take, 15 for a GPU fallen off the bus, 255 for another NVML error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The NVML calls used, from nvml.h's public ABI. */
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
int nvmlInit_v2(void);
int nvmlShutdown(void);
const char *nvmlErrorString(int result);
int nvmlSystemGetDriverVersion(char *version, unsigned int length);
int nvmlSystemGetCudaDriverVersion(int *version);
int nvmlDeviceGetCount_v2(unsigned int *count);
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
int nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
int nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
int nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode);
int nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count);
int nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice);

#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_GPU_IS_LOST 15
#define EXIT_USAGE 2
#define EXIT_NO_DRIVER 9
#define MIB (1ull << 20)
#define MAX_FIELDS 16

typedef struct {
    nvmlDevice_t handle;
    char name[96];
    char uuid[96];
    nvmlMemory_t memory;
    int mig; /* MIG mode now: 1 enabled, 0 disabled, -1 the GPU has none */
} gpu_info;

static void nvml_check(int rc, const char *call) {
    if (rc == 0) return;
    printf("nvidia-smi: %s: %s\n", call, nvmlErrorString(rc));
    exit(rc == NVML_ERROR_GPU_IS_LOST ? NVML_ERROR_GPU_IS_LOST : 255);
}

static __attribute__((noreturn)) void usage(const char *why) {
    fprintf(stderr, "nvidia-smi: %s\n", why);
    fprintf(stderr, "This fake nvidia-smi takes: no arguments, -L, --version, or\n"
                    "  --query-gpu=uuid,memory.total,memory.used --format=csv[,noheader][,nounits]\n");
    exit(EXIT_USAGE);
}

static void init(void) {
    int rc = nvmlInit_v2();
    if (rc == 0) return;
    printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
           "Make sure that the latest NVIDIA driver is installed and running.\n%s\n",
           nvmlErrorString(rc));
    exit(EXIT_NO_DRIVER);
}

static unsigned int gpu_count(void) {
    unsigned int n = 0;
    nvml_check(nvmlDeviceGetCount_v2(&n), "nvmlDeviceGetCount_v2");
    return n;
}

static void read_gpu(unsigned int index, gpu_info *g) {
    nvmlDevice_t d;
    unsigned int current, pending;
    nvml_check(nvmlDeviceGetHandleByIndex_v2(index, &d), "nvmlDeviceGetHandleByIndex_v2");
    g->handle = d;
    nvml_check(nvmlDeviceGetName(d, g->name, sizeof g->name), "nvmlDeviceGetName");
    nvml_check(nvmlDeviceGetUUID(d, g->uuid, sizeof g->uuid), "nvmlDeviceGetUUID");
    nvml_check(nvmlDeviceGetMemoryInfo(d, &g->memory), "nvmlDeviceGetMemoryInfo");
    int rc = nvmlDeviceGetMigMode(d, &current, &pending);
    if (rc != NVML_ERROR_NOT_SUPPORTED) nvml_check(rc, "nvmlDeviceGetMigMode");
    g->mig = rc == NVML_ERROR_NOT_SUPPORTED ? -1 : current != 0;
}

/* Under a GPU in MIG mode: "  MIG 3g.20gb     Device  0: (UUID: MIG-...)", one line per MIG device. */
static void list_mig_devices(const gpu_info *g) {
    unsigned int max = 0, n = 0;
    nvml_check(nvmlDeviceGetMaxMigDeviceCount(g->handle, &max), "nvmlDeviceGetMaxMigDeviceCount");
    for (unsigned int i = 0; i < max; i++) {
        nvmlDevice_t m;
        int rc = nvmlDeviceGetMigDeviceHandleByIndex(g->handle, i, &m);
        if (rc == NVML_ERROR_NOT_FOUND) continue;
        nvml_check(rc, "nvmlDeviceGetMigDeviceHandleByIndex");
        char name[96], uuid[96];
        nvml_check(nvmlDeviceGetName(m, name, sizeof name), "nvmlDeviceGetName");
        nvml_check(nvmlDeviceGetUUID(m, uuid, sizeof uuid), "nvmlDeviceGetUUID");
        const char *kind = strstr(name, " MIG ");
        printf("  MIG %-12s Device %2u: (UUID: %s)\n", kind ? kind + 5 : name, n++, uuid);
    }
}

static void versions(char *driver, size_t size, int *cuda_major, int *cuda_minor) {
    int cuda;
    nvml_check(nvmlSystemGetDriverVersion(driver, (unsigned int)size), "nvmlSystemGetDriverVersion");
    nvml_check(nvmlSystemGetCudaDriverVersion(&cuda), "nvmlSystemGetCudaDriverVersion");
    *cuda_major = cuda / 1000;
    *cuda_minor = cuda % 1000 / 10;
}

static int show_table(void) {
    char driver[80];
    int major, minor;
    versions(driver, sizeof driver, &major, &minor);
    printf("NVIDIA-SMI %s    Driver Version: %s    CUDA Version: %d.%d\n", driver, driver, major, minor);
    printf("%-4s %-28s %-42s %-22s %s\n", "GPU", "Name", "UUID", "Memory-Usage", "MIG M.");
    for (unsigned int i = 0, n = gpu_count(); i < n; i++) {
        gpu_info g;
        char memory[48];
        read_gpu(i, &g);
        snprintf(memory, sizeof memory, "%lluMiB / %lluMiB", g.memory.used / MIB, g.memory.total / MIB);
        printf("%4u %-28s %-42s %-22s %s\n", i, g.name, g.uuid, memory,
               g.mig < 0 ? "N/A" : g.mig ? "Enabled" : "Disabled");
    }
    return 0;
}

static int list_gpus(void) {
    for (unsigned int i = 0, n = gpu_count(); i < n; i++) {
        gpu_info g;
        read_gpu(i, &g);
        printf("GPU %u: %s (UUID: %s)\n", i, g.name, g.uuid);
        if (g.mig > 0) list_mig_devices(&g);
    }
    return 0;
}

static int show_version(void) {
    char driver[80];
    int major, minor;
    versions(driver, sizeof driver, &major, &minor);
    printf("NVIDIA-SMI version  : %s\nDRIVER version      : %s\nCUDA Version        : %d.%d\n", driver, driver,
           major, minor);
    return 0;
}

/* ---- --query-gpu ---------------------------------------------------------------------------- */

enum field { F_UUID, F_MEMORY_TOTAL, F_MEMORY_USED };
static const char *const field_names[] = {"uuid", "memory.total", "memory.used"};

/* Split `list` at commas into the known fields; usage() on an unknown one. */
static int parse_fields(char *list, enum field *out) {
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        tok += strspn(tok, " ");
        int known = -1;
        for (int k = 0; k < 3; k++)
            if (strcmp(tok, field_names[k]) == 0) known = k;
        if (known < 0) {
            char why[200];
            snprintf(why, sizeof why, "Field \"%.100s\" is not a valid field to query.", tok);
            usage(why);
        }
        if (n == MAX_FIELDS) usage("too many fields to query");
        out[n++] = (enum field)known;
    }
    if (n == 0) usage("--query-gpu names no field");
    return n;
}

/* --format: csv, and optionally noheader and nounits. */
static void parse_format(char *format, int *header, int *units) {
    int csv = 0;
    char *save = NULL;
    *header = *units = 1;
    for (char *tok = strtok_r(format, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        tok += strspn(tok, " ");
        if (strcmp(tok, "csv") == 0) {
            csv = 1;
        } else if (strcmp(tok, "noheader") == 0) {
            *header = 0;
        } else if (strcmp(tok, "nounits") == 0) {
            *units = 0;
        } else {
            char why[200];
            snprintf(why, sizeof why, "\"%.100s\" is not a valid format option.", tok);
            usage(why);
        }
    }
    if (!csv) usage("--format must include csv");
}

static void print_field(enum field f, const gpu_info *g, int units) {
    const char *unit = units ? " MiB" : "";
    if (f == F_UUID)
        printf("%s", g->uuid);
    else
        printf("%llu%s", (f == F_MEMORY_TOTAL ? g->memory.total : g->memory.used) / MIB, unit);
}

static int query(char *fields_arg, char *format_arg) {
    enum field fields[MAX_FIELDS];
    int header, units;
    int n = parse_fields(fields_arg, fields);
    parse_format(format_arg, &header, &units);
    init();
    if (header)
        for (int k = 0; k < n; k++)
            printf("%s%s%s", k ? ", " : "", field_names[fields[k]], fields[k] != F_UUID && units ? " [MiB]" : "");
    if (header) printf("\n");
    for (unsigned int i = 0, count = gpu_count(); i < count; i++) {
        gpu_info g;
        read_gpu(i, &g);
        for (int k = 0; k < n; k++) {
            if (k) printf(", ");
            print_field(fields[k], &g, units);
        }
        printf("\n");
    }
    nvmlShutdown();
    return 0;
}

/* "--name=value" or "--name value": the value, advancing *i past it; NULL if argv[*i] is not --name. */
static char *option_value(int argc, char **argv, int *i, const char *name) {
    size_t len = strlen(name);
    if (strncmp(argv[*i], name, len) != 0) return NULL;
    if (argv[*i][len] == '=') return argv[*i] + len + 1;
    if (argv[*i][len] != '\0') return NULL;
    if (*i + 1 >= argc) usage("an option lacks its value");
    return argv[++*i];
}

int main(int argc, char **argv) {
    char *fields = NULL, *format = NULL;
    int list = 0, version = 0;
    for (int i = 1; i < argc; i++) {
        char *v;
        if (strcmp(argv[i], "-L") == 0 || strcmp(argv[i], "--list-gpus") == 0)
            list = 1;
        else if (strcmp(argv[i], "--version") == 0)
            version = 1;
        else if ((v = option_value(argc, argv, &i, "--query-gpu")) != NULL)
            fields = v;
        else if ((v = option_value(argc, argv, &i, "--format")) != NULL)
            format = v;
        else
            usage("unknown argument");
    }
    if (list + version + (fields != NULL) > 1) usage("-L, --version and --query-gpu do not combine");
    if ((fields == NULL) != (format == NULL)) usage("--query-gpu and --format go together");
    if (fields) return query(fields, format);
    init();
    int rc = list ? list_gpus() : version ? show_version() : show_table();
    nvmlShutdown();
    return rc;
}
