"""Kernel tests run Triton's interpreter on the CPU. Triton 3.6 reads TRITON_INTERPRET when a
kernel is decorated with @triton.jit (`triton.knobs.runtime.interpret`), so it must be set before
any `kernels.*` module is imported; setdefault lets a GPU run override it with TRITON_INTERPRET=0."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
