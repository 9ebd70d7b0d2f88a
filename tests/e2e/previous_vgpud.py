"""vgpud as released before it published `nriMode`, for the rolling upgrade from such a version
(tests/clustertest/test_upgrade.py): today's daemon with the attribute left out of each device of its
ResourceSlice, the rest unchanged, which is all that release differed in on the slice.

    python -m tests.e2e.previous_vgpud run ...     (the flags and environment of `vgpud run`)
"""

from __future__ import annotations

from typing import Any

from vgpud.dra import slicebuild
from vgpud.relaxations import NRI_MODE_ATTRIBUTE

_current_attributes = slicebuild.device_attributes


def device_attributes_without_nri_mode(*args: Any, **kwargs: Any) -> dict[str, dict[str, Any]]:
    attributes = _current_attributes(*args, **kwargs)
    del attributes[NRI_MODE_ATTRIBUTE]
    return attributes


def main() -> int:
    # build_slice looks device_attributes up in its module at each call
    slicebuild.device_attributes = device_attributes_without_nri_mode
    from vgpud.cli import main as vgpud_main

    return vgpud_main()


if __name__ == "__main__":
    raise SystemExit(main())
