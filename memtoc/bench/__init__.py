"""Core: the benchmark as data: questions, episodes, prompts (data files), controls, the paper protocols, the
transfer set, offline rescoring and the tool-chat formatting."""
