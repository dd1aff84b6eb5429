"""Abstention detection: scoring.md section 3, both families, every listed pattern."""

from __future__ import annotations

import pytest

from memtoc.scoring import ABSTAIN_RULES, is_abstain, matching_rules

# scoring.md section 3 examples, verbatim.
SPEC_EXAMPLES = [
    ("UNKNOWN", True),
    ("I'm sorry, but I don't have information on that.", True),
    ("Paris. More information is needed to be certain.", False),
    ("Paris (not sure)", True),
    ("The answer is not known.", True),
    ("Question: Who ...", True),
]


@pytest.mark.parametrize(("text", "expected"), SPEC_EXAMPLES)
def test_spec_examples(text: str, expected: bool) -> None:
    assert is_abstain(text) is expected


# One or more texts per rule; the rule named must be among those that fire.
RULE_EXAMPLES: dict[str, list[str]] = {
    "unknown": ["UNKNOWN", "The answer is unknown.", "Unknown Pleasures"],
    "do_not_know": ["I don't know", "I dont know", "I do not know", "She does not know", "He doesn't know",
                    "I donot know"],
    "cannot_say": ["I cannot answer that", "I can't determine it", "I cant say", "We cannot provide it",
                   "I can't tell"],
    "no_information": ["There is no information", "No answer", "no idea, sorry"],
    "not_available": ["The data is not available", "I'm not sure", "Paris (not sure)"],
    "unavailable": ["Data unavailable"],
    "rerun_the_tool": ["Please re-run the tool.", "You should rerun the tool"],
    "unable_to": ["I am unable to help"],
    "n_a": ["N/A", "n/a.", "na", "NA", "Na Li"],
    "cannot_be_found": ["The date cannot be determined", "It can not be verified", "It could not be found",
                        "cannot be retrieved", "could not be identified", "can not be established"],
    "does_not_provide": ["The tool does not provide it", "The output did not mention a name",
                         "It does not specify", "it does not identify", "did not contain", "does not allow",
                         "does not state", "did not answer", "does not include"],
    "not_provided": ["not provided", "not specified", "not mentioned", "The name was not found",
                     "not determined", "The answer is not known.", "It is not possible to determine"],
    "insufficient_info": ["insufficient information", "Insufficient data"],
    "info_insufficient": ["The information is insufficient", "the data is insufficient"],
    "insufficient_to": ["That is insufficient to answer", "insufficient to determine"],
    "not_enough_info": ["I do not have enough information", "The tool does not have enough information"],
    "not_relevant": ["The tool output is not relevant to the question"],
    "no_exact_match": ["No exact match was returned"],
    "need_more_info": ["Need more information", "  I need more information to answer."],
    "more_info_needed": ["More information is needed.", "\n more information is required"],
    "encountered_error": ["I encountered an error with the database", "Unfortunately, I ran into an issue.",
                          "Unfortunately I encountered a problem", "i ran into a issue"],
    "could_not_find": ["I couldn't find any information about X", "I could not find any information",
                       "Unfortunately, I cannot find any information", "I cant find any information",
                       "I was unable to find any information"],
    "sorry_no_info": ["I'm sorry, but I don't have information on that.",
                      "I'm sorry, but I don't have access to real-time information about the current CEO of X.",
                      "Im sorry I do not have that information",
                      "I'm sorry, I don't have specific information\nabout that"],
    "echoed_question": ["Question: Who wrote it?", "Q: who", "q :", "  question:"],
}


def test_every_rule_has_examples_and_names_are_unique() -> None:
    names = [rule.name for rule in ABSTAIN_RULES]
    assert len(names) == len(set(names))
    assert set(RULE_EXAMPLES) == set(names)


def test_family_b_rules_are_start_anchored() -> None:
    assert {rule.anchor for rule in ABSTAIN_RULES if rule.family == "B"} == {"start"}
    start_a = {rule.name for rule in ABSTAIN_RULES if rule.family == "A" and rule.anchor == "start"}
    assert start_a == {"need_more_info", "more_info_needed"}


@pytest.mark.parametrize(("rule", "text"), [(r, t) for r, texts in RULE_EXAMPLES.items() for t in texts])
def test_rule_fires(rule: str, text: str) -> None:
    assert rule in matching_rules(text)
    assert is_abstain(text) is True


@pytest.mark.parametrize("text", [
    # start-only forms after an answer are hedges, not refusals
    "Paris. I need more information to be sure",
    "Paris; more information is needed",
    "Paris. I encountered an error earlier but the answer stands",
    "Paris. I could not find any information to contradict it",
    "The answer is Paris. I'm sorry, I don't have information on more.",
    "Answer: Paris\nQuestion: next one",
    "FAQ: Paris",
])
def test_start_only_forms_do_not_fire_later(text: str) -> None:
    assert is_abstain(text) is False


@pytest.mark.parametrize("text", [
    None,
    "",
    "Paris",
    "stale",  # a bare "stale" is deliberately not a refusal
    "The cache may be stale; the answer is Paris",
    "unknownness",  # word-bounded
    "Known for jazz",
    "Notable",
    "nothing",
    "Sure, it is Paris",
    "Anna",
    "Banana",
    "DNA",
    "Nadal",
    "I cannot",
    "I'm sorry. I don't have information",  # the sentence ends before the second half
    # curly apostrophes do not fit the `I'm sorry ... I don't have` opener (release behaviour)
    "I\u2019m sorry, but I don\u2019t have information on that.",
    "The tool does not work",
    "unable",
])
def test_non_abstentions(text: str | None) -> None:
    assert matching_rules(text) == []
    assert is_abstain(text) is False


@pytest.mark.parametrize(("text", "expected"), [
    # long polite refusals
    ("I'm sorry, but I don't have access to real-time information about the current president of the "
     "company, as my knowledge was last updated in 2023", True),
    ("I'm sorry, but as of my last update I don't have any information about that person", True),
    ("Unfortunately, I couldn't find any information about the Salisbury Woodland Gardens.", True),
    ("The tool returned an error (upstream database temporarily unavailable), so I cannot say.", True),
    # an abstaining hedge next to an answer still abstains (anywhere rules)
    ("Not sure, maybe Paris", True),
    ("Paris, although the date is unknown", True),
    # gotcha: the word "Na" in a name
    ("Na Li", True),
    ("Li Na", True),
])
def test_mixed_cases(text: str, expected: bool) -> None:
    assert is_abstain(text) is expected
