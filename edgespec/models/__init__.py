"""Models: the llama.cpp layer (backend.py with devices, readout, batch and llama_init: the only llama_cpp
importers), the registry, fetching, discovery, GGUF preflight and chat templates."""
