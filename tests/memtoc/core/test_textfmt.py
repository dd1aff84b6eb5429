from memtoc.core.textfmt import fmt_value, markdown_table


def test_fmt_value_kinds():
    assert [fmt_value(v) for v in (None, True, False, 0.123456, 3, "x")] == ["–", "yes", "no", "0.1235", "3", "x"]


def test_markdown_table_escapes_pipes_and_keeps_column_order():
    text = markdown_table([{"b": "a|b", "a": 1.0}, {"b": None, "a": 2}], columns=["a", "b"])
    lines = text.splitlines()
    assert lines[0] == "| a | b |" and lines[1] == "|---|---|"
    assert lines[2] == "| 1 | a\\|b |" and lines[3] == "| 2 | – |"
    assert markdown_table([]) == "_(no rows)_"
