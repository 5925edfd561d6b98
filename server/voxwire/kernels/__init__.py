"""Custom GPU kernels (Triton) and their plain-torch oracles.

Nothing here imports Triton at package import time: the Triton modules (``paged_decode``, ``fused``,
``small_attention``, ``noise``) are imported only where a CUDA device is about to use them (``path`` probes
them once per device, then ``ops`` and decode attention follow its choice) or by the interpreter tests, so
the CPU path of the model stays plain torch and needs no Triton install. ``grids`` holds the kernels' launch
grids, which ``scripts/count_step_cost.py`` counts without Triton.
"""
