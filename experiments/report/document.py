"""A report as a list of blocks, rendered to markdown (images as files) or HTML (images inline)."""
from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Image:
    filename: str      # the PNG's name beside report.md
    png: bytes
    alt: str


@dataclass
class Document:
    title: str
    blocks: list = field(default_factory=list)   # ("heading", level, text) | ("text", str) | ("table", ...) | Image

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(("heading", level, text))

    def text(self, text: str) -> None:
        self.blocks.append(("text", text))

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(("table", header, rows))

    def image(self, image: Image) -> None:
        self.blocks.append(image)

    @property
    def images(self) -> list[Image]:
        return [b for b in self.blocks if isinstance(b, Image)]

    def to_markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for block in self.blocks:
            if isinstance(block, Image):
                out += [f"![{block.alt}]({block.filename})", ""]
            elif block[0] == "heading":
                out += [f"{'#' * block[1]} {block[2]}", ""]
            elif block[0] == "text":
                out += [block[1], ""]
            else:
                _, header, rows = block
                out.append("| " + " | ".join(header) + " |")
                out.append("|" + "---|" * len(header))
                out += ["| " + " | ".join(row) + " |" for row in rows]
                out.append("")
        return "\n".join(out)

    def to_html(self) -> str:
        body = []
        for block in self.blocks:
            if isinstance(block, Image):
                data = base64.b64encode(block.png).decode("ascii")
                body.append(f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(block.alt)}">'
                            f"<figcaption>{html.escape(block.alt)}</figcaption></figure>")
            elif block[0] == "heading":
                body.append(f"<h{block[1]}>{html.escape(block[2])}</h{block[1]}>")
            elif block[0] == "text":
                body.append(f"<p>{html.escape(block[1])}</p>")
            else:
                _, header, rows = block
                head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
                cells = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table>")
        return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<title>{html.escape(self.title)}</title><style>{_CSS}</style></head>\n<body>\n"
                f"<h1>{html.escape(self.title)}</h1>\n" + "\n".join(body) + "\n</body></html>\n")


_CSS = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
        "table{border-collapse:collapse;margin:1em 0;font-size:14px}"
        "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f2f2f2}"
        "td:first-child,td:nth-child(2){text-align:left}"
        "img{max-width:100%}figure{margin:1em 0}figcaption{color:#666;font-size:13px}")
