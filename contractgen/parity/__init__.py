"""The exact-zero parity gate: rollout logprobs vs trainer logprobs, bitwise, per layout."""


def __getattr__(name: str) -> str:
    # ``ROLLOUT``: the rollout target's name, looked up in the registry when first read (not at
    # import: the active project, and so its plugins, may be chosen after). ``targets.py`` is
    # the gate's one way to its targets.
    if name == "ROLLOUT":
        from .targets import rollout_target

        return rollout_target()
    raise AttributeError(name)
