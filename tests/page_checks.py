"""What every page must be in a real browser, whatever the history behind it: no console error, no uncaught script
error, no failed request (a refusal the test expects excepted), no id given twice, every form control labelled.
`PageChecks` listens to a Playwright page; `problems_of(page)` reads the document as it stands. No tests here."""
from urllib.parse import urlsplit

from playwright.sync_api import TimeoutError as PlaywrightTimeout

# Controls without an accessible name: a label (for= or around it), aria-label, aria-labelledby or a title;
# a button's text counts as its name. Hidden inputs and CSRF tokens are not controls.
UNLABELLED = """() => [...document.querySelectorAll('input, select, textarea, button')]
  .filter(c => c.type !== 'hidden')
  .filter(c => !(c.labels && c.labels.length) && !c.getAttribute('aria-label') && !c.getAttribute('aria-labelledby')
               && !c.title && !(c.tagName === 'BUTTON' && c.textContent.trim())
               && !(c.tagName === 'INPUT' && ['submit', 'button', 'reset'].includes(c.type) && c.value))
  .map(c => c.outerHTML.slice(0, 160))"""
DUPLICATED_IDS = """() => { const seen = {};
  document.querySelectorAll('[id]').forEach(e => seen[e.id] = (seen[e.id] || 0) + 1);
  return Object.keys(seen).filter(id => seen[id] > 1); }"""


# The pages poll every 1 to 5 s (hx-trigger="every Ns"): this much of the page's clock fires each poll.
POLLS_AFTER = 6_000


class PageChecks:
    """Collects what went wrong on `page` while a test drives it. `allow(path, status)` before a step that the
    server is expected to refuse (a 409 shown on the page, say): that answer and Chromium's console line for it
    are not problems."""

    def __init__(self, page):
        self.page = page
        page.clock.install()   # timers on Playwright's clock, from now: goto() runs the polls when it asks
        self.problems: list[str] = []
        self.allowed: set[tuple[str, int]] = set()
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.problems.append(f"script error: {error}"))
        self.leaving = False
        page.on("requestfailed", self._failed)
        page.on("response", self._response)
        # Requests sent and not yet answered: when the page never settles, the failure names them.
        self.in_flight: set = set()
        page.on("request", lambda request: self.in_flight.add(request))   # Playwright takes no builtin as a handler
        page.on("requestfinished", lambda request: self.in_flight.discard(request))
        page.on("requestfailed", lambda request: self.in_flight.discard(request))

    def allow(self, path: str, status: int) -> None:
        self.allowed.add((path, status))

    def goto(self, url: str) -> None:
        """Leaves the page for `url` (its polls cut short by leaving are no failures), waits for the new page's
        own requests (htmx loads, charts) to settle, then lets its polls run once (the page's clock is
        Playwright's: POLLS_AFTER of timers run at once) so that the fragments they fetch are checked too."""
        self.leaving = True
        try:
            self.page.goto(url)
        finally:
            self.leaving = False
        self._settle()
        self.page.clock.run_for(POLLS_AFTER)
        self._settle()

    def _settle(self) -> None:
        try:
            self.page.wait_for_load_state("networkidle")
        except PlaywrightTimeout as timeout:
            # Chromium's network-idle signal has gone missing on a loaded CI machine with no request of the page
            # in flight (twice, on different pages): what must be done is the page's own requests, and every one
            # of them has been answered (its failures and error answers are problems all the same).
            waiting = sorted(request.url for request in self.in_flight)
            if waiting:
                raise AssertionError(f"{self.page.url} never settled; still waiting for {waiting}") from timeout

    def _failed(self, request) -> None:
        if self.leaving and request.failure == "net::ERR_ABORTED":
            return
        self.problems.append(f"request failed: {request.method} {request.url} {request.failure}")

    def _expected(self, url: str, status: int | None = None) -> bool:
        path = urlsplit(url).path
        return any(p == path and (status is None or s == status) for p, s in self.allowed)

    def _console(self, message) -> None:
        if message.type != "error":
            return
        if message.text.startswith("Failed to load resource") and self._expected(message.location.get("url", "")):
            return
        self.problems.append(f"console error on {self.page.url}: {message.text}")

    def _response(self, response) -> None:
        if response.status >= 400 and not self._expected(response.url, response.status):
            self.problems.append(f"{response.request.method} {response.url} answered {response.status}")

    def check(self, where: str) -> None:
        """Fails naming every problem seen so far and every one the document at `where` holds now."""
        found = list(self.problems) + problems_of(self.page)
        self.problems.clear()
        assert not found, (where, found)


def problems_of(page) -> list[str]:
    """The document's own problems: ids given twice, controls without a label."""
    found = [f"id given twice: {i}" for i in page.evaluate(DUPLICATED_IDS)]
    return found + [f"control without a label: {c}" for c in page.evaluate(UNLABELLED)]
