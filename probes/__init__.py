"""probes: lenses on the residual stream, the memory-answer rank table, and linear probes on stored activations.

- ``probes.model``      -- ranks, fingerprints, eager attention; ``ModelParts`` and site hooks re-exported from
                           the core (``memtoc.backends.parts`` / ``.hooks``)
                           (``token_ranks``: ``1 + #{real-vocabulary tokens with a strictly larger logit}``),
                           the model fingerprint a lens is tied to.
- ``probes.lens``       -- the lenses: logit (identity), averaged Jacobian (``JacobianLens``, primary), detached
                           self-contribution (frozen norm scales / attention pattern / MLP gates; exact; secondary),
                           local Jacobian-vector product (diagnostic, suffers from RMSNorm scale invariance).
- ``probes.lenses``     -- the lens registry (``--lens NAME[=FILE]``): one module per lens wrapping ``probes.lens``;
                           a new lens is one module plus one import line (``docs/extending.md``).
- ``probes.fit``        -- ``memtoc lens fit``: the batched-cotangent future-sum estimator of the averaged lens,
                           resumable, tied to the model fingerprint and the corpus hash.
- ``probes.answer``     -- which token id is ranked: the memory answer's first token after ``FINAL: ``.
- ``probes.rank_table`` -- ``memtoc rank-table``: ranks at the final input position of the arbitration cell, per
                           behaviour, with the other-questions control and the answer-in-prompt split.
- ``probes.linear``     -- ``memtoc probe``: standardized logistic regression (C=0.05), question-grouped 5-fold
                           cross-validation, AUROC per site with a cluster-bootstrap interval, per-site plot.

Sites follow ``output_hidden_states`` (as in ``activations/``): 0 = embedding output, ``s`` = output of block
``s - 1``; the last site ``L`` is the raw (pre-final-norm) output of the last block. Method reference:
``docs/probes.md``.
"""
