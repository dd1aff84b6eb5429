"""probes: lenses on the residual stream, the memory-answer rank table, and linear probes on stored activations.

- ``probes.model``      -- ranks (``token_ranks``), fingerprints, eager attention; ``ModelParts`` re-exported.
- ``probes.lens``       -- the lenses: logit, averaged Jacobian (``JacobianLens``, primary), detached
                           self-contribution (secondary), local Jacobian-vector product (diagnostic).
- ``probes.lenses``     -- the lens registry (``--lens NAME[=FILE]``; ``docs/extending.md``).
- ``probes.fit``        -- ``memtoc lens fit``: the averaged lens's resumable estimator.
- ``probes.answer``     -- which token id is ranked: the memory answer's first token after ``FINAL: ``.
- ``probes.rank_table`` -- ``memtoc rank-table``: ranks at the final input position of the arbitration cell.
- ``probes.linear``     -- ``memtoc probe``: question-grouped cross-validated logistic probes, AUROC per site.

Sites follow ``output_hidden_states`` (as in ``activations/``). Method reference: ``docs/probes.md``.
"""
