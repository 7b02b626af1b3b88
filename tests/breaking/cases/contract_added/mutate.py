"""A new version scaffolded with `contractgen new`, with new numerics: fine."""

from breaking_support import cli, generate, replace


def mutate(root):
    code, out, err = cli(root, "new", "--from", "qwen3_dense_true_on_policy_v2")
    assert code == 0, err
    replace(
        root,
        "contracts/qwen3_dense_true_on_policy_v3.yaml",
        "  attention_kv_chunk: 64",
        "  attention_kv_chunk: 128",
    )
    generate(root)
