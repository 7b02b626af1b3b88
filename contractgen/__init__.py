"""contractgen: one source of truth for true-on-policy RL contracts across three repositories."""

__version__ = "0.1.0"
