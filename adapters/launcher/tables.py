"""The one table per target mapping a typed policy field to an argument or environment variable.

A row names its source as ``<namespace>.<field>``; the namespaces are the resolved policies and
contract data of one launch (see ``plan.sources``):

``launcher`` / ``sglang`` / ``megatron``  the generated runtime policies of the three targets,
``identity``  the contract's ``TrueOnPolicyContractSchema``, ``kernel``  its ``KernelPolicy``,
``layout``  the validated parallel sizes, ``model``  the chosen checkpoint's ``ModelDims``,
``trainer``  what every contract's trainer runs whatever the contract (no dropout).

The row kinds (``Flag``, ``Option``, ``Choice``, ``Env``, ``EngineSide``, ``Forbid``) are in
``rows.py``. Every field of the three runtime-policy dataclasses appears in some row or in
``NOT_LAUNCH_RELEVANT`` (a test enforces it).
"""

from __future__ import annotations

from collections.abc import Mapping

from .rows import VALUE, Choice, EngineSide, Env, Flag, Forbid, Option, Row

CONTRACT_FLAG = "--true-on-policy-contract"

# What the SGLang server must be told (`python -m sglang.launch_server ...`).
SGLANG_SERVER = (
    Option("model.name", "--model-path", "the checkpoint: point it at your local copy"),
    Option("layout.rollout_tp", "--tp-size", "rollout tensor parallelism (one engine's GPUs)"),
    Option("layout.rollout_dp", "--dp-size", "rollout data-parallel replicas of the engine"),
    Flag(
        "launcher.enable_deterministic_inference",
        "--enable-deterministic-inference",
        "batch-invariant kernels: a token's logprob must not depend on its batch",
    ),
    Option(
        "identity.sglang_attention_backend",
        "--attention-backend",
        "the attention kernel family both engines' numerics are pinned to",
    ),
    Option(
        "sglang.force_bfloat16_dense_tensor_math",
        "--dtype",
        "weights and activations of every dense matmul in the contract's dense math dtype",
        value_from="kernel.dense_math_dtype",
    ),
    Option(
        "sglang.contract_name",
        CONTRACT_FLAG,
        "turns on the contract's kernel policy inside the server (the rows marked engine-side)",
    ),
    Flag(
        "sglang.disable_fused_qk_norm_mrope",
        "--no-enable-fused-qk-norm-rope",
        "QK-norm and RoPE as separate kernels with the policy's roundings between them",
    ),
    Flag(
        "sglang.disable_flashinfer_allreduce_fusion",
        "--enforce-disable-flashinfer-allreduce-fusion",
        "keep the TP all-reduce separate from the residual add and norm (TP>1)",
    ),
    Forbid(
        "sglang.disable_flashinfer_allreduce_fusion",
        "--enable-flashinfer-allreduce-fusion",
        "fuses the TP all-reduce with residual add and norm: one rounding instead of the policy's",
    ),
    EngineSide("sglang.enabled", "the contract flag activates the policy on the server"),
    EngineSide(
        "sglang.force_bfloat16_lm_head", "LM head in the contract's lm_head_input_dtype (bf16)"
    ),
    EngineSide(
        "sglang.disable_reduce_scatter", "no reduce-scatter on the scored path (NCCL's order)"
    ),
    EngineSide(
        "sglang.disable_mlp_allreduce_fusion",
        "MLP all-reduce kept apart from the residual add (one rounding each)",
    ),
    EngineSide(
        "sglang.tp_invariant_row_linear",
        "row-parallel linears follow the contract's K-tile order, so TP=N equals TP=1",
    ),
    EngineSide(
        "sglang.deterministic_tree_all_reduce",
        "TP partials summed by the fixed-order tree, never by NCCL",
    ),
)

