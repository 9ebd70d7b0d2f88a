/* The GPU profile parser shared by the fakes: see profile.h. Not thread-safe (callers parse once). */
#include "profile.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LINE_MAX_BYTES 511

static fake_profile *profile; /* the one being filled by fake_profile_load */

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
static const name_value mig_modes[] = {{"disabled", 0}, {"enabled", 1}, {NULL, 0}};

#define ARCH_AMPERE 7
#define ARCH_HOPPER 9
#define ARCH_BLACKWELL 10

/* NVIDIA's MIG profiles of the A100-SXM4-40GB and the H100 80GB (see profile.h). */
static const fake_mig_profile mig_profiles[] = {
    {"1g.5gb", ARCH_AMPERE, 1, 4864, 14, 0},   {"2g.10gb", ARCH_AMPERE, 2, 9984, 28, 1},
    {"3g.20gb", ARCH_AMPERE, 3, 20096, 42, 2}, {"4g.20gb", ARCH_AMPERE, 4, 20096, 56, 2},
    {"7g.40gb", ARCH_AMPERE, 7, 40448, 98, 5}, {"1g.10gb", ARCH_HOPPER, 1, 9984, 16, 1},
    {"2g.20gb", ARCH_HOPPER, 2, 20096, 32, 2}, {"3g.40gb", ARCH_HOPPER, 3, 40448, 60, 3},
    {"4g.40gb", ARCH_HOPPER, 4, 40448, 64, 4}, {"7g.80gb", ARCH_HOPPER, 7, 81152, 132, 7},
    {NULL, 0, 0, 0, 0, 0},
};
/* The words of a product name that make a GPU of a MIG architecture MIG-capable. */
static const char *const mig_products[] = {"A100", "A30", "H100", "H200", "B200", NULL};
#define MIG_CAPABLE "MIG needs an Ampere, Hopper or Blackwell A100, A30, H100, H200 or B200"

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
        if (profile->seen & 1) return fail(ctx, "duplicate key '%s'", key);
        profile->seen |= 1;
        return copy_string(ctx, key, v, profile->driver, sizeof profile->driver);
    }
    if (strcmp(key, "cudaDriverVersion") == 0) {
        if (profile->seen & 2) return fail(ctx, "duplicate key '%s'", key);
        profile->seen |= 2;
        if (parse_version(ctx, key, v, &major, &minor) < 0) return -1;
        profile->cuda = major * 1000 + minor * 10;
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
                {"computeCapability", K_CC}, {"addressingMode", K_ADDRESSING}, {"migMode", K_MIG_MODE},
                {"migModePending", K_MIG_PENDING}, {"migDevices", K_MIG_DEVICES}, {NULL, 0}};

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
        if (parse_int(ctx, key, v, quoted, FAKE_MAX_GPUS - 1, &n) < 0) return -1;
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
    case K_MIG_MODE:
        g->mig_mode_line = ctx->line;
        return parse_name(ctx, key, v, mig_modes, &g->mig_mode);
    case K_MIG_PENDING:
        g->mig_pending_line = ctx->line;
        return parse_name(ctx, key, v, mig_modes, &g->mig_pending);
    case K_MIG_DEVICES:
        g->mig_devices_line = ctx->line;
        return copy_string(ctx, key, v, g->mig_devices, sizeof g->mig_devices);
    default: /* K_CC */
        return parse_version(ctx, key, v, &g->cc_major, &g->cc_minor);
    }
}

/* The MIG profile `name` on a GPU of architecture `arch` (Blackwell offers Hopper's), or NULL. */
static const fake_mig_profile *mig_profile(const char *name, unsigned int arch) {
    unsigned int family = arch == ARCH_BLACKWELL ? ARCH_HOPPER : arch;
    for (const fake_mig_profile *m = mig_profiles; m->name; m++)
        if (m->arch == family && strcmp(m->name, name) == 0) return m;
    return NULL;
}

/* "1g.5gb, 2g.10gb, ..." for a message: the profiles a GPU of `arch` offers. */
static void known_mig_profiles(unsigned int arch, char *out, size_t size) {
    unsigned int family = arch == ARCH_BLACKWELL ? ARCH_HOPPER : arch;
    size_t used = 0;
    out[0] = '\0';
    for (const fake_mig_profile *m = mig_profiles; m->name; m++)
        if (m->arch == family && used < size)
            used += (size_t)snprintf(out + used, size - used, "%s%s", used ? ", " : "", m->name);
}

