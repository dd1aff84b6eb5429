"""``memtoc study``: the paper's statistics over a base run and several arms, for one or several models.

- :mod:`memtoc.jobs.study.runs` reads the runs and pairs every arm with the base run of the same model.
- :mod:`memtoc.jobs.study.families` declares the Holm families (a registry: ``arm``, ``model``, ``model×arm``,
  ``none``, or a family the user writes).
- :mod:`memtoc.jobs.study.analysis` computes the tables: paired changes, the asymmetric criterion per formulation and
  pooled (Table 5), near-vs-far contrasts, the control arms against their references, cross-model
  two-proportion z tests and the stability rule.
- :mod:`memtoc.jobs.study.output` writes them as Markdown, CSV and JSON.

The reading of the paper behind each table is in ``docs/statistics.md``.
"""

from __future__ import annotations

from memtoc.jobs.study.analysis import Study, StudySettings, run_study
from memtoc.jobs.study.families import FAMILY_BUILDERS, resolve_families
from memtoc.jobs.study.runs import Contrast, StudyRun, load_run, pair_contrasts

__all__ = ["Contrast", "FAMILY_BUILDERS", "Study", "StudyRun", "StudySettings", "load_run", "pair_contrasts",
           "resolve_families", "run_study"]
