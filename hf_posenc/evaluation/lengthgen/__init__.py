"""Length generalisation on algorithmic tasks, as Kazemnejad et al. (NeurIPS 2023, arXiv 2305.19466) set it up:
decoder-only models trained on short instances, scored by exact match on longer ones.

    tasks     the generators (repeat one symbol, copy, reverse, sort): seeded, any lengths, one registry entry each
    vocab     the task's small word-level tokenizer (a `PreTrainedTokenizerFast`) and the check that a tokenizer
              spells the symbols
    scoring   exact match by length with n and 95% intervals, from predictions or from a causal LM
    ranking   mean reciprocal rank over task splits, and the paper's numbers as data

`tasks` and `ranking` are torch-free; `hf-posenc eval --suite lengthgen:copy` scores any causal LM
(`evaluation/suites/lengthgen.py`), `benchmarks/lengthgen/` trains the tiny decoders of the study.
"""
