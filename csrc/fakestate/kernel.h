/*
 * The fake kernel's socket protocol: csrc/fakekernel serves it, csrc/fakestate/driver.c speaks it
 * for the fakes in kernel mode. The socket is <driver root>/run/nvidia-persistenced/socket, where
 * the NVIDIA container toolkit mounts the persistence daemon's socket into containers.
 *
 * A fake library connects once per process (SOCK_STREAM) and keeps the connection open for the
 * life of the process: it is the process's "open device file".
 *
 *   library -> kernel   fk_hello {"FGKH", FK_VERSION}
 *   kernel -> library   fk_reply {"FGKR", the kernel's FK_VERSION, host pid}
 *                       + SCM_RIGHTS [profile fd, state fd] when the versions match;
 *                       host pid 0 and no fds when they do not, and the kernel closes.
 *
 * The host pid is the connecting process's, from SO_PEERCRED, as the kernel's PID namespace (the
 * host's) numbers it. Each fd sent is an open file description of the connection's own: the
 * profile is read from offset 0, and OFD locks on the state exclude between processes. Anything
 * else a library sends (a wrong magic, bytes after the hello) makes the kernel close the
 * connection. Integers are in host byte order: both ends run on one machine.
 */
#ifndef FAKESTATE_KERNEL_H
#define FAKESTATE_KERNEL_H

#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

#define FK_SOCKET "/run/nvidia-persistenced/socket" /* under the driver root */
#define FK_VERSION 1u
#define FK_HELLO_MAGIC "FGKH"
#define FK_REPLY_MAGIC "FGKR"
#define FK_FDS 2 /* profile, state */

typedef struct {
    char magic[4];
    uint32_t version;
} fk_hello;

typedef struct {
    char magic[4];
    uint32_t version;
    int32_t host_pid;
} fk_reply;

_Static_assert(sizeof(fk_hello) == 8, "fk_hello is 8 bytes on the wire");
_Static_assert(sizeof(fk_reply) == 12, "fk_reply is 12 bytes on the wire");

/* A sockaddr_un for `path`. One longer than sun_path (a deep test directory) goes through
 * /proc/self/fd/<dir>/<name>, its directory opened O_PATH in *dirfd, to close after the bind or
 * connect; *dirfd is -1 otherwise. 0, or -1 with errno set. */
int fk_address(const char *path, struct sockaddr_un *addr, int *dirfd);

#endif
