"""One error table: every API error code comes from the enum and its table in
server/http/reply.c, no handler spells a code of its own, and the README lists exactly the
table's codes with their statuses."""
import re

from conftest import ROOT

HTTP = ROOT / "server" / "http"


def table():
    """{code: status} from the `[E_X] = {"code", status}` lines of reply.c's error table."""
    src = (HTTP / "reply.c").read_text()
    rows = re.findall(r'\[(E_[A-Z_]+)\]\s*=\s*\{"([a-z_]+)",\s*(\d+)\}', src)
    enum = re.search(r"enum br_api_error \{(.*?)\};", (HTTP / "httpd.h").read_text(), re.S)
    names = [n for n in re.findall(r"\b(E_[A-Z_]+)\b", enum.group(1)) if n != "E__COUNT"]
    assert sorted(n for n, _, _ in rows) == sorted(names), "an enum value without its row"
    return {code: int(status) for _, code, status in rows}


def test_readme_lists_exactly_the_table_codes():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("the codes, with their status, are those of the one")
    para = readme[start:readme.index("\n\n", start)]
    listed = {c: int(s) for c, s in re.findall(r"`([a-z_]+)`\s+\((\d{3})", para)}
    assert listed == table()


def test_no_handler_invents_an_error_code():
    """Error bodies are built only by reply.c (reply_error, error_body): no other file packs a
    {"error": {"code": ...}} object itself or passes a code as a string."""
    offenders = []
    for f in sorted(HTTP.glob("*.c")):
        if f.name == "reply.c":
            continue
        text = f.read_text()
        if re.search(r'"error",\s*"code"', text) or re.search(r'"code",\s*"[a-z_]+"', text):
            offenders.append(f.name)
    assert not offenders, offenders


def test_the_statuses_are_http_error_statuses():
    t = table()
    assert len(t) == len(set(t)), "a code twice"
    assert all(400 <= s < 600 for s in t.values()), t
