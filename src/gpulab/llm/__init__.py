"""LLM inference: model resolution, the study's run, llama-bench-style figures, hf and fast engines."""
