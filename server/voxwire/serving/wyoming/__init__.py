"""Home Assistant's Wyoming protocol (``voxwire serve --wyoming-port P``): a TCP listener beside the HTTP one.

``protocol``: the event codec and one connection's rules, sans I/O (the time is passed in). ``listener``: the asyncio
TCP server that reads events into the core, speaks through the same ``Speaker`` as the HTTP routes, and writes the
audio; ``add_wyoming_listener`` ties its start and stop to the app's lifecycle.
"""
