"""The simulated model behind ``voxwire serve --model sim``: a load-testing stand-in for a GPU.

Like llm-d's inference simulator, it runs the whole real server (scheduler, engine thread, serving,
encoders) over a runner that does no math: each step sleeps for a modelled time and every session
hears a looped speech clip, so hundreds of realistic streams can be served without a GPU.
"""
