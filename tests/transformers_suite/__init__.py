"""transformers' own model tests (Llama, GPT-2, BERT, T5) run stock and on hf-posenc-patched models (issue 37):
the plugin that patches, the tree and its runs, the plan of cells, the junit comparison."""
