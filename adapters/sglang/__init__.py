"""contractgen.adapters.sglang"""

# The MLP blocks (``Family.layer_blocks``) the reference rollout model implements; the parity
# gate refuses a contract whose models need a block one side lacks (exit 2, one line).
MLP_BLOCKS = frozenset({"dense_mlp", "moe"})
