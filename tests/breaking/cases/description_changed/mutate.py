"""A description edit: documentation only, fine."""

from breaking_support import V1, replace


def mutate(root):
    replace(root, V1, "of each finished rollout.", "of each finished rollout (see DESIGN.md).")
