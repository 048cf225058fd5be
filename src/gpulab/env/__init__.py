"""The environment capture: versions, tools and the runtime stack a run's figures came from."""
