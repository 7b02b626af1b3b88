"""Runtime switches: a constant and a layout condition turned into a constant."""

from breaking_support import V1, replace


def mutate(root):
    replace(root, V1, "nccl_algo: Ring", "nccl_algo: Tree")
    replace(
        root,
        V1,
        "disable_flashinfer_allreduce_fusion: {when: rollout_tp}",
        "disable_flashinfer_allreduce_fusion: true",
    )
