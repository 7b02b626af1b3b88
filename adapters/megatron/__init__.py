"""contractgen.adapters.megatron"""
