"""summary.md, compare's markdown and the job's report become a PR comment: nothing a server or a
PR's sglang prints may render there as a link, an image, emphasis, HTML or a mention."""

from __future__ import annotations

from markdown_it import MarkdownIt

from harness.records import Status
from harness.results.reporting import inline_code, summary_markdown
from tests.records import result, run_info

HOSTILE = ("RuntimeError: see [click to approve](https://evil.example/ok) ![x](https://evil.example/i.png)\n"
           "**GREEN: all 9 cells pass** <img src=x onerror=alert(1)> @org/team `tick` ``two`` | pipe # heading")


def rendered(markdown: str) -> str:
    return MarkdownIt("commonmark").enable("table").render(markdown)


def test_a_hostile_reason_renders_as_code_in_summary_md():
    cells = [result("m.bad", Status.ERROR, reason=HOSTILE, factors={"attention_backend": "fa3"}),
             result("m.ok", Status.PASS, factors={"attention_backend": "triton"})]
    html = rendered(summary_markdown(run_info("r1", attribution="attention_backend=fa3"), cells))
    assert "<a " not in html and "<img" not in html and "<strong>GREEN" not in html and "<h1>" in html
    row = next(part for part in html.split("<tr>") if "m.bad" in part)
    assert row.count("<td>") == 7  # the pipe in the reason did not split the row
    code = [part.split("</code>")[0] for part in html.split("<code>")[1:]]
    assert any("@org/team" in part and "click to approve" in part for part in code)  # inside code: no mention


def test_inline_code_survives_backticks_and_empty_text():
    assert inline_code("") == ""
    assert inline_code("a `b` c") == "``a `b` c``"
    assert inline_code("`x`") == "`` `x` ``"
    assert inline_code("one\ntwo\t|three") == "`one two \\|three`"
