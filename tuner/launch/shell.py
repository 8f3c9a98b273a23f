"""The words of a shell launch script, with the variables the script itself sets expanded.

Megatron-LM's example scripts keep sizes in variables and arguments in bash arrays
(``GPUS_PER_NODE=8``, ``NNODES=${SLURM_NNODES:-"1"}``, ``WORLD_SIZE=$(($GPUS_PER_NODE*$NNODES))``,
``torchrun ${DISTRIBUTED_ARGS[@]} ...``). :func:`shell_words` splits such a script as the shell
would (comments dropped, continuation lines joined; an array's words stand where it is defined,
an element holding a flag and its value, ``"--fp8-format hybrid"``, split into its words as bash
splits an unquoted ``${ARGS[@]}``), keeps the branch of an ``if`` block whose tests its own
variables decide (:func:`taken_lines`), and expands plain assignments in order, ``${NAME:-default}``
and integer ``$(( ))`` of + - *. It runs nothing: command substitutions stay unset, and a variable
the script does not set is kept as its ``$NAME`` text.
"""

from __future__ import annotations

import ast
import operator
import re
import shlex

__all__ = ["shell_words", "expand", "shell_variables", "taken_lines", "literal_value", "MAX_LIST"]

_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_ARITHMETIC = re.compile(r"^\$\(\((.*)\)\)$")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPACE = re.compile(r"\s")
#: ``if [ A == B ]; then`` / ``elif [[ A != B ]]`` (the test, without its brackets, in group 2)
_IF = re.compile(r"^\s*(if|elif)\s+(\[\[?\s.*?\s\]\]?)\s*(?:;\s*then)?\s*$")
_TEST = re.compile(r"^\[\[?\s+(?P<a>\S+)\s+(?P<op>==|!=|=)\s+(?P<b>\S+)\s+\]\]?$")
_ARRAY_OPEN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\+?=\((.*)$", re.DOTALL)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def expand(word: str, env: dict[str, str]) -> str:
    """``word`` with ``$NAME``, ``${NAME}`` and ``${NAME:-default}`` replaced where ``env`` sets NAME (or
    a default is given), and an integer ``$(( ... ))`` of + - * (and set names) evaluated; anything else
    kept as text."""
    def ref(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        if name in env:
            return env[name]
        return m.group(2) if m.group(2) is not None else m.group(0)

    out = _REFERENCE.sub(ref, word)
    calc = _ARITHMETIC.match(out)
    if calc:  # bare names inside $(( )) are variables too
        value = _integer_arithmetic(_NAME.sub(lambda m: env.get(m.group(0), m.group(0)), calc.group(1)))
        return out if value is None else str(value)
    return out


def _integer_arithmetic(expr: str) -> int | None:
    """The value of an integer expression of + - * and parentheses, or None for anything else."""
    value = literal_value(expr)
    return value if isinstance(value, int) else None


#: the longest list :func:`literal_value` builds (no model has so many layers)
MAX_LIST = 100_000


def literal_value(expr: str) -> int | list[int] | None:
    """The value of an expression of integers and integer lists with + - * and parentheses (lists
    joined by + and repeated by *, as Megatron-LM's ``--moe-layer-freq`` writes them), evaluated on its
    syntax tree: no name, call or other operator; a list over :data:`MAX_LIST` entries is refused
    before it is built. None for anything else."""
    def value(node: ast.AST) -> int | list[int]:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.List):
            items = [value(x) for x in node.elts]
            if not all(isinstance(x, int) for x in items):
                raise ValueError(expr)
            return items  # type: ignore[return-value]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)  # type: ignore[operator]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(left, list) or isinstance(right, list):
                size = [len(x) if isinstance(x, list) else abs(x) for x in (left, right)]
                if (size[0] + size[1] if isinstance(node.op, ast.Add) else size[0] * size[1]) > MAX_LIST:
                    raise ValueError(expr)
            return _OPS[type(node.op)](left, right)
        raise ValueError(expr)

    try:
        return value(ast.parse(expr.strip(), mode="eval").body)
    except (SyntaxError, ValueError, TypeError):
        return None


def shell_variables(lines: list[str]) -> dict[str, str]:
    """Plain ``NAME=value`` assignments of a script (``export`` too), each expanded by the earlier ones;
    array assignments (``NAME=( ... )``) and command substitutions are left out."""
    env: dict[str, str] = {}
    for line in lines:
        _assign(line, env)
    return env


def _assign(line: str, env: dict[str, str]) -> None:
    """Apply ``line`` to ``env`` if it is a plain assignment (``NAME=value``, ``export`` too)."""
    m = _ASSIGNMENT.match(line)
    if not m or m.group(2).lstrip().startswith("(") or "$(" in m.group(2).replace("$((", ""):
        return
    try:
        words = shlex.split(_join_arithmetic(m.group(2)), comments=True)
    except ValueError:
        return
    if len(words) == 1:
        env[m.group(1)] = expand(words[0], env)


def _condition(text: str, env: dict[str, str]) -> bool | None:
    """The value of a test ``[ A == B ]`` / ``[[ A != B ]]`` (``=`` too) between words the script's variables
    make literal; None for any other test or an operand naming a variable the script does not set."""
    m = _TEST.match(text)
    if not m:
        return None
    try:
        a, b = (shlex.split(m.group(g)) for g in ("a", "b"))
    except ValueError:
        return None
    if len(a) != 1 or len(b) != 1:
        return None
    a, b = expand(a[0], env), expand(b[0], env)
    if "$" in a + b:
        return None
    return (a == b) if m.group("op") in ("==", "=") else (a != b)


def taken_lines(lines: list[str]) -> tuple[list[str], dict[str, str]]:
    """The lines of a script the shell runs through its ``if`` / ``elif`` / ``else`` / ``fi`` blocks, where each
    test compares words the script's own variables decide (:func:`_condition`); a block with any other test
    keeps all its branches, as does a one-line ``if ...; fi``. The block lines themselves are dropped. With them,
    the variables those lines set (:func:`shell_variables` of the kept lines)."""
    env: dict[str, str] = {}
    out: list[str] = []
    stack: list[list] = []  # per open block: [outer active, decided, a branch taken, this branch active]
    active = True
    for line in lines:
        toks = line.split()
        first = toks[0].rstrip(";") if toks else ""
        head = _IF.match(line)
        if first == "if" and toks[-1].rstrip(";") != "fi":
            value = _condition(head.group(2), env) if head else None
            stack.append([active, value is not None, bool(value), active and value is not False])
        elif first == "elif" and stack:
            top = stack[-1]
            value = _condition(head.group(2), env) if head and top[1] and not top[2] else None
            if top[1] and top[2]:
                top[3] = False
            elif value is None:
                top[1], top[3] = False, top[0]
            else:
                top[2], top[3] = value, top[0] and value
        elif first == "else" and stack:
            top = stack[-1]
            top[3] = top[0] and (not top[2] if top[1] else True)
        elif first == "fi" and stack:
            stack.pop()
        else:
            if active:
                _assign(line, env)
                out.append(line)
            continue
        active = stack[-1][3] if stack else True
    return out, env


def _join_arithmetic(text: str) -> str:
    """``text`` with the spaces inside each ``$(( ... ))`` removed, so that it stays one shell word."""
    return re.sub(r"\$\(\(([^()]*)\)\)", lambda m: "$((" + m.group(1).replace(" ", "") + "))", text)


def shell_words(text: str) -> list[str]:
    """The words of script ``text``, the variables it sets expanded; raises ValueError (shlex's) for
    unbalanced quotes."""
    joined = _join_arithmetic(text.replace("\\\n", " "))
    lines, env = taken_lines(joined.splitlines())
    joined = "\n".join(lines)
    out: list[str] = []
    in_array = False
    for w in shlex.split(joined, comments=True):
        opened = _ARRAY_OPEN.match(w)
        if opened:  # NAME=(first ... or NAME+=( on its own: the array's words follow
            w, in_array = opened.group(1), True
        if in_array and w.endswith(")") and "$(" not in w:  # ... last) closes it
            w, in_array = w[:-1], False
        if not w:
            continue
        w = expand(w, env) if "$" in w else w
        out += _flag_words(w)
    return out


def _flag_words(word: str) -> list[str]:
    """A quoted array element holding a flag and its value (``"--split '99,1,0'"``) as its words, since
    Megatron-LM's examples expand such arrays unquoted; any other word as it is."""
    flag = _SPACE.split(word, maxsplit=1)[0]
    if not word.startswith("--") or flag == word or "=" in flag:
        return [word]
    try:
        return shlex.split(word)
    except ValueError:
        return word.split()
