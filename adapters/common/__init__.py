"""contractgen.adapters.common: the floor every target builds from (``roles.py`` says what each
role provides).

No target is named here: a target folder (``adapters/<target>/``) imports this floor,
``kernels/`` and ``families/``, never another target. This package file imports nothing.
"""
