"""Python clients of a voxstream server (``voxstream say``, ``voxstream bench``).

Everything under this package talks to a server over its WebSocket protocol and must never import torch
(or anything that does): a client runs on machines without the model. The wire format comes from
``voxstream.serving.protocol`` (stdlib only), never re-implemented here.
"""
