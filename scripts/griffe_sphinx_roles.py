"""A griffe extension for the documentation site (mkdocs.yml): the package's docstrings are
reST-flavoured, and the API pages render them as Markdown.

- Sphinx roles become code: ``:class:`~a.b.C``` → ```C```, ``:meth:`step``` → ```step```.
- A paragraph that ends in ``::`` (reST's "literal block follows") ends in ``:``; the indented block
  after it is already a code block in Markdown.

Docstrings in the source are left as they are; only what the site shows changes.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|obj|exc|data|const|ref):`(~?)([^`]+)`")
_LITERAL_MARKER = re.compile(r"(\S)::[ \t]*$", re.MULTILINE)


def _role(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def rest_to_markdown(text: str) -> str:
    text = _ROLE.sub(_role, text)
    return _LITERAL_MARKER.sub(r"\1:", text)


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rest_to_markdown(obj.docstring.value)