# What Megatron (through miles' train.py, which parses Megatron's arguments) must be told.
MEGATRON = (
    Option(
        "layout.tp",
        "--tensor-model-parallel-size",
        "training tensor parallelism",
        config=(("tensor_model_parallel_size", VALUE),),
    ),
    Option(
        "layout.pp",
        "--pipeline-model-parallel-size",
        "training pipeline parallelism (whole layers per stage)",
        config=(("pipeline_model_parallel_size", VALUE),),
    ),
    Option(
        "layout.cp",
        "--context-parallel-size",
        "training context parallelism",
        config=(("context_parallel_size", VALUE),),
    ),
    Option(
        "layout.ep",
        "--expert-model-parallel-size",
        "experts split over this many trainer ranks (EP > 1 only); the contract's dispatcher "
        "(the Megatron fork's) returns each output to its token's rank and combines there as "
        "kernel_policy.moe_ep_combine says",
        config=(("expert_model_parallel_size", VALUE),),
    ),
    Option(
        "layout.expert_tp",
        "--expert-tensor-parallel-size",
        "under EP each rank holds whole experts (expert TP 1): what the parity gate runs",
        config=(("expert_tensor_parallel_size", VALUE),),
    ),
    Option(
        "megatron.cp_layout",
        "--cp-comm-type",
        "Ulysses all-to-all: CP moves heads and adds no arithmetic (ring CP cannot be exact)",
        choices={"ulysses_a2a": "a2a"},
        config=(("cp_comm_type", "a2a"),),
    ),
    Forbid(
        "identity.disable_megatron_sequence_parallel",
        "--sequence-parallel",
        "sequence parallel reduce-scatters in NCCL's order; the fixed-tree TP reduce needs it off",
    ),
    Option(
        "megatron.contract_name",
        CONTRACT_FLAG,
        "the Megatron fork builds the SGLang-numerics layers (the rows marked engine-side)",
        config=(("true_on_policy_contract", VALUE),),
        fork_only=True,
    ),
    Option(
        "launcher.transformer_impl",
        "--transformer-impl",
        "the contract's layers replace megatron-core's local modules (not Transformer Engine)",
        config=(("transformer_impl", VALUE),),
    ),
    Flag(
        "launcher.use_cpu_initialization",
        "--use-cpu-initialization",
        "weights initialised on CPU: identical across TP layouts",
        config=(("use_cpu_initialization", True),),
    ),
    Flag(
        "launcher.batch_invariant_mode",
        "--batch-invariant-mode",
        "batch-invariant ATen kernels in megatron-core",
        config=(("batch_invariant_mode", True),),
    ),
    Flag(
        "megatron.batch_invariant_mode",
        "--batch-invariant-mode",
        "the Megatron policy reads it from the config: the same flag",
        config=(("batch_invariant_mode", True),),
    ),
    Choice(
        "megatron.attention_backend",
        {"fa3_varlen": ("--attention-backend", "flash")},
        "megatron-core's batch-invariant mode requires the flash backend; the fork swaps in the "
        "SGLang fa3-varlen attention under the contract",
        config={"fa3_varlen": (("attention_backend", "flash"),)},
    ),
    Flag(
        "launcher.no_bias_swiglu_fusion",
        "--no-bias-swiglu-fusion",
        "SwiGLU by the policy kernel, not the fused bias-SwiGLU",
        config=(("bias_activation_fusion", False),),
    ),
    Flag(
        "megatron.disable_bias_swiglu_fusion",
        "--no-bias-swiglu-fusion",
        "the Megatron policy's side of the same switch",
        config=(("bias_activation_fusion", False),),
    ),
    Flag(
        "launcher.no_rope_fusion",
        "--no-rope-fusion",
        "RoPE by the policy kernel in the contract's rope dtype, not the fused kernel",
        config=(("apply_rope_fusion", False),),
    ),
    Flag(
        "megatron.disable_rope_fusion",
        "--no-rope-fusion",
        "the Megatron policy's side of the same switch",
        config=(("apply_rope_fusion", False),),
    ),
    Choice(
        "kernel.dense_math_dtype",
        {"bfloat16": ("--bf16",), "float16": ("--fp16",), "float32": ()},
        "parameters and activations in the contract's dense math dtype",
        config={
            "bfloat16": (
                ("bf16", True),
                ("params_dtype", "bfloat16"),
                ("pipeline_dtype", "bfloat16"),
            ),
            "float16": (("fp16", True), ("params_dtype", "float16"), ("pipeline_dtype", "float16")),
            "float32": (),
        },
    ),
    Option(
        "trainer.attention_dropout",
        "--attention-dropout",
        "no dropout on the attention probabilities: megatron-core defaults to 0.1, which makes "
        "the trainer's forward random and off-policy (the parity gate scores without dropout)",
        config=(("attention_dropout", VALUE),),
    ),
    Option(
        "trainer.hidden_dropout",
        "--hidden-dropout",
        "no dropout after attention, MLP and embedding: megatron-core defaults to 0.1",
        config=(("hidden_dropout", VALUE),),
    ),
    Option(
        "kernel.logsoftmax_vocab_block",
        "--make-vocab-size-divisible-by",
        "vocab padded to a multiple of chunk x TP: each rank holds whole log-softmax chunks",
    ),
    EngineSide("megatron.enabled", "the contract flag activates the policy in the trainer"),
    EngineSide("megatron.use_sglang_backend", "layers built from the SGLang spec provider"),
    EngineSide(
        "megatron.cast_attention_input_to_dense_math_dtype",
        "hidden states rounded to the dense math dtype before the QKV projection",
    ),
    EngineSide(
        "megatron.cast_qk_norm_input_before_weight_mul",
        "QK-norm rounds to the input dtype before the weight multiply",
    ),
    EngineSide(
        "megatron.cast_qk_after_rope_to_dense_math_dtype",
        "q and k rounded to the dense math dtype after RoPE",
    ),
    EngineSide(
        "megatron.cast_lm_head_input_to_weight_dtype",
        "final hidden state cast to the LM-head weight dtype",
    ),
    EngineSide(
        "megatron.deterministic_row_parallel_reduce",
        "row-parallel TP reduce by the fixed-order tree (needs sequence parallel off)",
    ),
    EngineSide(
        "megatron.defer_ulysses_cp_loss_scaling_to_grad_sum",
        "Ulysses CP loss scale cp/dp_cp applied at the gradient sum",
    ),
    EngineSide("megatron.apply_logits_contract", "padded vocab logits trimmed to the real vocab"),
    EngineSide("megatron.use_sglang_final_norm", "SGLang's final norm"),
    EngineSide(
        "megatron.use_sglang_residual_pair",
        "(output, residual) carried separately, as SGLang's layer communicator does",
    ),
    EngineSide(
        "megatron.use_ulysses_cp_recompute_fallback",
        "recompute path for Ulysses CP (on exactly when cp_layout is ulysses_a2a)",
    ),
)

