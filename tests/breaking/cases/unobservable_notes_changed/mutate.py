"""Notes on fields the parity gate cannot observe: documentation of the gate, fine."""

from breaking_support import V1


def mutate(root):
    path = root / V1
    path.write_text(
        path.read_text()
        + "\nunobservable:\n"
        + "  runtime_policy.megatron.defer_ulysses_cp_loss_scaling_to_grad_sum: gradients only\n"
    )
