"""Removing a contract id (v2; nothing supersedes it) also removes its generated names."""

from breaking_support import V2, generate


def mutate(root):
    (root / V2).unlink()
    generate(root)
