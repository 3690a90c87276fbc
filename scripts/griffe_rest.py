"""A griffe extension for the documentation site (mkdocs.yml): flowdsl's reST habits, as Markdown.

flowdsl's docstrings are Google-style, with three habits from reST that read well in ``help()``
and in the source but not in Markdown. The site translates them when it loads the package, so
the docstrings stay as they are:

* roles, ``:func:`init``` (also ``:class:``, ``:mod:``, ``:data:``, ``:meth:``, ``:attr:``,
  ``:exc:``; ``~`` shows the last name only, ``!`` links nothing): the name is resolved in the
  scope of the docstring's object, as Python would, and becomes a cross-reference to the
  reference page that documents it. ``mkdocs build --strict`` fails on a name that resolves to
  nothing the site documents, so a renamed function cannot leave a dead reference behind;
* ``#:`` comments above a module or class attribute, and ``Name.__doc__ = "..."`` after a
  ``namedtuple``: its docstring (Sphinx's conventions);
* a paragraph ending in ``::`` followed by an indented block: a Python code block.

Special members without a docstring (``__repr__``, ``__enter__``, ...) are left out of the site:
the reference shows every other public name, documented or not (enum members, attributes).
"""

from __future__ import annotations

import ast
import inspect
import re

import griffe

ROLE = re.compile(r":(?:func|class|mod|data|meth|attr|exc|obj|const):`([~!]?)([^`]+)`")


def _target(obj: griffe.Object, name: str, collection) -> str | None:
    """The path of ``name`` as seen from ``obj``'s docstring, or None if it names nothing here."""
    parts = name.split(".")
    try:
        collection.get_member(name)
        return name  # an absolute path, kept as written (the public one)
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        pass
    try:
        base = obj.resolve(parts[0])
    except griffe.NameResolutionError:
        return None
    path = ".".join([base, *parts[1:]])
    try:
        collection.get_member(path)
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
    return path


def _roles(obj: griffe.Object, text: str, collection) -> str:
    """``text`` with each reST role as a Markdown cross-reference (autorefs' ``[title][identifier]``)."""
    def replace(match: re.Match) -> str:
        flag, name = match.group(1), match.group(2).strip()
        shown = name.rsplit(".", 1)[-1] if flag == "~" else name
        if flag == "!":
            return f"`{shown}`"
        # A name that resolves to nothing stays a cross-reference: the strict build reports it.
        return f"[`{shown}`][{_target(obj, name, collection) or name}]"

    return ROLE.sub(replace, text)


def _literal_blocks(text: str) -> str:
    """``text`` with each reST literal block (``::``, a blank line, an indented block) as a fenced block."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        block_starts = (line.rstrip().endswith("::") and i + 2 < len(lines) and not lines[i + 1].strip()
                        and lines[i + 2].strip() and len(lines[i + 2]) - len(lines[i + 2].lstrip()) > indent)
        if not block_starts:
            out.append(line)
            i += 1
            continue
        # reST: "text::" shows "text:", and a lone " ::" shows nothing.
        lead = line.rstrip()[:-2]
        out += [lead.rstrip() if lead.endswith(" ") else lead + ":", ""]
        j = i + 2
        while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent):
            j += 1
        body = lines[i + 2:j]
        while body and not body[-1].strip():
            body.pop()
            j -= 1
        cut = min(len(b) - len(b.lstrip()) for b in body if b.strip())
        pad = " " * indent
        out += [pad + "```python", *(pad + b[cut:] if b.strip() else "" for b in body), pad + "```"]
        i = j
    return "\n".join(out)


def _comment_docstring(attr: griffe.Attribute) -> str | None:
    """The ``#:`` comment lines right above ``attr``'s assignment, joined."""
    module = attr.module
    lines = module.lines
    if not lines or attr.lineno is None:
        return None
    found = []
    index = attr.lineno - 2
    while index >= 0 and lines[index].lstrip().startswith("#:"):
        found.append(lines[index].lstrip()[2:].strip())
        index -= 1
    return " ".join(reversed(found)) or None


def _assigned_docstrings(module: griffe.Module) -> dict[str, str]:
    """``{name: docstring}`` of the module-level ``name.__doc__ = "..."`` statements of ``module``."""
    try:
        tree = ast.parse(module.source)
    except (SyntaxError, ValueError, OSError):
        return {}
    found = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and node.targets[0].attr == "__doc__" and isinstance(node.targets[0].value, ast.Name)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            found[node.targets[0].value.id] = inspect.cleandoc(node.value.value)
    return found


class RestToMarkdown(griffe.Extension):
    """Translate roles, ``#:`` comments, ``__doc__`` assignments and ``::`` blocks of a loaded package."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        collection = loader.modules_collection
        seen: set[int] = set()
        stack: list[griffe.Object] = [pkg]
        while stack:
            obj = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if obj.is_class:
                for name in [name for name, member in obj.members.items() if name.startswith("__")
                             and name.endswith("__") and not member.is_alias and member.docstring is None]:
                    del obj.members[name]
            stack.extend(member for member in obj.members.values() if not member.is_alias)
            if obj.is_module:
                for name, text in _assigned_docstrings(obj).items():
                    member = obj.members.get(name)
                    if member is not None and not member.is_alias and member.docstring is None:
                        member.docstring = griffe.Docstring(text, lineno=member.lineno, parent=member)
            if obj.is_attribute and obj.docstring is None:
                comment = _comment_docstring(obj)
                if comment:
                    obj.docstring = griffe.Docstring(comment, lineno=obj.lineno, parent=obj)
            if obj.docstring is not None:
                obj.docstring.value = _roles(obj, _literal_blocks(obj.docstring.value), collection)
