"""The judged layer and conflict acknowledgment (scoring.md "Judged channel", paper §4.2, §5.4, App. B/D).

The judge never decides a label: it *extracts* an asserted answer (or says whether a reply acknowledges a
conflict), and the one deterministic matcher decides. The library is here (prompts, requests, rules, the
``judge.jsonl`` store, the judged layer, acknowledgment, prevalence); the runner that calls a backend over a run
is the job ``memtoc.jobs.judge`` (docs/judge.md).
"""
