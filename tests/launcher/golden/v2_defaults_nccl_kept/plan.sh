# contractgen plan: qwen3_dense_true_on_policy_v2 sha256:<fingerprint> on Qwen3-0.6B
# train tp=1 pp=1 cp=1 dp=1 (world 1); rollout tp=1 dp=1 (1 GPU)
export NCCL_ALGO=Tree
export NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
export CUBLAS_WORKSPACE_CONFIG=:4096:8
# needs a newer SGLang than 0.5.23: --true-on-policy-contract (from the unmerged true-on-policy PR of sgl-project/sglang, branch sglang-miles)
# never pass --sequence-parallel (megatron): sequence parallel reduce-scatters in NCCL's order; the fixed-tree TP reduce needs it off
# real SGLang, not proven here: attention: real SGLang runs FA3 (--attention-backend fa3); nothing here compares its bits
# real SGLang, not proven here: RMSNorm and QK-norm: real SGLang runs its own norm kernels; not compared here
# real SGLang, not proven here: RoPE: real SGLang runs its own rotary kernel; not compared here
# real SGLang, not proven here: SwiGLU activation: real SGLang runs its own fused SiLU-and-mul; not compared here
# real SGLang, not proven here: row-parallel linear: SGLang's matmul_tp_persistent bits were shown equal to the contract's linear by hand on GPU, not in CI
# add: --hf-checkpoint PATH (the Hugging Face checkpoint SGLang serves (the plan's model))
# add: --ref-load PATH --load PATH --save PATH (the Megatron checkpoints: reference, resume, save)
# add: --actor-num-nodes N --actor-num-gpus-per-node N (the training GPUs (their product: world))
# add: --prompt-data PATH --input-key KEY (the prompts)
# add: --rollout-batch-size N --n-samples-per-prompt N --num-rollout N (the RL loop's sizes)
# add: the model's architecture arguments (--num-layers, --hidden-size, … as in miles' scripts)
# SGLang alone (outside miles): python -m sglang.launch_server --model-path Qwen3-0.6B --tp-size 1 --dp-size 1 --enable-deterministic-inference --attention-backend fa3 --dtype bfloat16 --true-on-policy-contract qwen3_dense_true_on_policy_v2 --no-enable-fused-qk-norm-rope
python train.py --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --context-parallel-size 1 --true-on-policy-contract qwen3_dense_true_on_policy_v2 --transformer-impl local --use-cpu-initialization --batch-invariant-mode --attention-backend flash --no-bias-swiglu-fusion --no-rope-fusion --bf16 --attention-dropout 0.0 --hidden-dropout 0.0 --make-vocab-size-divisible-by 128 --rollout-num-gpus-per-engine 1 --deterministic-mode --true-on-policy-mode --sglang-dp-size 1 --sglang-enable-deterministic-inference --sglang-attention-backend fa3 --sglang-dtype bfloat16 --sglang-true-on-policy-contract qwen3_dense_true_on_policy_v2 --no-sglang-enable-fused-qk-norm-rope
