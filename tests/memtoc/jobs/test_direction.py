"""``memtoc direction``'s config: exactly one training split, checked by the config itself (so every door)."""

from __future__ import annotations

import pytest

from memtoc.core.values import ConfigError
from memtoc.jobs.direction import DirectionConfig

COMMON = dict(activations="acts.h5", contrast="tool_wrong:tool_right", out="d.json")


@pytest.mark.parametrize("split, given", [({}, "none"), ({"fold": "A", "all_questions": True}, "fold, all_questions"),
                                          ({"fold": "A", "split_questions": "ids.txt"}, "fold, split_questions")])
def test_a_config_without_exactly_one_split_is_refused(split, given) -> None:
    with pytest.raises(ConfigError, match=rf"exactly one of fold, split_questions, all_questions .*; got {given}$"):
        DirectionConfig(**COMMON, **split)


@pytest.mark.parametrize("split", [{"fold": "A"}, {"split_questions": "ids.txt"}, {"all_questions": True}])
def test_one_split_builds(split) -> None:
    cfg = DirectionConfig(**COMMON, **split)
    assert [n for n in split if getattr(cfg, n) == split[n]] == list(split)


def test_the_command_line_refuses_two_splits_in_one_line(capsys) -> None:
    from memtoc.cli import main

    rc = main(["direction", "--activations", "acts.h5", "--contrast", "a:b", "--out", "d.json", "--fold", "A",
               "--all-questions"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == ["memtoc direction: error: give exactly one of fold, split_questions, all_questions (the training "
                   "split); got fold, all_questions"]


def test_a_negative_control_seed_is_refused_before_the_store_is_read(tmp_path, capsys) -> None:
    """numpy's generator takes no negative seed: refused by the option's bound, not after the fit."""
    from memtoc.cli import main

    store = tmp_path / "acts.h5"
    store.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(32))
    rc = main(["direction", "--activations", str(store), "--contrast", "a:b", "--out", str(tmp_path / "d.json"),
               "--fold", "A", "--random-control", "-1"])
    assert rc == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "memtoc direction: error: --random-control -1: must be at least 0"]
