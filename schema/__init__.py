"""contractgen.schema"""
