"""The only modules that name a dependency's private internals: one per library.

Each is pinned with an upper bound in pyproject.toml, and tests/unit/compat has a test per internal
that fails when it moves or changes the shape relied on here.
"""
