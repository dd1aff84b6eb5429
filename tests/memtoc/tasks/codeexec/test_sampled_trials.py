"""Sampled repetitions in the agent loop: every model turn carries its own seed, derived from the sample seed,
the trial key (repetition included) and the turn index; greedy runs carry none and keep their identity."""

from __future__ import annotations

from memtoc.backends.base import Generation
from memtoc.core.runtime import row_seed
from memtoc.tasks.codeexec.agent import AgentConfig, TrialSpec, run_trials
from memtoc.tasks.codeexec.run import select_problems


class SeedRecorder:
    """Renders messages as text and records each call's GenerationConfig."""

    protocol = "text"

    def __init__(self) -> None:
        self.configs = []

    def format_messages(self, messages, *, tools):
        return "\n".join(m["content"] for m in messages)

    def generate_formatted(self, texts, config, *, edit=None):
        self.configs.append(config)
        return [Generation(text="FINAL ANSWER: 1", n_prompt_tokens=1, n_new_tokens=1, stop_reason="eos")
                for _ in texts]

    def provenance(self):
        return {"model": "rec"}


def test_each_turn_is_seeded_by_trial_and_turn():
    p = select_problems(0, "dev", 1)[0]
    specs = [TrialSpec(problem=p, condition="P1", repetition=r) for r in range(3)]
    backend = SeedRecorder()
    cfg = AgentConfig(temperature=0.7, sample_seed=5, first_call="scripted")
    run_trials(backend, specs, cfg)
    (call,) = backend.configs
    assert call.temperature == 0.7
    assert call.row_seeds == tuple(row_seed(5, s.key, 1) for s in specs)   # turn 1: after the scripted call
    assert len(set(call.row_seeds)) == 3
    assert cfg.to_dict()["temperature"] == 0.7 and cfg.to_dict()["sample_seed"] == 5
    greedy = SeedRecorder()
    run_trials(greedy, specs, AgentConfig(first_call="scripted"))
    assert greedy.configs[0].row_seeds is None and not greedy.configs[0].sampling
    assert "temperature" not in AgentConfig().to_dict()          # greedy run identities are unchanged
