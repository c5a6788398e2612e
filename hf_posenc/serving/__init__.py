"""Serving patched folders with inference engines (vLLM), which dispatch on `architectures` and never run
remote code: `positions` decides what an engine must compute for a folder (or refuses it by name),
`vllm_plugin` registers the architectures patched folders name, `vllm_models` builds them from vLLM's layers.
Nothing here is imported by the rest of the package."""
