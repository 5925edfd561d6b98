"""What the running server keeps: its state keys, metrics, tracing, encoding threads, heap."""
