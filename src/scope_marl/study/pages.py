"""The pages the server renders itself: refusals, the admin dashboard and invitations.

Everything that comes from data goes through :func:`html.escape`; the participant's chat page is a
static file whose script writes text with ``textContent`` only, so no stored text is ever markup.
"""

from __future__ import annotations

from html import escape
from importlib import resources

STYLE_URL = "/static/style.css"


def page(title: str, body: str) -> str:
    """A whole HTML page; ``body`` is markup the caller built from escaped parts."""
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{escape(title)}</title><link rel='stylesheet' href='{STYLE_URL}'></head>"
        f"<body><main class='card'>{body}</main></body></html>"
    )


def refusal(title: str, message: str) -> str:
    return page(title, f"<h1>{escape(title)}</h1><p>{escape(message)}</p>")


def static_text(name: str) -> str:
    return resources.files("scope_marl.study").joinpath("static", name).read_text(encoding="utf-8")


def admin_login(error: str = "") -> str:
    note = f"<p class='error'>{escape(error)}</p>" if error else ""
    return page(
        "Study admin",
        "<h1>Study admin</h1>" + note + "<form method='post' action='/admin/login'>"
        "<label>Admin key <input type='password' name='key' autocomplete='current-password'></label> "
        "<button type='submit'>Sign in</button></form>",
    )


def admin_dashboard(title: str, progress: dict[str, dict[str, int]], target: int, queue: int, batch_sizes: list[int]) -> str:
    rows = "".join(
        f"<tr><td>{escape(name)}</td><td>{c['assigned']}</td><td>{c['in_progress']}</td><td>{c['completed']}</td><td>{target}</td></tr>"
        for name, c in progress.items()
        if not name.startswith("_")
    )
    every = progress["_all"]
    mean_batch = f"{sum(batch_sizes) / len(batch_sizes):.1f}" if batch_sizes else "-"
    return page(
        f"{title}: admin",
        f"<h1>{escape(title)}</h1>"
        "<table><thead><tr><th>condition</th><th>assigned</th><th>in progress</th><th>completed</th><th>target</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        f"<p>invited {every['invited']}, withdrawn {every['withdrawn']}; replies queued now {queue}; "
        f"generate calls {len(batch_sizes)}, mean rows per call {mean_batch}</p>"
        "<form method='post' action='/admin/invite'><label>New invitations <input type='number' name='n' value='10' min='1' max='1000'></label> "
        "<button type='submit'>Create links</button></form>"
        "<p>Export: <a href='/admin/export.jsonl'>participants.jsonl</a> · <a href='/admin/export.csv'>participants.csv</a></p>"
        "<form method='post' action='/admin/logout'><button type='submit'>Sign out</button></form>",
    )


def admin_links(links: list[str]) -> str:
    items = "".join(f"<li><code>{escape(link)}</code></li>" for link in links)
    return page(
        "Invitations",
        "<h1>New invitations</h1><p>Only hashes of these tokens are stored: copy the links now.</p>"
        f"<ol>{items}</ol><p><a href='/admin'>Back</a></p>",
    )
