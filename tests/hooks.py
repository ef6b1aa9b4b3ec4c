"""A match-check hook for the CLI tests (``--match-check tests.hooks:refuse_all``)."""


def refuse_all(question, entry, score):
    return False
