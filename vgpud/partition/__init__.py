"""Partition assignment: which containers share one directory and one registration identity.

Pure code (no I/O, no Trio) shared by the DRA plugin, the NRI plugin, the registry and the webhook:

- `model`    claim and pod views parsed from resource.k8s.io/v1 and core/v1 dicts
- `eager`    DRA-only mode: connected components, partition keys, register UUIDs (seed §5)
- `lazy`     NRI mode: one directory per (claim, pod, container) (seed §12.2-§12.3)
- `assigner` the `PartitionAssigner` interface both modes implement, and its result types
- `layout`   every host path, container path and env name
- `edits`    per-device env (limits) keyed by host NVML index, from quantities (the client library's parser)
- `libfiles` the byte layouts of the library's vgpu.config, vmem_node.config and sm_node.config

`pidsfile` (the in-place pids.config reset) and `libstate` (clearing and reading the library's files in
a partition directory) are the modules here that touch the filesystem. This package imports none of
them eagerly, so importing one algorithm module pulls in no I/O code.
"""
