"""`python -m vgpud` is the `vgpud` command."""

from vgpud.cli import main

raise SystemExit(main())
