"""The FINAL answer line's grammar: the marker and the quote characters that make a marker a mention.

Three parts of the toolkit read the same line: the prompts ask for it, every backend cuts its output right after
it (``memtoc.backends.base.final_line_end``, so hf and vLLM return the same string), and the scorer extracts the
answer span from it (``memtoc.scoring.extract``). The pattern lives here, below all three, so none of them
imports another for it.
"""

from __future__ import annotations

import re

__all__ = ["FINAL_MARKER_RE", "QUOTE_CHARS"]

#: `final`, optional whitespace, `:`, then any whitespace (newlines included) which is consumed. No word boundary
#: before `final` on purpose: the release scorer counts `Semifinal: X` as a marker too.
FINAL_MARKER_RE = re.compile(r"final\s*:\s*", re.IGNORECASE)

#: A marker right after one of these is quoted: the model is *mentioning* the instruction ("...starts with
#: 'FINAL: '..."), typically a base model running on into the prompt text.
QUOTE_CHARS = "'\"\u2019\u2018\u201c\u201d`"
