"""Custom GPU kernels (Triton) and their plain-torch oracles.

Nothing here imports Triton at package import time: the Triton modules (``paged_decode``, ``fused``)
are imported only where a CUDA tensor is about to use them (``ops``) or by the interpreter tests, so
the CPU path of the model stays plain torch and needs no Triton install.
"""
