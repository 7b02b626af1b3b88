"""contractgen.adapters.sglang"""
