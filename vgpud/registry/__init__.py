"""The registry: the in-container library's register call, answered with the container's pids.config.

`server` (the gRPC service and the supervised `RegistryServer`), `publish` (the socket's lifecycle),
`resolve` (target resolution and the caller check, from the watch-fed caches), `identity`
(SO_PEERCRED, /proc, cgroups) and `cgroup` (pure parsing of cgroup paths and pod status).
"""
