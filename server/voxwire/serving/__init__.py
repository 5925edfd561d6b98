"""The aiohttp service: WebSocket streaming, HTTP API, voices, limits, auth and metrics."""
