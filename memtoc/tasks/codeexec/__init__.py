"""Second MemToC benchmark family: corrupted returns of a code executor.

The question is the one MemToC asks about knowledge tools -- does a model follow a wrong tool return or its
own knowledge? -- asked in an agent loop where the tool is ``python_executor`` and its stdout has been
corrupted. Its modules (problems, conditions, sandbox, agent, grader, metrics, ...) are described in
docs/codeexec.md; each name is imported from its module.
"""
