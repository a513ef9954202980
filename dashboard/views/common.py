"""Helpers shared by the page views: one URL serves the page and its htmx fragment; a page number, strictly."""
from django.core.paginator import EmptyPage, Page, PageNotAnInteger, Paginator
from django.http import HttpResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers
from django.utils.functional import cached_property
from django.utils.html import format_html


class BadPage(ValueError):
    """A ?page= that is not a page of the list: the view answers 400 with this message."""


def page_of(paginator: Paginator, number: str | None) -> Page:
    """The page asked for, the first when none is (absent or empty). Unlike Paginator.get_page, a page number
    that is not a whole number or past the last page is refused: showing another page than asked is a lie."""
    if not number:
        return paginator.page(1)
    last = getattr(paginator, "last_page_text", paginator.num_pages)
    pages = f"pages are numbered 1 to {last}"
    try:
        return paginator.page(number)
    except PageNotAnInteger:
        raise BadPage(f"Page {number[:20]!r} is not a page number: {pages}.") from None
    except EmptyPage:
        raise BadPage(f"There is no page {number[:20]}: {pages}.") from None


class CountedUpToPaginator(Paginator):
    """Counts a long list no further than `pages` pages, or the page asked for when that is further, and one row
    more to know whether there are more: a list shorter than that is numbered exactly as Paginator numbers it, a
    longer one has `more` set (shown as "of more than N"). Asking for a page past the end counts up to it, so the
    last pages, and a page that is not there, are still known exactly."""

    NUMBER_LIMIT = 10**7   # a bigger page number counts every row (as Paginator does) rather than overflow LIMIT

    def __init__(self, object_list, per_page, pages: int, asked: str | None):
        super().__init__(object_list, per_page)
        try:
            number = min(max(int(asked or 0), 0), self.NUMBER_LIMIT)
        except ValueError:
            number = 0
        self.limit = max(number, pages) * per_page + 1

    @cached_property
    def count(self) -> int:
        return self.object_list.order_by().values("pk")[:self.limit].count()

    @property
    def more(self) -> bool:
        return self.count >= self.limit

    @property
    def counted_pages(self) -> int:
        """The pages known to exist: all of them unless `more`."""
        return (self.limit - 1) // self.per_page if self.more else self.num_pages

    @property
    def last_page_text(self) -> str:
        return f"more than {self.counted_pages}" if self.more else str(self.num_pages)


def render_page(request, template: str, context: dict, fragment: str | None = None, status: int = 200):
    """Render the whole page, or only `template#fragment` when htmx asks (and the fragment is named). htmx
    restoring a pushed URL it no longer holds (HX-History-Restore-Request) swaps the answer into the whole body:
    it gets the whole page. The response varies on HX-Request so no cache hands a fragment to a full-page load."""
    partial = fragment and request.htmx and not request.htmx.history_restore_request
    name = f"{template}#{fragment}" if partial else template
    response = render(request, name, context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response


def htmx_bad_request(message: str) -> HttpResponse:
    """A 400 for an htmx request whose target this answer cannot fit (the page's own fragment is not the one
    asked for): the reason goes to the page's #request-error region (base.html) instead of into the target,
    which stays as it was."""
    response = HttpResponse(format_html('<p class="flash flash-error" role="alert">{}</p>', message), status=400)
    response["HX-Retarget"] = "#request-error"
    response["HX-Reswap"] = "innerHTML"
    patch_vary_headers(response, ("HX-Request",))
    return response
