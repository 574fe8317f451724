"""Models: the llama.cpp backend (the only llama_cpp importer), the registry, fetching, GGUF preflight and chat
templates."""