/* Split migDevices into the GPU's MIG devices, refusing what the GPU cannot hold (see profile.h). */
static int parse_mig_devices(parse_ctx *ctx, fake_gpu *g, unsigned int i) {
    char names[FAKE_MIG_DEVICES_MAX], known[120];
    unsigned int slices = 0;
    ctx->line = g->mig_devices_line;
    if (!g->mig_mode) return fail(ctx, "gpus[%u].migDevices: MIG devices need migMode: enabled", i);
    strcpy(names, g->mig_devices);
    char *save = NULL;
    for (char *name = strtok_r(names, " ", &save); name; name = strtok_r(NULL, " ", &save)) {
        const fake_mig_profile *m = mig_profile(name, g->arch);
        if (m == NULL) {
            known_mig_profiles(g->arch, known, sizeof known);
            return fail(ctx, "gpus[%u].migDevices: unknown MIG profile '%.20s' for this GPU (known: %s)", i, name,
                        known);
        }
        if (slices + m->slices <= FAKE_MIG_SLICES) g->mig[g->mig_count++] = m;
        slices += m->slices;
    }
    if (slices > FAKE_MIG_SLICES)
        return fail(ctx, "gpus[%u].migDevices: the MIG devices take %u slices, more than the GPU's %d", i, slices,
                    FAKE_MIG_SLICES);
    return 0;
}

static int check_mig(parse_ctx *ctx, fake_gpu *g, unsigned int i) {
    if ((g->mig_mode || g->mig_pending) && !fake_gpu_mig_capable(g)) {
        ctx->line = g->mig_mode ? g->mig_mode_line : g->mig_pending_line;
        return fail(ctx, "gpus[%u].%s: this GPU has no MIG mode (" MIG_CAPABLE ")", i,
                    g->mig_mode ? "migMode" : "migModePending");
    }
    if (!(g->seen & K_MIG_PENDING)) g->mig_pending = g->mig_mode;
    return (g->seen & K_MIG_DEVICES) ? parse_mig_devices(ctx, g, i) : 0;
}

static int check_complete(parse_ctx *ctx) {
    ctx->line = 0;
    if (!(profile->seen & 1)) return fail(ctx, "missing required key 'driverVersion'");
    if (!(profile->seen & 2)) return fail(ctx, "missing required key 'cudaDriverVersion'");
    if (!(profile->seen & 4)) return fail(ctx, "missing the 'gpus' list");
    if (profile->count == 0) return fail(ctx, "'gpus' lists no GPUs");
    for (unsigned int i = 0; i < profile->count; i++) {
        fake_gpu *g = &profile->gpus[i];
        ctx->line = g->line;
        for (int k = 0; gpu_keys[k].key; k++)
            if ((gpu_keys[k].bit & K_REQUIRED) && !(g->seen & gpu_keys[k].bit))
                return fail(ctx, "gpus[%u]: missing required key '%s'", i, gpu_keys[k].key);
        if (check_mig(ctx, g, i) < 0) return -1;
        ctx->line = g->index_line;
        if (g->index >= profile->count)
            return fail(ctx, "gpus[%u].index: %u is out of range 0..%u", i, g->index, profile->count - 1);
        if (profile->by_index[g->index]) return fail(ctx, "gpus[%u].index: %u is used twice", i, g->index);
        profile->by_index[g->index] = g;
    }
    return 0;
}

static int parse_profile(parse_ctx *ctx, FILE *f) {
    memset(profile, 0, sizeof *profile);
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
            } else if (profile->count == FAKE_MAX_GPUS) {
                rc = fail(ctx, "more than %d GPUs", FAKE_MAX_GPUS);
            } else {
                fake_gpu *g = &profile->gpus[profile->count++];
                g->line = ctx->line;
                g->numa = -1;
                if ((rc = split_pair(ctx, line + 4, &key, &value, &quoted)) == 0)
                    rc = value ? set_gpu(ctx, g, key, value, quoted) : fail(ctx, "key '%s' has no value", key);
            }
        } else if (strncmp(line, "    ", 4) == 0 && line[4] != ' ') {
            if (!in_list || profile->count == 0) {
                rc = fail(ctx, "indented line that continues no list item");
            } else if ((rc = split_pair(ctx, line + 4, &key, &value, &quoted)) == 0) {
                fake_gpu *g = &profile->gpus[profile->count - 1];
                rc = value ? set_gpu(ctx, g, key, value, quoted) : fail(ctx, "key '%s' has no value", key);
            }
        } else if (line[0] != ' ') {
            in_list = 0;
            if ((rc = split_pair(ctx, line, &key, &value, &quoted)) != 0) break;
            if (strcmp(key, "gpus") == 0) {
                if (profile->seen & 4)
                    rc = fail(ctx, "duplicate key 'gpus'");
                else if (value)
                    rc = fail(ctx, "'gpus' takes its items on the following lines, not a value");
                profile->seen |= 4;
                in_list = 1;
            } else {
                rc = value ? set_top(ctx, key, value) : fail(ctx, "key '%s' has no value", key);
            }
        } else {
            rc = fail(ctx, "unexpected indentation");
        }
    }
    if (rc == 0 && ferror(f)) rc = fail(ctx, "read error");
    return rc == 0 ? check_complete(ctx) : rc;
}

