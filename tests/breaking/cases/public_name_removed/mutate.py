"""A template change dropped a public name: the base's committed runtime_policy.py had one more
name than render() gives now (as if an older generator had produced it)."""

from breaking_support import generate

SGLANG_POLICY = "generated/sglang/python/sglang/srt/true_on_policy/runtime_policy.py"


def base(root):
    with open(root / SGLANG_POLICY, "a") as f:
        f.write("\n\ndef legacy_policy_names() -> tuple[str, ...]:\n    return ()\n")


def mutate(root):
    generate(root)
