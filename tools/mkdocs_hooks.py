"""MkDocs hooks (mkdocs.yml `hooks:`): the site serves its own Mermaid and the repository files the
pages link to, so it needs nothing from outside and no link of a page can point nowhere.

* Mermaid: Material loads it from a CDN in the reader's browser unless a `mermaid` global exists.
  The npm package `mermaid` (pinned in package.json) is copied into the site as
  `assets/javascripts/mermaid.min.js`, which `extra_javascript` loads before Material looks.
* Repository files: a page links a file outside `docs/` by its path from the repository root
  (`[results](/benchmarks/RESULTS.md)`), which is how GitHub resolves such a link too. Here each
  linked Markdown file becomes a page of the site under `repo/` (and so do the Markdown files it
  links to, relatively; a link back into `docs/` goes to the site's own page), any other file is
  served as it is, and the link is rewritten to it. A link to a repository path that does not exist
  is a warning, which `mkdocs build --strict` fails on.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files, InclusionLevel

ROOT = Path(__file__).resolve().parents[1]
MERMAID = ROOT / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
MERMAID_URI = "assets/javascripts/mermaid.min.js"
REPO_PREFIX = "repo/"
DOCS_PREFIX = "docs/"  # the site's own pages, as the repository names them
# A Markdown link or image target: `](target)` or `](target "title")`.
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)

log = logging.getLogger("mkdocs.hooks.repo_files")


def _targets(markdown: str) -> list[str]:
    """Link targets outside fenced code blocks."""
    return [m.group("target") for m in _LINK.finditer(_FENCE.sub("", markdown))]


def _split(target: str) -> tuple[str, str]:
    path, _, fragment = target.partition("#")
    return path, f"#{fragment}" if fragment else ""


def _is_external(target: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*:", target)) or target.startswith("#")


def _repo_file(path: str) -> Path | None:
    """The repository file a root-relative or resolved path names, if it is one."""
    candidate = (ROOT / path.lstrip("/")).resolve()
    if candidate.is_file() and candidate.is_relative_to(ROOT) and "node_modules" not in candidate.parts:
        return candidate
    return None


def _add(files: Files, config: Any, rel: str) -> None:
    uri = f"{REPO_PREFIX}{rel}"
    if files.get_file_from_path(uri) is None:
        files.append(File.generated(config, uri, abs_src_path=str(ROOT / rel),
                                    inclusion=InclusionLevel.NOT_IN_NAV))


def on_files(files: Files, *, config: Any) -> Files:
    if not MERMAID.is_file():
        raise SystemExit(f"{MERMAID} is missing: run `./dev setup` (npm ci installs the pinned mermaid)")
    files.append(File.generated(config, MERMAID_URI, abs_src_path=str(MERMAID)))
    # Every repository file the pages link to by root path, and the Markdown those files link to.
    queue: list[str] = []
    for page in [f for f in files if f.is_documentation_page() and f.abs_src_path]:
        text = Path(page.abs_src_path or "").read_text(encoding="utf-8")
        queue += [_split(t)[0].lstrip("/") for t in _targets(text) if t.startswith("/")]
    seen: set[str] = set()
    while queue:
        rel = queue.pop()
        found = _repo_file(rel)
        if rel in seen or found is None or rel.startswith(DOCS_PREFIX):
            continue  # a page of the site already (a repository page linking back into docs/)
        seen.add(rel)
        _add(files, config, rel)
        if found.suffix == ".md":
            for target in _targets(found.read_text(encoding="utf-8")):
                path, _ = _split(target)
                if path and not _is_external(target) and not path.startswith("/"):
                    queue.append(posixpath.normpath(posixpath.join(posixpath.dirname(rel), path)))
    return files


def on_page_markdown(markdown: str, *, page: Any, config: Any, files: Files) -> str:
    """Root-relative links become relative links to the files `on_files` added."""
    here = posixpath.dirname(page.file.src_uri)

    in_repo = page.file.src_uri.startswith(REPO_PREFIX)

    def rewrite(match: re.Match[str]) -> str:
        target = match.group("target")
        path, fragment = _split(target)
        if target.startswith("/") and not target.startswith("//"):
            rel = path.lstrip("/")
        elif in_repo and path and not _is_external(target):
            # A repository page's relative link, as the repository resolves it.
            rel = posixpath.normpath(posixpath.join(posixpath.dirname(page.file.src_uri), path))
            rel = rel.removeprefix(REPO_PREFIX)
        else:
            return match.group(0)
        if _repo_file(rel) is None:
            log.warning("%s links to %s, which is not a file of the repository", page.file.src_uri, path)
            return match.group(0)
        site_uri = rel.removeprefix(DOCS_PREFIX) if rel.startswith(DOCS_PREFIX) else f"{REPO_PREFIX}{rel}"
        link = posixpath.relpath(site_uri, here or ".")
        return f"]({link}{fragment}{match.group('title') or ''})"

    parts = re.split(r"(^(?:```|~~~)[^\n]*\n.*?^(?:```|~~~)[ \t]*$)", markdown, flags=re.S | re.M)
    return "".join(part if i % 2 else _LINK.sub(rewrite, part) for i, part in enumerate(parts))
