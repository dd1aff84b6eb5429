"""``memtoc report``: one self-contained HTML page and a Markdown twin for a run or an experiment directory.

``memtoc.jobs.report.build`` collects the directory into sections (tables, plots, links, each with the file its
numbers come from); ``html`` and ``markdown`` render them; ``plots`` draws the figures.
"""
