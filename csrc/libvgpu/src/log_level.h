/* The library's diagnostic levels (reference §4 LOGGER_LEVEL, vgpu-manager's hook.h): a line is
 * written when its level is at or below the level in force. */
#ifndef VGPU_LOG_LEVEL_H
#define VGPU_LOG_LEVEL_H

#define VGPU_LOG_ENV "LOGGER_LEVEL"

enum vgpu_log_level {
    VGPU_LOG_FATAL = 0,   /* the process cannot go on */
    VGPU_LOG_ERROR = 1,   /* a limit cannot be applied as asked (an allocation refused for it) */
    VGPU_LOG_WARNING = 2, /* degraded but working; the default */
    VGPU_LOG_INFO = 3,    /* each process's limits, each refused allocation */
    VGPU_LOG_VERBOSE = 4, /* each admitted allocation */
    VGPU_LOG_DETAIL = 5,  /* each core limit cycle */
};
#define VGPU_LOG_DEFAULT VGPU_LOG_WARNING

/* The level a LOGGER_LEVEL value names: a number 0..5 (above 5: detail), or a name, any case:
 * fatal, error, warning (warn), info, verbose (debug), detail. Unset or empty: the default.
 * -1 when the value is neither (pure). */
int vgpu_log_parse_level(const char *value);

/* The word a line of `level` carries after "vgpu: " ("error", ...; "FATAL" in capitals). */
const char *vgpu_log_level_name(int level);

#endif
