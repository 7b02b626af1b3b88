"""A contract of a new line (not a new version): its generated names are new public names."""

from breaking_support import V2, generate


def mutate(root):
    text = (root / V2).read_text()
    text = text.replace("id: qwen3_dense_true_on_policy_v2", "id: qwen3_dense_fp32_logprobs_v1")
    text = text.replace("supersedes: qwen3_dense_true_on_policy_v1", "supersedes: null")
    (root / "contracts/qwen3_dense_fp32_logprobs_v1.yaml").write_text(text)
    generate(root)
