import os

# The Triton interpreter must be on before any @triton.jit function is defined.
os.environ.setdefault("TRITON_INTERPRET", "1")
