"""Hot-plug of a slave pod's vGPU into a running container for device-mounter (issue 18)."""
