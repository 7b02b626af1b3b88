"""contractgen.adapters"""
