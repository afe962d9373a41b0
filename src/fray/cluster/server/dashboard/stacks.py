"""The dashboard's "Stacks" buttons: a running job's (or an actor's) live stacks, fetched on demand.

The job page and each row of the actors page get a button; a click fetches
``/data/stacks/JOB_ID`` (JSON: ``text``, :func:`fray.stacks.format_stacks` of what
``JobHandle.stacks()`` would return, and ``stacks``, each process's JSON) and shows the text
under the button. Nothing is asked of any process until somebody clicks. The page's script
(:data:`SCRIPT`, appended to ``/static/app.js``: the pages' Content-Security-Policy allows no
inline script) sets the text with ``textContent``, so frames and locals are never read as HTML.
"""

from __future__ import annotations

from html import escape
from typing import Any
from urllib.parse import quote

from fray.stacks import ProcessStacks, format_stacks

__all__ = ["SCRIPT", "STYLE", "stacks_button", "stacks_data"]

#: How long the dashboard gives each process to answer (seconds).
TIMEOUT = 10.0

SCRIPT = """
document.querySelectorAll('button[data-stacks]').forEach(function (button) {
  button.addEventListener('click', function () {
    var out = document.getElementById(button.dataset.target);
    out.hidden = false;
    out.textContent = 'asking every process of the job for its stacks...';
    fetch(button.dataset.stacks, {credentials: 'same-origin'})
      .then(function (response) {
        if (!response.ok) { throw new Error(response.status + ' ' + response.statusText); }
        return response.json();
      })
      .then(function (data) { out.textContent = data.text; })
      .catch(function (error) { out.textContent = 'could not take the stacks: ' + error.message; });
  });
});
"""

STYLE = """
pre.stacks { background: #111; color: #e8e8e8; padding: 8px; max-height: 70vh; overflow: auto; }
button.stacks { margin-right: 6px; }
"""


def stacks_button(job_id: str, target: str, *, what: str = "this job") -> str:
    """The "Stacks" and "Stacks with locals" buttons for ``job_id``, and the hidden ``<pre id=target>`` they fill."""
    url = f"/data/stacks/{quote(job_id)}"
    return (
        f'<button type="button" class="stacks" data-stacks="{escape(url)}" data-target="{escape(target)}" '
        f'title="The Python stack of every thread of {escape(what)}, now">Stacks</button>'
        f'<button type="button" class="stacks" data-stacks="{escape(url)}?locals=1" data-target="{escape(target)}" '
        f'title="The same, with each frame\'s local variables">Stacks with locals</button>'
        f'<pre class="stacks" id="{escape(target)}" hidden></pre>'
    )


def stacks_data(found: list[dict[str, Any]], state: str) -> dict[str, Any]:
    """What ``/data/stacks/JOB_ID`` answers: the formatted text and each process's JSON (``found``)."""
    stacks = [ProcessStacks.from_json(process) for process in found]
    if not stacks:
        text = f"the job is {state}: no process of it runs, so there are no stacks to show"
    else:
        text = format_stacks(stacks)
    return {"text": text, "stacks": found}
