/* The library's stderr lines, "vgpu: <level>: <text>", filtered by LOGGER_LEVEL (the env, else the
 * container's /proc/1/environ), read once per process on the first line asked for. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

#include "env.h"
#include "log_level.h"
#include "vgpu_state.h"

static int level_in_force = VGPU_LOG_DEFAULT;
static pthread_once_t level_once = PTHREAD_ONCE_INIT;

static void read_level(void)
{
    const char *value = vgpu_env(NULL, VGPU_LOG_ENV);
    int level = vgpu_log_parse_level(value);
    if (level >= 0) {
        level_in_force = level;
        return;
    }
    fprintf(stderr,
            "vgpu: warning: %s=%s is not a level (0..5, or fatal, error, warning, info, verbose, detail); "
            "using warning\n",
            VGPU_LOG_ENV, value);
}

int vgpu_log_enabled(int level)
{
    pthread_once(&level_once, read_level);
    return level <= level_in_force;
}

void vgpu_log(int level, const char *fmt, ...)
{
    if (!vgpu_log_enabled(level))
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "vgpu: %s: %s\n", vgpu_log_level_name(level), line);
}

/* The loader's lines come formatted ("vgpu: warning: ..."); only the level decides. */
void vgpu_log_loader_line(void *ctx, int level, const char *line)
{
    (void)ctx;
    if (vgpu_log_enabled(level))
        fprintf(stderr, "%s\n", line);
}
