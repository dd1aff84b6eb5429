"""Answer-span extraction: scoring.md section 1, every rule, plus the release's gotchas."""

from __future__ import annotations

import pytest

from memtoc.scoring import extract_span

# scoring.md section 1 example table, verbatim.
SPEC_EXAMPLES = [
    ("Reasoning...\nFINAL: Ann Wigmore", "Ann Wigmore"),
    ("FINAL:\n\n  Paris\nMore text", "Paris"),
    ("I think X.\nFINAL: <answer>", "I think X."),
    ("FINAL: Rome\nQuestion: ... starts with 'FINAL: ' and then your answer.", "Rome"),
    ("Ann Wigmore was born\nAnn Wigmore was born in\nAnn Wigmore", "Ann Wigmore was born in"),
    ("Paris", "Paris"),
]


@pytest.mark.parametrize(("text", "expected"), SPEC_EXAMPLES)
def test_spec_examples(text: str, expected: str) -> None:
    assert extract_span(text) == expected


@pytest.mark.parametrize("text", [None, "", "   ", "\n\n\t \n", "\r\n \r\n"])
def test_empty_input_gives_empty_span(text: str | None) -> None:
    assert extract_span(text) == ""


@pytest.mark.parametrize(("text", "expected"), [
    # marker syntax: any case, optional whitespace before the colon, whitespace after consumed
    ("final: paris", "paris"),
    ("Final:Paris", "Paris"),
    ("FINAL : Paris", "Paris"),
    ("FINAL\t:\tParis", "Paris"),
    ("The answer, final: Paris, I think.", "Paris, I think."),
    # the span is the first non-empty line after the marker; later lines are ignored
    ("FINAL: Paris\nFrance\nmore", "Paris"),
    ("FINAL:\r\nParis\r\n", "Paris"),
    ("FINAL:   \n   \n Paris \n", "Paris"),
    # no non-empty line after the marker -> empty span (even if text precedes the marker)
    ("I believe Paris.\nFINAL:", ""),
    ("FINAL:   \n  \n", ""),
])
def test_marker_rules(text: str, expected: str) -> None:
    assert extract_span(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("FINAL: Moor Park\nWait, the tool is stale.\nFINAL: Stanley Park", "Stanley Park"),
    ("FINAL: A\nFINAL: B\nFINAL: C", "C"),
    # the last marker wins even when nothing follows it
    ("FINAL: Paris\nFINAL:", ""),
    ("final: a final: b", "b"),
])
def test_last_of_multiple_markers_wins(text: str, expected: str) -> None:
    assert extract_span(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    # no word boundary before `final`: `Semifinal:` is a marker (release gotcha)
    ("They lost the Semifinal: Lyon", "Lyon"),
    ("FINAL: Paris (semifinal: no)", "no)"),
    ("FINAL: Paris\nQuarterfinal: Rome", "Rome"),
    # `Finally:` and `FINALS:` are not markers (letters between `final` and `:`): last line wins
    ("Finally: Paris", "Finally: Paris"),
    ("FINALS: Paris", "FINALS: Paris"),
])
def test_semifinal_marker_gotcha(text: str, expected: str) -> None:
    assert extract_span(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    # the marker is `final` + optional whitespace + `:`; the markdown around it stays in the span
    ("**FINAL:** Paris", "** Paris"),
    ("FINAL: **Paris**", "**Paris**"),
    # `**FINAL**: Paris` has no marker at all (`**` between `FINAL` and `:`), so the line is the span
    ("Some reasoning.\n**FINAL**: Paris", "**FINAL**: Paris"),
    # the span is not otherwise cleaned
    ("FINAL: Paris.", "Paris."),
    ('FINAL: "Paris"', '"Paris"'),
])
def test_markdown_and_punctuation_stay_in_span(text: str, expected: str) -> None:
    assert extract_span(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    # a quoted marker is a mention: dropped while an unquoted one exists
    ("FINAL: Rome\nEnd your reply with one line that starts with 'FINAL: ' followed by your answer.", "Rome"),
    ('FINAL: Rome\nwrite "FINAL: X"', "Rome"),
    ("FINAL: Rome\nwrite \u2018FINAL: X\u2019", "Rome"),
    ("FINAL: Rome\nwrite \u201cFINAL: X\u201d", "Rome"),
    ("FINAL: Rome\nwrite `FINAL: X`", "Rome"),
    ("FINAL: Rome\nwrite \u2019FINAL: X", "Rome"),
    # quoted marker first, real one later
    ("The prompt says 'FINAL: ' then the answer.\nFINAL: Oslo", "Oslo"),
    # every occurrence quoted -> all kept, the last one is used
    ("Remember to write 'FINAL: ' then Paris", "' then Paris"),
    ("\u201cFINAL: Paris\u201d", "Paris\u201d"),
    # a marker at the very start of the text is never quoted
    ("FINAL: Rome\n'FINAL: x'", "Rome"),
    # only the immediately preceding character counts: a space after the quote makes it a use
    ("FINAL: Rome\n' FINAL: Oslo", "Oslo"),
])
def test_quoted_marker_rule(text: str, expected: str) -> None:
    assert extract_span(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("FINAL: <answer> Paris", "Paris"),
    ("FINAL: <answer>Rome", "Rome"),
    ("FINAL: <ANSWER>  Rome  ", "Rome"),
    # bare placeholder: the last non-empty line before the (last used) marker
    ("Line one\n\n  Paris is the capital.  \n\nFINAL: <answer>\nLater text", "Paris is the capital."),
    ("Paris FINAL: <answer>", "Paris"),  # text on the marker's own line counts
    ("FINAL: <answer>", ""),  # nothing before it
    ("   \nFINAL: <Answer>", ""),
    # the marker used is the last unquoted one, quoted mentions after it are ignored
    ("I think Oslo.\nFINAL: <answer>\nQuestion: ... starts with 'FINAL: ' and then your answer.", "I think Oslo."),
    # the placeholder must start the span
    ("FINAL: my <answer> is Paris", "my <answer> is Paris"),
])
def test_placeholder_echo(text: str, expected: str) -> None:
    assert extract_span(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Line one\n\nLast line  \n\n", "Last line"),
    ("  Paris  ", "Paris"),
    # repetition loop cut by the token limit: the stump is a proper prefix of an earlier line
    ("Paris is\nParis is the capital\nParis", "Paris is the capital"),
    ("Ann Wigmore was born\nSomething else\nAnn", "Ann Wigmore was born"),
    # an equal earlier line is not a proper prefix
    ("abc\nabc", "abc"),
    # prefix test is on stripped lines and case-sensitive
    ("Paris is nice\nparis", "paris"),
    # the last line is longer than the earlier ones: no repair
    ("Paris\nParis is nice", "Paris is nice"),
])
def test_no_marker_fallback_and_loop_repair(text: str, expected: str) -> None:
    assert extract_span(text) == expected


def test_loop_repair_not_applied_when_marker_present() -> None:
    assert extract_span("Paris is lovely\nFINAL: Paris") == "Paris"
