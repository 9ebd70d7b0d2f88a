"""The DRA kubelet plugin: registration, node service, checkpoint, CDI specs and ResourceSlices."""
