"""The judged layer and conflict acknowledgment (scoring.md "Judged channel", paper §4.2, §5.4, App. B/D).

The judge never decides a label: it *extracts* an asserted answer (or says whether a reply acknowledges a
conflict), and the one deterministic matcher decides. Modules, lower to upper:

- ``prompts``     the release's judge prompts, loaded from versioned data (``memtoc/data/judge_prompts.json``)
- ``requests``    which episodes get which judge request (extract / closed-book extract / ack)
- ``rules``       parsing judge replies and the release's rules that turn them into the judged layer
- ``store``       ``judge.jsonl``: append + fsync per batch, torn-line tolerant reads, judge identity checks
- ``run``         ``memtoc judge``: run the requests through a toolkit backend, resumable
- ``layer``       deterministic or judged records of a run, for metrics / compare
- ``ack``         regex detector, CAR by arm and cell, blinded annotation export / import, Cohen's kappa
- ``prevalence``  the two-stage (screen + human validation) prevalence estimator
- ``cli``         the subcommands
"""
