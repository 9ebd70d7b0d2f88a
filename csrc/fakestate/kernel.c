/* The fake kernel's socket protocol: see kernel.h. */
#include "kernel.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int fk_address(const char *path, struct sockaddr_un *addr, int *dirfd) {
    memset(addr, 0, sizeof *addr);
    addr->sun_family = AF_UNIX;
    *dirfd = -1;
    if (strlen(path) < sizeof addr->sun_path) {
        strcpy(addr->sun_path, path);
        return 0;
    }
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (slash == NULL || slash == path || (size_t)(slash - path) >= sizeof dir) {
        errno = ENAMETOOLONG;
        return -1;
    }
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int n = snprintf(addr->sun_path, sizeof addr->sun_path, "/proc/self/fd/%d/%s", fd, slash + 1);
    if (n < 0 || (size_t)n >= sizeof addr->sun_path) {
        close(fd);
        errno = ENAMETOOLONG;
        return -1;
    }
    *dirfd = fd;
    return 0;
}
