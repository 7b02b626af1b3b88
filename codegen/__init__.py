"""contractgen.codegen"""
