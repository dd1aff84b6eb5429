"""The toolkit's vocabulary: every closed set of names a user, a record or a CLI option can carry.

One module, imported by the benchmark, the scorer, the metrics, the prompts, the CLI options and the task
families, so a name is added (or spelled) in one place. It imports nothing: it is the bottom of the core
layer. ``tests/memtoc/core/test_vocab.py`` fails when one of these tuples is defined anywhere else.
"""

from __future__ import annotations

# --- MemToC benchmark -------------------------------------------------------------------------------------

#: Formulations of a question, in release order (``prompt_variant`` 0, 1, 2).
FORMULATIONS: tuple[str, ...] = ("reference", "paraphrase_a", "paraphrase_b")
#: The five release conditions of every question.
CONDITIONS: tuple[str, ...] = ("tool_right", "tool_wrong", "tool_error", "no_tool", "no_conflict")
#: The far arm is tool_wrong with the far distractor; it is selected like a condition.
FAR_CONDITION = "tool_wrong_far"
ALL_CONDITIONS: tuple[str, ...] = CONDITIONS + (FAR_CONDITION,)
#: The wrong-tool condition (near and far arms): its ``arb`` cell is the conflict that retention, acknowledgement,
#: the judge, directions, mining and rank tables read. Each condition is an object in memtoc.bench.conditions.
CONFLICT_CONDITION = "tool_wrong"
#: Named question sets of ``Benchmark.select``.
QUESTION_SETS: tuple[str, ...] = ("all", "analysis", "fold-A", "fold-B")
#: The 2x2 cells of (memory correct, tool correct), plus questions with no memory answer.
CELLS: tuple[str, ...] = ("agree", "arb", "tool_gold", "both_wrong", "mem_absent")
#: Scored outcomes of a tool-pass response.
OUTCOMES: tuple[str, ...] = ("both", "followed_tool", "kept_memory", "neither")
#: The behaviours the interpretability side contrasts (rank tables group every other outcome as "other").
BEHAVIOURS: tuple[str, ...] = ("followed_tool", "kept_memory", "other")

# --- prompts ----------------------------------------------------------------------------------------------

#: How the tool output is framed in the with-tool prompt.
FRAMES: tuple[str, ...] = ("tool", "tool-no-schema", "passage")
#: ``--frame`` choices: ``auto`` = ``tool`` when the benchmark carries tool schemas, else ``tool-no-schema``.
FRAME_CHOICES: tuple[str, ...] = ("auto",) + FRAMES
#: Prompt interventions (a sentence inserted before the FINAL instruction; ``none`` inserts nothing).
INTERVENTIONS: tuple[str, ...] = ("none", "warn", "source-priority", "abstain-and-flag")
#: Prompt ablations (a sentence removed from the with-tool template: the paper's one-sentence protocol ablation).
ABLATIONS: tuple[str, ...] = ("no-protocol-sentence",)
#: ``--prompt-intervention`` choices: a prompt arm inserts a sentence (interventions) or removes one (ablations).
PROMPT_ARMS: tuple[str, ...] = INTERVENTIONS + ABLATIONS
#: Closed-book prompts that define a question's memory (``forced`` = the paper's primary).
CLOSED_BOOK_MODES: tuple[str, ...] = ("forced", "permissive")
#: ``--protocol``: ``paper`` sets what the MemToC paper fixes (memtoc.bench.protocol); ``none`` sets nothing.
EVAL_PROTOCOLS: tuple[str, ...] = ("none", "paper")

# --- runtimes ---------------------------------------------------------------------------------------------

#: (``--backend`` names are not vocabulary: each backend kind registers its own, in memtoc.core.backend_kinds.)
#: ``--chat-template``: auto = the template when the tokenizer has one; off = raw completion (base models).
CHAT_TEMPLATE_MODES: tuple[str, ...] = ("auto", "on", "off")

# --- the corrupted code-executor family -------------------------------------------------------------------

#: Its conditions: no tool, the true tool return (P0), the overreliance paper's corruption mix (P1 / P2: the
#: output's sign reversed on about half the problems, seeded) and the four fixed-sign corruptions (P1/P2 with
#: the sign kept, +, or reversed, -).
CODEEXEC_SIGNED_CONDITIONS: tuple[str, ...] = ("P1+", "P1-", "P2+", "P2-")
CODEEXEC_MIXED_CONDITIONS: tuple[str, ...] = ("P1", "P2")
CODEEXEC_CONDITIONS: tuple[str, ...] = ("no_tool", "P0", *CODEEXEC_MIXED_CONDITIONS, *CODEEXEC_SIGNED_CONDITIONS)
CODEEXEC_TOOL_CONDITIONS: tuple[str, ...] = CODEEXEC_CONDITIONS[1:]
CODEEXEC_CORRUPTED_CONDITIONS: tuple[str, ...] = (*CODEEXEC_MIXED_CONDITIONS, *CODEEXEC_SIGNED_CONDITIONS)
#: System-prompt policies, in the order reports list them (the family's counterpart of prompt interventions).
CODEEXEC_POLICIES: tuple[str, ...] = ("Plain", "Compare", "Verify", "Disclose")
#: Problem splits; ``all`` selects both.
CODEEXEC_SPLITS: tuple[str, ...] = ("dev", "heldout")
CODEEXEC_SPLIT_CHOICES: tuple[str, ...] = ("heldout", "dev", "all")
#: Tool-call formats: native chat-template tools or fenced python blocks (``auto`` detects).
CODEEXEC_PROTOCOLS: tuple[str, ...] = ("auto", "native", "text")
#: Who makes the first tool call of a tool condition.
CODEEXEC_FIRST_CALLS: tuple[str, ...] = ("model", "scripted")

#: Agent tasks' tool-choice protocols (MemToC App. G: a1 guided, a2 auto, a4 two-stage; memtoc.tasks.agent).
AGENT_PROTOCOLS = ("guided", "auto", "two-stage")
#: Code-executor trajectory outcomes after the first tool return, in report order (memtoc.tasks.codeexec.trajectories).
TRAJECTORY_OUTCOMES = ("accepted", "adopted", "rejected", "no_answer", "ambiguous")
#: Transfer-set frames (App. F.1: the counterfactual as a direct value or inside a passage; memtoc.bench.transfer).
TRANSFER_FRAMES = ("value", "passage")

#: where an activation capture reads the prompt (activations.positions), and ``generated``: the answer's tokens
PROMPT_KINDS: tuple[str, ...] = ("last_input", "tool_span", "from_tool_return", "all")
POSITION_KINDS: tuple[str, ...] = PROMPT_KINDS + ("generated",)
