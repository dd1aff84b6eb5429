"""Cross-fitted LoRA fine-tuning arms (SFT and DPO) judged through the one evaluator.

Layout (each module small and importable without peft unless it trains or applies an adapter):

- :mod:`memtoc.jobs.finetune.data`     preference pairs and SFT examples built from the benchmark's own prompts
- :mod:`memtoc.jobs.finetune.tokens`   tokenization with completion-only labels (left padded, like evaluation)
- :mod:`memtoc.jobs.finetune.folds`    cross-fitting splits by chain, with the zero-overlap check
- :mod:`memtoc.jobs.finetune.losses`   sequence log-probs, masked cross-entropy, the DPO loss
- :mod:`memtoc.jobs.finetune.lora`     LoRA settings and generic target-module discovery
- :mod:`memtoc.jobs.finetune.train`    the resumable training loop (SFT and DPO in one loop)
- :mod:`memtoc.core.adapter`  adapter hashing, metadata and application to a loaded model
- :mod:`memtoc.jobs.finetune.compare`  merging held-out halves and paired comparison on cell-agreeing units
- :mod:`memtoc.jobs.finetune.table`    the side-by-side table (prompting, SFT, DPO, steering vs base)
- :mod:`memtoc.jobs.finetune.crossfit` the fold pair end to end
- :mod:`memtoc.jobs.finetune.jobs`   the ``finetune data|train|table`` jobs and the shared training options

Nothing here is imported by ``memtoc`` itself except lazily (``evaluate --adapter``), so the core toolkit
keeps working without peft installed.
"""
