"""Voice-agent framework services over the WebSocket protocol (optional extras: pipecat, livekit)."""
