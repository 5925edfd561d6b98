"""Python clients of a voxwire server (``voxwire say``, ``voxwire bench``).

Everything under this package talks to a server over its WebSocket protocol and must never import torch
(or anything that does): a client runs on machines without the model. The wire format comes from
``voxwire.protocol.wire`` (stdlib only), never re-implemented here.
"""
