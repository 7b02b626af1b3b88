"""contractgen.adapters.launcher"""
