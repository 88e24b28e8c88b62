"""The front page and the docs site: the CLI reference is current, the README stays short, and no
page links outside the repository."""
import difflib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README_MAX_BYTES = 8192
# [text](target) and ![alt](target), reference definitions `[id]: target`, and HTML href/src.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)"
                  r"|^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)"
                  r"|(?:href|src)=[\"']([^\"']+)[\"']", re.M)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)      # https:, mailto:, ...


def generator():
    spec = importlib.util.spec_from_file_location("gen_cli_reference", DOCS / "gen_cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)   # code blocks hold no links
    return [next(group for group in match.groups() if group) for match in LINK.finditer(text)]


def test_cli_reference_is_current():
    expected = generator().render()
    current = (DOCS / "cli.md").read_text(encoding="utf-8")
    if current != expected:
        diff = difflib.unified_diff(current.splitlines(), expected.splitlines(), "docs/cli.md", "generated",
                                    lineterm="", n=1)
        shown = "\n".join(list(diff)[:30])
        pytest.fail(f"docs/cli.md is stale: run `python docs/gen_cli_reference.py` and commit it\n{shown}")


def test_cli_reference_lists_every_command():
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    for command in ("quickstart", "profile", "profile merge", "fit", "measure", "simulate", "validate",
                    "calibrate", "tables export", "import vllm-bench", "report"):
        assert f"\n## stepcal {command}\n" in text, command


def test_readme_is_short():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_MAX_BYTES, (f"README.md is {size} bytes, over {README_MAX_BYTES}: "
                                      f"move detail into docs/ and link to it")


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_link_leaves_the_repository(path):
    root = ROOT.resolve()
    for target in links(path):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        file_part = target.split("#", 1)[0].split("?", 1)[0]
        assert "../shared" not in target, f"{path.name}: links to the shared folder: {target}"
        assert not file_part.startswith("/"), f"{path.name}: absolute path {target}"
        resolved = (path.parent / file_part).resolve()
        assert resolved == root or root in resolved.parents, f"{path.name}: {target} is outside the repository"
        assert resolved.exists(), f"{path.name}: {target} does not exist"


def test_link_pattern_finds_links(tmp_path):
    page = tmp_path / "page.md"
    page.write_text('See [a](docs/a.md), ![b](../shared/x.png "t"), <a href="../y">y</a>.\n[ref]: ../z.md\n'
                    "```bash\n[not](a/link.md)\n```\n")
    assert links(page) == ["docs/a.md", "../shared/x.png", "../y", "../z.md"]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_names_the_shared_folder(path):
    # code blocks included: the CLI reference quotes --help, whose examples a user copies
    assert "../shared" not in path.read_text(encoding="utf-8")


def test_package_text_cites_no_issue_or_outside_document():
    # docstrings and comments say what the code does, in documents a user of the package has
    cited = re.compile(r"\.\./shared|(?<!docs/)DESIGN\.md|\b[Ii]ssues? \d+")
    found = [f"{path.relative_to(ROOT)}:{number}" for folder in ("core", "simulator", "costmodel", "profiler",
                                                                  "experiments", "stepcal")
             for path in sorted((ROOT / folder).rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if cited.search(line)]
    assert found == []


def test_help_states_a_default_only_where_it_says_something():
    """No "(default: None)" noise, no default stated twice; a real default still shown once."""
    text = " ".join((DOCS / "cli.md").read_text(encoding="utf-8").split())   # help wraps inside "(default: X)"
    assert "(default: None)" not in text
    assert not re.search(r"\(default[^()]*\)\s*\(default:", text)
    fit_section = text.split("## stepcal fit", 1)[1].split(" ## ", 1)[0]
    assert re.search(r"--ep EP[^()]*\(must divide --tp\) \(default: 1\)", fit_section)
