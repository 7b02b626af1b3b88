"""One module per CLI verb; each exposes ``command`` (a click command)."""
