/*
 * fakenvml: a stand-in libnvidia-ml.so.1 for machines without GPUs (test support only).
 *
 * It serves the GPUs of a vgpud GPU profile, the same YAML file the mock backend reads, so that
 * vgpud's NVML backend runs its real code path (nvidia-ml-py -> ctypes -> this library) in CI and
 * must produce the same inventory as the mock backend.
 *
 *   FAKE_NVML_PROFILE=/path/to/profile.yaml   read at nvmlInit* when not already initialized
 *
 * The profile is a flat YAML subset, defined in vgpud/gpu/profile.py; this parser implements exactly
 * that grammar (the Python side additionally checks that PyYAML agrees). A missing or unparsable
 * profile makes nvmlInit* fail with NVML_ERROR_UNKNOWN, print one "fakenvml: ..." line to stderr, and
 * nvmlErrorString(NVML_ERROR_UNKNOWN) then says why.
 *
 * Struct layouts follow nvml.h (and nvidia-ml-py's ctypes mirrors of it). Not thread-safe: callers
 * serialize init and shutdown, as vgpud does.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- the NVML ABI subset ---------------------------------------------------------------- */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_STRING_MAX 96 /* uuid and name buffers (the _V2 sizes) */
#define NVML_DRIVER_VERSION_MAX 80

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

typedef struct {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct {
    unsigned int version, value;
} nvmlDeviceAddressingMode_t;
#define nvmlDeviceAddressingMode_v1 ((unsigned int)(sizeof(nvmlDeviceAddressingMode_t) | (1 << 24)))

_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(nvmlMemory_v2 == 0x02000028, "nvmlMemory_v2 version");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
_Static_assert(nvmlDeviceAddressingMode_v1 == 0x1000008, "nvmlDeviceAddressingMode_v1 version");

/* ---- the served GPUs ---------------------------------------------------------------------- */

#define MAX_GPUS 64
#define LINE_MAX_BYTES 511

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
    K_REQUIRED = K_UUID | K_INDEX | K_MINOR | K_NAME | K_BRAND | K_ARCH | K_MEMORY | K_PCI | K_CC,
};

typedef struct nvmlDevice_st {
    unsigned int seen; /* K_* bits */
    int line, index_line; /* where the item and its index are */
    char uuid[NVML_STRING_MAX];
    char name[NVML_STRING_MAX];
    unsigned int index, minor, brand, arch, addressing;
    unsigned long long memory;
    nvmlPciInfo_t pci;
    int numa, cc_major, cc_minor;
} fake_gpu;
typedef fake_gpu *nvmlDevice_t;

static struct {
    unsigned int seen; /* 1: driverVersion, 2: cudaDriverVersion, 4: gpus */
    char driver[NVML_DRIVER_VERSION_MAX];
    int cuda;
    unsigned int count;
    fake_gpu gpus[MAX_GPUS];   /* in profile order */
    fake_gpu *by_index[MAX_GPUS];
} profile;

static int init_count;
static char last_error[640];

typedef struct {
    const char *name;
    unsigned int value;
} name_value;

/* go-nvlib's names, as in vgpud/gpu/model.py. */
static const name_value brands[] = {
    {"Unknown", 0},     {"Quadro", 1},      {"Tesla", 2},        {"NVS", 3},
    {"Grid", 4},        {"GeForce", 5},     {"Titan", 6},        {"NvidiaVApps", 7},
    {"NvidiaVPC", 8},   {"NvidiaVCS", 9},   {"NvidiaVWS", 10},   {"NvidiaCloudGaming", 11},
    {"QuadroRTX", 12},  {"NvidiaRTX", 13},  {"Nvidia", 14},      {"GeForceRTX", 15},
    {"TitanRTX", 16},   {NULL, 0},
};
static const name_value architectures[] = {
    {"Kepler", 2}, {"Maxwell", 3},       {"Pascal", 4}, {"Volta", 5},      {"Turing", 6},
    {"Ampere", 7}, {"Ada Lovelace", 8},  {"Hopper", 9}, {"Blackwell", 10}, {"Orin", 11},
    {"Unknown", 0xFFFFFFFFu},            {NULL, 0},
};
static const name_value addressing_modes[] = {{"None", 0}, {"HMM", 1}, {"ATS", 2}, {NULL, 0}};

