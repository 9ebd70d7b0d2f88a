"""NVIDIA's driver on the node: the files and device nodes a GPU container receives, found under the
driver root and the dev root as NVIDIA's container toolkit finds them (`discover`), by its rules
(`names`). vgpud.dra.driveredits turns what is found into CDI edits."""
