"""A Python function prompt read apart (its code, its docstring's prose and examples), and one problem
restated in another's names. The template restates a renamed code entry with it; the word guards read a
code problem's key terms from it."""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass

__all__ = ["COMMON_WORDS", "PythonPrompt", "python_prompt", "renamed_like"]

#: Words too common to be a name: a parameter called ``a`` or ``in`` keeps its word in prose, and the word
#: guards drop these from a problem's terms.
COMMON_WORDS: frozenset[str] = frozenset(
    """a an the of to in on at by for from with and or is are was were be been being it its it's this that
    these those there here what what's whats which who whom whose how many much does do did done can could
    would should will shall may might must i you we they he she him her his their them me my your our us
    if then than so as into onto up out about through between inclusive each every all any some one one's
    please quick question answer help need tell me compute calculate find determine evaluate work solve convert
    give gives return returns get gets got show value result number numbers exactly just now
    again also only use using let suppose assume when where while after before course quickly kindly simply briefly
    have has had having take takes took taking working works worked long make makes made happen happens
    occur occurs place equal equals come comes become becomes""".split()
) | frozenset(
    # Discourse: how people ask, hedge and point at the problem's form, in no particular domain. None of these
    # names an operation, a quantity or a condition; negations, comparatives, quantifiers and position words
    # ("not", "more", "few", "last", "over") are deliberately absent: each of those can change a problem.
    """know like want wonder curious tell say said ask need mind care see check confirm think guess reckon
    write written wrote express expressed represent represented look try put together overall
    hi hello hey thanks thank okay ok sure actually really basically precisely therefore thus hence
    equation expression formula calculation problem task exercise puzzle figure quantity procedure process
    sequence method way i'd i'm i've i'll you'd you're we're let's that's""".split()
)


@dataclass(frozen=True)
class PythonPrompt:
    """A function prompt read apart: its code, its docstring's prose and its docstring's examples."""

    code: str
    """The source without the docstring, the function named ``func`` and its parameters ``param_a``, ..."""
    prose: str
    examples: frozenset[str]


#: Clauses of a docstring that show an example rather than describe the task.
_EXAMPLE = re.compile(r"->|=>|==|>>>")
_CLAUSE = re.compile(r"(?<=[.;])\s+|\n+")


def python_prompt(text: str) -> PythonPrompt | None:
    """``text`` read as one Python function (imports allowed before it) with a docstring, else ``None``."""
    source = textwrap.dedent(text).strip("\n")
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    others = [node for node in tree.body if not isinstance(node, (ast.FunctionDef, ast.Import, ast.ImportFrom))]
    if len(functions) != 1 or others or (docstring := ast.get_docstring(functions[0])) is None:
        return None
    function = functions[0]
    params = _names(function)[1:]
    names = {function.name: "func"} | {name: f"param_{chr(ord('a') + i)}" for i, name in enumerate(params[:26])}
    function.body = function.body[1:] or [ast.Pass()]
    code = ast.unparse(_Rename(names).visit(tree))
    prose: list[str] = []
    examples: set[str] = set()
    for clause in (c.strip() for c in _CLAUSE.split(docstring)):
        shown = _EXAMPLE.search(clause)
        if shown is None:
            prose.append(clause)
            continue
        lead, colon, example = clause[: shown.start()].rpartition(": ")
        if colon:  # "Differences of neighbours: [1, 4, 9] -> [3, 5]"
            prose.append(lead)
            clause = example + clause[shown.start() :]
        examples.add("".join(_rename_words(clause, names).split()).rstrip(".;"))
    # names leave the prose: "Drop repeated items" and "Drop repeated xs" describe one task
    unnamed = _rename_words(" ".join(prose), dict.fromkeys(names, ""))
    return PythonPrompt(code, " ".join(unnamed.split()), frozenset(examples))


def renamed_like(problem: str, question: str) -> str:
    """``problem`` in ``question``'s names: when both are function prompts (`python_prompt`) with as many
    parameters, the function and each parameter, position by position, are renamed to the question's, in the
    signature and in the docstring (where a name that is also a common word, such as ``a``, is left alone);
    otherwise ``problem`` unchanged.

    The router matches a renamed task to its entry; restating the entry's problem in the question's names
    lets the model write the verified solution under the names the question asks for.
    """
    ours, theirs = _prompt_names(problem), _prompt_names(question)
    if ours is None or theirs is None or len(ours) != len(theirs) or ours == theirs:
        return problem
    names = {old: new for old, new in zip(ours, theirs) if old != new}
    source = textwrap.dedent(problem).strip("\n")
    function = next(node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef))
    lines = source.splitlines(keepends=True)
    cut = function.body[0].lineno - 1  # the docstring's first line
    return _substitute("".join(lines[:cut]), names) + _rename_words("".join(lines[cut:]), names)


def _prompt_names(text: str) -> list[str] | None:
    """A function prompt's function name, then its parameters in order (``None``: not a function prompt)."""
    if python_prompt(text) is None:
        return None
    tree = ast.parse(textwrap.dedent(text).strip("\n"))
    return _names(next(node for node in tree.body if isinstance(node, ast.FunctionDef)))


def _names(function: ast.FunctionDef) -> list[str]:
    """The function's name, then its parameters in order."""
    args = function.args
    params = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a]
    return [function.name, *params]


class _Rename(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.name = self.names.get(node.name, node.name)
        self.generic_visit(node)
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.arg = self.names.get(node.arg, node.arg)
        self.generic_visit(node)
        return node

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self.names.get(node.id, node.id)
        return node


def _rename_words(text: str, names: dict[str, str]) -> str:
    """Names as placeholders in prose, except names that are also common words ("a", "in")."""
    return _substitute(text, {k: v for k, v in names.items() if k.lower() not in COMMON_WORDS})


def _substitute(text: str, names: dict[str, str]) -> str:
    """Every whole identifier in ``names`` (not an attribute: ``x.n`` keeps ``n``) replaced by its value."""
    if not names:
        return text
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")(?!\w)")
    return pattern.sub(lambda m: names[m.group(1)], text)