/* ---- profile parsing ---------------------------------------------------------------------- */

typedef struct {
    const char *path;
    int line;
    char why[560];
} parse_ctx;

__attribute__((format(printf, 2, 3))) static int fail(parse_ctx *ctx, const char *fmt, ...) {
    char why[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (ctx->line > 0)
        snprintf(ctx->why, sizeof ctx->why, "profile %.200s: line %d: %s", ctx->path, ctx->line, why);
    else
        snprintf(ctx->why, sizeof ctx->why, "profile %.200s: %s", ctx->path, why);
    return -1;
}

/* ASCII only, whatever locale the host process has set. */
static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_alpha(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
static int is_alnum(char c) { return is_alpha(c) || is_digit(c); }
static int is_plain_char(char c) { return is_alnum(c) || (c != '\0' && strchr(" ._()+-", c) != NULL); }

/* Split "KEY: VALUE  # comment" in place. *value is NULL when the key has no value. */
static int split_pair(parse_ctx *ctx, char *s, char **key, char **value, int *quoted) {
    char *p = s;
    if (!is_alpha(*p)) return fail(ctx, "not a 'key: value' line in the profile subset");
    while (is_alnum(*p)) p++;
    if (*p != ':') return fail(ctx, "not a 'key: value' line in the profile subset");
    *p++ = '\0';
    *key = s;
    *value = NULL;
    *quoted = 0;
    char *after_colon = p;
    while (*p == ' ') p++;
    if (*p == '\0') return 0;
    if (p == after_colon) return fail(ctx, "a space must follow the colon after '%s'", s);
    if (*p == '#') return 0;
    char *end;
    if (*p == '"' || *p == '\'') {
        char q = *p++;
        *value = p;
        *quoted = 1;
        for (end = p; *end != q; end++) {
            if (*end == '\0') return fail(ctx, "unterminated quoted value for '%s'", s);
            if ((unsigned char)*end < 0x20 || (unsigned char)*end > 0x7e || (q == '"' && *end == '\\'))
                return fail(ctx, "character not allowed in the quoted value for '%s'", s);
        }
        *end++ = '\0';
        char *rest = end;
        while (*rest == ' ') rest++;
        if (*rest != '\0' && !(*rest == '#' && rest > end))
            return fail(ctx, "unexpected text after the value for '%s'", s);
        return 0;
    }
    if (!is_alnum(*p)) return fail(ctx, "value for '%s' must be quoted", s);
    *value = p;
    for (end = p; is_plain_char(*end); end++) {
    }
    if (*end != '\0' && !(*end == '#' && end[-1] == ' '))
        return fail(ctx, "character not allowed in the plain value for '%s' (quote it)", s);
    *end = '\0';
    while (end > p && end[-1] == ' ') *--end = '\0';
    return 0;
}

static int parse_int(parse_ctx *ctx, const char *key, const char *v, int quoted, unsigned long long max,
                     unsigned long long *out) {
    if (quoted || !(strcmp(v, "0") == 0 || (v[0] >= '1' && v[0] <= '9')))
        return fail(ctx, "%s: expected an unquoted integer, got '%s'", key, v);
    for (const char *c = v; *c; c++)
        if (!is_digit(*c)) return fail(ctx, "%s: expected an unquoted integer, got '%s'", key, v);
    errno = 0;
    unsigned long long n = strtoull(v, NULL, 10);
    if (errno == ERANGE || n > max) return fail(ctx, "%s: %s is out of range", key, v);
    *out = n;
    return 0;
}

static int parse_name(parse_ctx *ctx, const char *key, const char *v, const name_value *table,
                      unsigned int *out) {
    for (; table->name; table++)
        if (strcmp(table->name, v) == 0) {
            *out = table->value;
            return 0;
        }
    return fail(ctx, "%s: unknown value '%s'", key, v);
}

static int parse_version(parse_ctx *ctx, const char *key, const char *v, int *major, int *minor) {
    char tail;
    if (sscanf(v, "%3d.%2d%c", major, minor, &tail) != 2 || *major < 0 || *minor < 0)
        return fail(ctx, "%s: '%s' is not a version like \"12.4\"", key, v);
    return 0;
}

static int copy_string(parse_ctx *ctx, const char *key, const char *v, char *dst, size_t size) {
    if (v[0] == '\0' || strlen(v) >= size) return fail(ctx, "%s: must be 1 to %zu characters", key, size - 1);
    strcpy(dst, v);
    return 0;
}

static int set_top(parse_ctx *ctx, const char *key, const char *v) {
    int major, minor;
    if (strcmp(key, "driverVersion") == 0) {
        if (profile.seen & 1) return fail(ctx, "duplicate key '%s'", key);
        profile.seen |= 1;
        return copy_string(ctx, key, v, profile.driver, sizeof profile.driver);
    }
    if (strcmp(key, "cudaDriverVersion") == 0) {
        if (profile.seen & 2) return fail(ctx, "duplicate key '%s'", key);
        profile.seen |= 2;
        if (parse_version(ctx, key, v, &major, &minor) < 0) return -1;
        profile.cuda = major * 1000 + minor * 10;
        return 0;
    }
    return fail(ctx, "unknown key '%s'", key);
}

static int set_pci(parse_ctx *ctx, fake_gpu *g, const char *v) {
    unsigned int domain, bus, device, function;
    char tail;
    if (strlen(v) != 16 || sscanf(v, "%8x:%2x:%2x.%1u%c", &domain, &bus, &device, &function, &tail) != 4)
        return fail(ctx, "pciBusId: '%s' is not an NVML bus id like \"00000000:07:00.0\"", v);
    g->pci.domain = domain;
    g->pci.bus = bus;
    g->pci.device = device;
    strcpy(g->pci.busId, v);
    snprintf(g->pci.busIdLegacy, sizeof g->pci.busIdLegacy, "%04X:%02X:%02X.%u", domain & 0xFFFFu, bus,
             device, function);
    return 0;
}

static const struct {
    const char *key;
    unsigned int bit;
} gpu_keys[] = {{"uuid", K_UUID},          {"index", K_INDEX},          {"minor", K_MINOR},
                {"productName", K_NAME},   {"brand", K_BRAND},          {"architecture", K_ARCH},
                {"memoryTotal", K_MEMORY}, {"pciBusId", K_PCI},         {"numaNode", K_NUMA},
                {"computeCapability", K_CC}, {"addressingMode", K_ADDRESSING}, {NULL, 0}};

static int set_gpu(parse_ctx *ctx, fake_gpu *g, const char *key, const char *v, int quoted) {
    unsigned int bit = 0;
    for (int i = 0; gpu_keys[i].key; i++)
        if (strcmp(gpu_keys[i].key, key) == 0) bit = gpu_keys[i].bit;
    if (bit == 0) return fail(ctx, "unknown key '%s'", key);
    if (g->seen & bit) return fail(ctx, "duplicate key '%s'", key);
    g->seen |= bit;
    unsigned long long n;
    switch (bit) {
    case K_UUID:
        return copy_string(ctx, key, v, g->uuid, sizeof g->uuid);
    case K_NAME:
        return copy_string(ctx, key, v, g->name, sizeof g->name);
    case K_INDEX:
        if (parse_int(ctx, key, v, quoted, MAX_GPUS - 1, &n) < 0) return -1;
        g->index = (unsigned int)n;
        g->index_line = ctx->line;
        return 0;
    case K_MINOR:
        if (parse_int(ctx, key, v, quoted, 254, &n) < 0) return -1;
        g->minor = (unsigned int)n;
        return 0;
    case K_MEMORY:
        if (parse_int(ctx, key, v, quoted, ~0ULL, &n) < 0) return -1;
        g->memory = n;
        return 0;
    case K_NUMA:
        if (parse_int(ctx, key, v, quoted, 0x7FFFFFFF, &n) < 0) return -1;
        g->numa = (int)n;
        return 0;
    case K_BRAND:
        return parse_name(ctx, key, v, brands, &g->brand);
    case K_ARCH:
        return parse_name(ctx, key, v, architectures, &g->arch);
    case K_ADDRESSING:
        return parse_name(ctx, key, v, addressing_modes, &g->addressing);
    case K_PCI:
        return set_pci(ctx, g, v);
    default: /* K_CC */
        return parse_version(ctx, key, v, &g->cc_major, &g->cc_minor);
    }
}

static int check_complete(parse_ctx *ctx) {
    ctx->line = 0;
    if (!(profile.seen & 1)) return fail(ctx, "missing required key 'driverVersion'");
    if (!(profile.seen & 2)) return fail(ctx, "missing required key 'cudaDriverVersion'");
    if (!(profile.seen & 4)) return fail(ctx, "missing the 'gpus' list");
    if (profile.count == 0) return fail(ctx, "'gpus' lists no GPUs");
    for (unsigned int i = 0; i < profile.count; i++) {
        fake_gpu *g = &profile.gpus[i];
        ctx->line = g->line;
        for (int k = 0; gpu_keys[k].key; k++)
            if ((gpu_keys[k].bit & K_REQUIRED) && !(g->seen & gpu_keys[k].bit))
                return fail(ctx, "gpus[%u]: missing required key '%s'", i, gpu_keys[k].key);
        ctx->line = g->index_line;
        if (g->index >= profile.count)
            return fail(ctx, "gpus[%u].index: %u is out of range 0..%u", i, g->index, profile.count - 1);
        if (profile.by_index[g->index]) return fail(ctx, "gpus[%u].index: %u is used twice", i, g->index);
        profile.by_index[g->index] = g;
    }
    return 0;
}

static int parse_profile(parse_ctx *ctx) {
    memset(&profile, 0, sizeof profile);
    FILE *f = fopen(ctx->path, "r");
    if (!f) return fail(ctx, "cannot be opened: %s", strerror(errno));
    char line[LINE_MAX_BYTES + 3]; /* the line, \r, \n, NUL */
    int in_list = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        ctx->line++;
        size_t len = strlen(line);
        if (len > 0 && line[len - 1] == '\n')
            line[--len] = '\0';
        else if (!feof(f)) {
            rc = fail(ctx, "line longer than %d bytes", LINE_MAX_BYTES);
            break;
        }
        if (len > 0 && line[len - 1] == '\r') line[--len] = '\0';
        if (len > LINE_MAX_BYTES) {
            rc = fail(ctx, "line longer than %d bytes", LINE_MAX_BYTES);
            break;
        }
        char *first = line + strspn(line, " ");
        if (*first == '\0' || *first == '#') continue;
        if (strchr(line, '\t')) {
            rc = fail(ctx, "tab character (indent with spaces)");
            break;
        }
        char *key, *value;
        int quoted;
        if (strncmp(line, "  - ", 4) == 0) {
            if (!in_list) {
                rc = fail(ctx, "list item outside the 'gpus' list");
            } else if (profile.count == MAX_GPUS) {
                rc = fail(ctx, "more than %d GPUs", MAX_GPUS);
            } else {
                fake_gpu *g = &profile.gpus[profile.count++];
                g->line = ctx->line;
                g->numa = -1;
                if ((rc = split_pair(ctx, line + 4, &key, &value, &quoted)) == 0)
                    rc = value ? set_gpu(ctx, g, key, value, quoted) : fail(ctx, "key '%s' has no value", key);
            }
        } else if (strncmp(line, "    ", 4) == 0 && line[4] != ' ') {
            if (!in_list || profile.count == 0) {
                rc = fail(ctx, "indented line that continues no list item");
            } else if ((rc = split_pair(ctx, line + 4, &key, &value, &quoted)) == 0) {
                fake_gpu *g = &profile.gpus[profile.count - 1];
                rc = value ? set_gpu(ctx, g, key, value, quoted) : fail(ctx, "key '%s' has no value", key);
            }
        } else if (line[0] != ' ') {
            in_list = 0;
            if ((rc = split_pair(ctx, line, &key, &value, &quoted)) != 0) break;
            if (strcmp(key, "gpus") == 0) {
                if (profile.seen & 4)
                    rc = fail(ctx, "duplicate key 'gpus'");
                else if (value)
                    rc = fail(ctx, "'gpus' takes its items on the following lines, not a value");
                profile.seen |= 4;
                in_list = 1;
            } else {
                rc = value ? set_top(ctx, key, value) : fail(ctx, "key '%s' has no value", key);
            }
        } else {
            rc = fail(ctx, "unexpected indentation");
        }
    }
    if (rc == 0 && ferror(f)) rc = fail(ctx, "read error");
    fclose(f);
    return rc == 0 ? check_complete(ctx) : rc;
}

/* ---- the exported NVML entry points -------------------------------------------------------- */

#define REQUIRE_INIT()                                                                            \
    do {                                                                                          \
        if (init_count == 0) return NVML_ERROR_UNINITIALIZED;                                     \
    } while (0)

static int valid(nvmlDevice_t device) {
    return device >= profile.gpus && device < profile.gpus + profile.count;
}

#define REQUIRE_DEVICE(device, out)                                                               \
    do {                                                                                          \
        REQUIRE_INIT();                                                                           \
        if (!valid(device) || (out) == NULL) return NVML_ERROR_INVALID_ARGUMENT;                  \
    } while (0)

static nvmlReturn_t copy_out(const char *value, char *buffer, unsigned int length) {
    if (buffer == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) >= length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buffer, value);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (init_count > 0) {
        init_count++;
        return NVML_SUCCESS;
    }
    parse_ctx ctx = {getenv("FAKE_NVML_PROFILE"), 0, ""};
    int rc;
    if (ctx.path == NULL || ctx.path[0] == '\0') {
        ctx.path = "(unset)";
        rc = fail(&ctx, "FAKE_NVML_PROFILE is not set: it names the GPU profile to serve");
    } else {
        rc = parse_profile(&ctx);
    }
    if (rc < 0) {
        memset(&profile, 0, sizeof profile);
        snprintf(last_error, sizeof last_error, "Unknown Error (fakenvml: %s)", ctx.why);
        fprintf(stderr, "fakenvml: %s\n", ctx.why);
        return NVML_ERROR_UNKNOWN;
    }
    last_error[0] = '\0';
    init_count = 1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    REQUIRE_INIT();
    init_count--;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    case NVML_ERROR_UNKNOWN: return last_error[0] ? last_error : "Unknown Error";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    REQUIRE_INIT();
    return copy_out(profile.driver, version, length);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    REQUIRE_INIT();
    if (version == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *version = profile.cuda;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    return nvmlSystemGetCudaDriverVersion(version);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    REQUIRE_INIT();
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = profile.count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    REQUIRE_INIT();
    if (device == NULL || index >= profile.count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = profile.by_index[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    REQUIRE_DEVICE(device, index);
    *index = device->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    REQUIRE_DEVICE(device, uuid);
    return copy_out(device->uuid, uuid, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    REQUIRE_DEVICE(device, name);
    return copy_out(device->name, name, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    REQUIRE_DEVICE(device, minor);
    *minor = device->minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, unsigned int *brand) {
    REQUIRE_DEVICE(device, brand);
    *brand = device->brand;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch) {
    REQUIRE_DEVICE(device, arch);
    *arch = device->arch;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    REQUIRE_DEVICE(device, memory);
    memory->total = device->memory;
    memory->free = device->memory;
    memory->used = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    REQUIRE_DEVICE(device, memory);
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = device->memory;
    memory->reserved = 0;
    memory->free = device->memory;
    memory->used = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    REQUIRE_DEVICE(device, pci);
    *pci = device->pci;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    REQUIRE_DEVICE(device, node);
    if (device->numa < 0) return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned int)device->numa;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    REQUIRE_DEVICE(device, major);
    if (minor == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *major = device->cc_major;
    *minor = device->cc_minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAddressingMode(nvmlDevice_t device, nvmlDeviceAddressingMode_t *mode) {
    REQUIRE_DEVICE(device, mode);
    if (mode->version != nvmlDeviceAddressingMode_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!(device->seen & K_ADDRESSING)) return NVML_ERROR_NOT_SUPPORTED;
    mode->value = device->addressing;
    return NVML_SUCCESS;
}
