"""mkdocs hooks: the site's home page is README.md, with its ``docs/...`` links made
relative to the docs folder, so the README and the site never drift apart and every
README link is checked by ``mkdocs build --strict``."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

README = Path(__file__).resolve().parent.parent / "README.md"


def on_files(files: Files, config) -> Files:
    text = README.read_text(encoding="utf-8")
    text = re.sub(r"\]\(docs/", "](", text)
    files.append(File.generated(config, "index.md", content=text))
    return files
