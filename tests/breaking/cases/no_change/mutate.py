"""An empty commit: nothing to report."""


def mutate(root):
    pass
