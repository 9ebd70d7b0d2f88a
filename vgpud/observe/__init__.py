"""Observability: metrics, the debug HTTP endpoint with its hook stream, the drift self-check.

These modules only read the components (and the leaf `vgpud.recorder`); no component imports them.
"""
