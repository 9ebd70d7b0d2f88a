"""The Go NRI conformance harness (Go modules here) and its Python glue (gobuild)."""
