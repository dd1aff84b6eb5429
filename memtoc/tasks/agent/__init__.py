"""MemToC episodes as agent tasks (paper App. G): the question's tool offered through the chat template, the
model's call validated against its schema and executed (its return = the episode's controlled payload), the
answer scored by the one scorer, under three tool-choice protocols (guided, auto, two-stage). The modules are
tabled in docs/agent.md.
"""
