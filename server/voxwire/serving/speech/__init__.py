"""What both transports speak through: the speech service and its contracts, saved voices,
personas, voice design, word timings, loading the model."""
