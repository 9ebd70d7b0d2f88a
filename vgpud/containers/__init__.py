"""The node's containers: one record per container instance the runtime reported through NRI
(`record.NodeContainer`: identity, pod, process, cgroup, device rules, vGPU claim, directory and
injection state) and one store of them with the indexes its readers need (`store.ContainerStore`).

The NRI hooks write the store; the registry, the hot-plug, the drift self-check, the usage reader and
the debug state read it. A leaf package: it imports nothing else of vgpud, so every one of them can.
"""