# miles' own arguments on the same train.py command line.
MILES = (
    Option(
        "layout.rollout_tp",
        "--rollout-num-gpus-per-engine",
        "GPUs per SGLang engine: the rollout TP",
    ),
    Flag(
        "launcher.deterministic_mode",
        "--deterministic-mode",
        "deterministic algorithms everywhere (also Megatron's deterministic_mode)",
        config=(("deterministic_mode", True),),
    ),
    Flag(
        "launcher.true_on_policy_mode",
        "--true-on-policy-mode",
        "train on the rollout's own logprobs as on-policy",
    ),
    Flag(
        "launcher.recompute_logprobs_via_prefill",
        "--recompute-logprobs-via-prefill",
        "the contract's logprobs are SGLang's prefill re-score of the finished rollout",
    ),
)

# The environment of every rank, rollout and trainer.
ENV = (
    Env(
        "launcher.nccl_algo",
        "NCCL_ALGO",
        "pins NCCL's algorithm for the collectives left on NCCL (kept if already set)",
        keep_existing=True,
    ),
    Env(
        "launcher.nvte_allow_nondeterministic_algo",
        "NVTE_ALLOW_NONDETERMINISTIC_ALGO",
        "forbids Transformer Engine's non-deterministic kernels",
        choices={False: "0", True: "1"},
    ),
    Env(
        "launcher.cublas_workspace_config",
        "CUBLAS_WORKSPACE_CONFIG",
        "a fixed cuBLAS workspace: deterministic cuBLAS reductions",
    ),
)

TABLES: Mapping[str, tuple[Row, ...]] = {
    "env": ENV,
    "sglang": SGLANG_SERVER,
    "megatron": MEGATRON,
    "miles": MILES,
}

# Runtime-policy fields that change nothing at launch, with the reason.
NOT_LAUNCH_RELEVANT: Mapping[str, str] = {
    "launcher.contract_name": "the plan's contract itself; rendered through sglang./megatron.contract_name",
    "launcher.enabled": "gates the plan: a contract that disables the launcher is refused",
}

# Where a real SGLang rollout leaves the numerics contractgen proves (the parity gate runs this
# project's implementation of SGLang's numerics on both sides, not SGLang's own CUDA kernels).
REAL_SGLANG_UNPROVEN: tuple[tuple[str, str], ...] = (
    ("attention", "real SGLang runs FA3 (--attention-backend fa3); nothing here compares its bits"),
    ("RMSNorm and QK-norm", "real SGLang runs its own norm kernels; not compared here"),
    ("RoPE", "real SGLang runs its own rotary kernel; not compared here"),
    ("SwiGLU activation", "real SGLang runs its own fused SiLU-and-mul; not compared here"),
    (
        "row-parallel linear",
        "SGLang's matmul_tp_persistent bits were shown equal to the "
        "contract's linear by hand on GPU, not in CI",
    ),
)

# SGLang flags that released SGLang does not know yet, with where they come from. The sglang-args
# test proves each entry against the real release's parser, and that nothing else is missing.
SGLANG_RELEASE = "0.5.23"
UNRELEASED_SGLANG_FLAGS: Mapping[str, str] = {
    CONTRACT_FLAG: "the unmerged true-on-policy PR of sgl-project/sglang, branch sglang-miles",
}

# The two command lines.
ROLLOUT_COMMAND = ("python", "-m", "sglang.launch_server")
TRAINER_COMMAND = ("python", "train.py")
