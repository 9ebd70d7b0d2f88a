/* LOGGER_LEVEL values (log_level.h). Pure, so the C tests link it without the library. */
#include <stdlib.h>
#include <strings.h>

#include "log_level.h"

static const struct {
    const char *name;
    int level;
} names[] = {
    {"fatal", VGPU_LOG_FATAL}, {"error", VGPU_LOG_ERROR},     {"warning", VGPU_LOG_WARNING},
    {"warn", VGPU_LOG_WARNING}, {"info", VGPU_LOG_INFO},       {"verbose", VGPU_LOG_VERBOSE},
    {"debug", VGPU_LOG_VERBOSE}, {"detail", VGPU_LOG_DETAIL},
};

int vgpu_log_parse_level(const char *value)
{
    if (value == NULL || *value == '\0')
        return VGPU_LOG_DEFAULT;
    if (*value >= '0' && *value <= '9') {
        char *end;
        unsigned long n = strtoul(value, &end, 10);
        if (*end != '\0')
            return -1;
        return n > VGPU_LOG_DETAIL ? VGPU_LOG_DETAIL : (int)n;
    }
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcasecmp(value, names[i].name) == 0)
            return names[i].level;
    return -1;
}

const char *vgpu_log_level_name(int level)
{
    static const char *const words[] = {"FATAL", "error", "warning", "info", "verbose", "detail"};
    return level >= VGPU_LOG_FATAL && level <= VGPU_LOG_DETAIL ? words[level] : "?";
}