/* Parse the open `f` (NULL: it could not be opened, errno says why) named `name`; closes f. */
static int load(FILE *f, const char *name, fake_profile *out, char *why, size_t why_size) {
    parse_ctx ctx = {name, 0, ""};
    profile = out;
    int rc = f ? parse_profile(&ctx, f) : fail(&ctx, "cannot be opened: %s", strerror(errno));
    profile = NULL;
    if (f) fclose(f);
    if (rc < 0) {
        memset(out, 0, sizeof *out);
        snprintf(why, why_size, "%s", ctx.why);
    }
    return rc;
}

int fake_profile_load(const char *path, fake_profile *out, char *why, size_t why_size) {
    return load(fopen(path, "r"), path, out, why, why_size);
}

int fake_profile_load_fd(int fd, const char *name, fake_profile *out, char *why, size_t why_size) {
    FILE *f = fdopen(fd, "r");
    if (f == NULL) {
        int err = errno;
        close(fd);
        errno = err;
    }
    return load(f, name, out, why, why_size);
}

static int pci_less(const fake_gpu *a, const fake_gpu *b) {
    if (a->pci.domain != b->pci.domain) return a->pci.domain < b->pci.domain;
    if (a->pci.bus != b->pci.bus) return a->pci.bus < b->pci.bus;
    return a->pci.device < b->pci.device;
}

void fake_profile_pci_order(const fake_profile *p, const fake_gpu **out) {
    for (unsigned int i = 0; i < p->count; i++) out[i] = p->by_index[i];
    for (unsigned int i = 1; i < p->count; i++) /* insertion sort: a handful of GPUs */
        for (unsigned int j = i; j > 0 && pci_less(out[j], out[j - 1]); j--) {
            const fake_gpu *t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
}

unsigned int fake_gpu_sm_count(const fake_gpu *g) {
    if (g->cc_major == 8 && g->cc_minor == 0) return 108;
    if (g->cc_major == 9 && g->cc_minor == 0) return 132;
    if (g->cc_major == 10 && g->cc_minor == 0) return 148;
    return 80;
}

unsigned int fake_gpu_threads_per_sm(const fake_gpu *g) {
    if (g->cc_major == 7 && g->cc_minor == 5) return 1024;
    if ((g->cc_major == 8 && g->cc_minor >= 6) || g->cc_major == 12) return 1536;
    return 2048;
}

int fake_gpu_mig_capable(const fake_gpu *g) {
    if (g->arch != ARCH_AMPERE && g->arch != ARCH_HOPPER && g->arch != ARCH_BLACKWELL) return 0;
    const char *p = g->name;
    while (*p) {
        size_t len = strcspn(p, " -");
        for (int k = 0; mig_products[k]; k++)
            if (len == strlen(mig_products[k]) && strncmp(p, mig_products[k], len) == 0) return 1;
        p += len;
        p += strspn(p, " -");
    }
    return 0;
}

unsigned int fake_mig_gpu_instance_id(unsigned int slot) { return slot + 1; }

unsigned int fake_mig_compute_instance_id(unsigned int slot) {
    (void)slot;
    return 0;
}

void fake_mig_uuid(const fake_gpu *g, unsigned int slot, char *out, size_t size) {
    const char *body = strncmp(g->uuid, "GPU-", 4) == 0 ? g->uuid + 4 : g->uuid;
    snprintf(out, size, "MIG-%s", body);
    if (strlen(body) >= 18 && size > 22) {
        char ids[5];
        snprintf(ids, sizeof ids, "%02x%02x", fake_mig_gpu_instance_id(slot) & 0xFFu,
                 fake_mig_compute_instance_id(slot) & 0xFFu);
        memcpy(out + 4 + 14, ids, 4);
    }
}
