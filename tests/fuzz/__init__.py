"""Fuzz targets for vgpud's untrusted-input surfaces; `make fuzz` runs them at volume."""
