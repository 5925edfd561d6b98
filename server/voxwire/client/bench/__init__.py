"""``voxwire bench``: load and latency measurement of a voxwire server over its WebSocket protocol.

``texts`` holds the built-in text set, ``measure`` what one utterance's arrivals say (time to first audio,
real-time factor, chunk gaps, a simulated player's underruns), ``runner`` the closed- and open-loop load
generators and the search for the highest concurrency within an SLO, ``report`` the table, JSON and plot,
and ``local`` a throwaway local server.
"""
