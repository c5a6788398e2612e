"""GGUF export for llama.cpp: the positions of a patched model as an architecture llama.cpp computes, or a
refusal by name (`targets`); the tokenizer as its converter writes it (`vocab`); the file (`export`)."""
